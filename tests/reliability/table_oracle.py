"""The judge of a hostile table file: an independent validity oracle, the library, and `met tables check`.

`judge` runs a file's bytes through the library (CostTable.parse / AcceptanceCalibration.parse)
and through `met tables check --no-key` and returns its outcome, or raises AssertionError when the
documented refusal was not what happened: the library may only return a table or raise
TableParseError, the CLI may only exit 0 (one line on stdout) or 65 (one line on stderr, no
traceback), the two must agree, and both must agree with the oracle, which re-states the documented
rules (DESIGN.md, docs/formats.md) without the library's code.
"""

import datetime as dt
import math
import tomllib
from collections.abc import Callable
from pathlib import Path

from typer.testing import CliRunner

from met.bench.tables_cli import tables_app
from met.exit_codes import EX_DATAERR, EX_OK
from met.speculative.spec_cost import AcceptanceCalibration, CostTable, TableParseError

# --- the oracle: the documented rules, written again from the documentation ----------------------

ENERGY = ("nvml", "rapl", "none")
CELL_REQUIRED = {"n", "k", "verify_s", "draft_s"}
CELL_OPTIONAL = {"verify_j", "draft_j", "verify_s_spread", "draft_s_spread", "verify_j_spread", "draft_j_spread",
                 "catchup_s"}
VERIFY_REQUIRED = {"n", "k", "verify_s"}
VERIFY_OPTIONAL = {"verify_j", "verify_s_spread", "verify_j_spread"}


def _is_num(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _finite(x: object) -> float | None:
    """x as a finite float, else None (bools, strings, NaN, infinities and ints beyond float are not)."""
    if not _is_num(x):
        return None
    try:
        f = float(x)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def _line(x: object) -> bool:
    return isinstance(x, str) and bool(x.strip()) and "\n" not in x and "\r" not in x


def _whole(x: object, lo: int, hi: int) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and lo <= x <= hi


def _seconds(x: object) -> bool:
    """A step's seconds: 1 us to an hour (what the planner can divide by, and a box can take)."""
    f = _finite(x)
    return f is not None and 1e-6 <= f <= 3600


def _joules(x: object) -> bool:
    """A step's joules: 1 nJ to 10 MJ."""
    f = _finite(x)
    return f is not None and 1e-9 <= f <= 1e7


def _zero(x: object) -> bool:
    return _is_num(x) and _finite(x) == 0.0


def _spread(x: object) -> bool:
    f = _finite(x)
    return f is not None and f >= 0


def _meta_ok(meta: object) -> bool:
    if not isinstance(meta, dict):
        return False
    for value in meta.values():
        for part in value if isinstance(value, list) else [value]:
            if isinstance(part, float) and not math.isfinite(part):
                return False
            if not isinstance(part, str | int | float | bool | dt.date | dt.time):
                return False
    return "when" not in meta or _date_time(meta["when"])


def _date_time(when: object) -> bool:
    """`when` says a moment: a TOML date-time or date, or text Python reads as an ISO 8601 date-time."""
    if isinstance(when, str):
        try:
            when = dt.datetime.fromisoformat(when)
        except ValueError:
            return False
    if not isinstance(when, dt.date):  # a datetime is a date too
        return False
    if isinstance(when, dt.datetime) and when.tzinfo is not None:
        try:  # it must be a moment in years 1..9999 in UTC (0001-01-01T00:00:00+23:59 is not)
            when.astimezone(dt.timezone.utc)
        except OverflowError:
            return False
    return True


def _cell_ok(c: object, source: str) -> tuple[int, int] | None:
    if not isinstance(c, dict) or not CELL_REQUIRED <= set(c) <= CELL_REQUIRED | CELL_OPTIONAL:
        return None
    if not (_whole(c["n"], 1, 1 << 16) and _whole(c["k"], 0, 64) and _seconds(c["verify_s"])):
        return None
    k = c["k"]
    if not (_zero(c["draft_s"]) if k == 0 else _seconds(c["draft_s"])):
        return None
    joules = "verify_j" in c or "draft_j" in c
    if joules != (source != "none"):
        return None  # joules exactly when the table was metered
    if joules:
        if "verify_j" not in c or "draft_j" not in c or not _joules(c["verify_j"]):
            return None
        if not (_zero(c["draft_j"]) if k == 0 else _joules(c["draft_j"])):
            return None
    for name in ("verify_s_spread", "draft_s_spread", "verify_j_spread", "draft_j_spread"):
        if name in c and not _spread(c[name]):
            return None
        if name in c and name.endswith("_j_spread") and not joules:
            return None
    if "catchup_s" in c and (k == 0 or not _spread(c["catchup_s"]) or float(c["catchup_s"]) > 3600):
        return None  # a cost per row behind, >= 0, of drafting steps only
    return c["n"], k


def _verify_cells_ok(rows: object, source: str, widths: set[int], kmax: int) -> bool:
    """[[verify_cells]]: the verify of copies at a measured width, each width's run from 1 (or from kmax + 1,
    where it starts past the cells' depths) to its deepest unbroken."""
    if not isinstance(rows, list):
        return False
    seen = set()
    for c in rows:
        if not isinstance(c, dict) or not VERIFY_REQUIRED <= set(c) <= VERIFY_REQUIRED | VERIFY_OPTIONAL:
            return False
        if not (_whole(c["n"], 1, 1 << 16) and c["n"] in widths and _whole(c["k"], 1, 64)):
            return False
        if not _seconds(c["verify_s"]) or ("verify_j" in c) != (source != "none"):
            return False
        if "verify_j" in c and not _joules(c["verify_j"]):
            return False
        if not all(_spread(c[name]) for name in ("verify_s_spread", "verify_j_spread") if name in c):
            return False
        if "verify_j_spread" in c and "verify_j" not in c:
            return False
        if (c["n"], c["k"]) in seen:
            return False
        seen.add((c["n"], c["k"]))
    starts = {n: 1 if any(m == n and k <= kmax for m, k in seen) else kmax + 1 for n, _ in seen}
    return all((n, k) in seen for n, deepest in seen for k in range(starts[n], deepest))


def table_ok(doc: dict) -> bool:
    """Whether a parsed TOML document is a valid cost table, by the documented rules."""
    if not {"schema", "key", "cells"} <= set(doc) <= {"schema", "key", "cells", "meta", "verify_cells"}:
        return False
    if not _whole(doc["schema"], 1, 1) or ("meta" in doc and not _meta_ok(doc["meta"])):
        return False
    key = doc["key"]
    if not isinstance(key, dict) or set(key) != {"box_class", "recipe", "energy_source", "plan_digests"}:
        return False
    digests = key["plan_digests"]
    if not (_line(key["box_class"]) and _line(key["recipe"]) and key["energy_source"] in ENERGY
            and isinstance(digests, dict) and digests and all(_line(m) and _line(d) for m, d in digests.items())):
        return False
    cells = doc["cells"]
    if not isinstance(cells, list) or not cells:
        return False
    seen = set()
    for c in cells:
        nk = _cell_ok(c, key["energy_source"])
        if nk is None or nk in seen:
            return False
        seen.add(nk)
    kmax = max(k for _, k in seen)
    if not all((n, k) in seen for n, _ in seen for k in range(kmax + 1)):
        return False
    return _verify_cells_ok(doc.get("verify_cells", []), key["energy_source"], {n for n, _ in seen}, kmax)


def _rates_ok(rows: object, first: str, ok: Callable[[object], bool]) -> list[dict] | None:
    if not isinstance(rows, list):
        return None
    for r in rows:
        if not (isinstance(r, dict) and set(r) == {first, "p_accept", "outcomes"} and ok(r[first])):
            return None
        p = _finite(r["p_accept"])
        if p is None or not 0 <= p <= 1 or not _whole(r["outcomes"], 100, 1 << 62):
            return None
    return rows


def calibration_ok(doc: dict) -> bool:
    """Whether a parsed TOML document is a valid drafter calibration, by the documented rules."""
    if not {"schema", "drafter", "overall"} <= set(doc) <= {"schema", "drafter", "overall", "bins", "position_priors",
                                                           "meta", "carryover", "lookup", "shared_lookup"}:
        return False
    if not _whole(doc["schema"], 1, 1) or ("meta" in doc and not _meta_ok(doc["meta"])):
        return False
    drafter, overall = doc["drafter"], doc["overall"]
    if not (isinstance(drafter, dict) and set(drafter) == {"kind", "name", "digest"}
            and all(_line(v) for v in drafter.values())):
        return False
    if not (isinstance(overall, dict) and set(overall) == {"p_accept", "outcomes"}):
        return False
    p = _finite(overall["p_accept"])
    if p is None or not 0 <= p <= 1 or not _whole(overall["outcomes"], 100, 1 << 62):
        return False
    bins = _rates_ok(doc.get("bins", []), "upper", lambda u: (f := _finite(u)) is not None and f <= 0)
    priors = _rates_ok(doc.get("position_priors", []), "position", lambda x: _whole(x, 1, 1 << 10))
    if bins is None or priors is None:
        return False
    for a, b in zip(bins, bins[1:]):  # confidence rises strictly, and the rate never falls with it
        if not (float(b["upper"]) > float(a["upper"]) and float(b["p_accept"]) >= float(a["p_accept"])):
            return False
    if bins and float(bins[-1]["upper"]) != 0.0:
        return False
    if any(b["position"] <= a["position"] for a, b in zip(priors, priors[1:])):
        return False
    carry = _carryover_ok(doc.get("carryover", []))
    if carry is None or not _lookup_ok(doc.get("lookup", []), 1) or not _lookup_ok(doc.get("shared_lookup", []), 2):
        return False
    counted = [sum(r["outcomes"] for r in rows) for rows in (bins, priors)] + [sum(sum(r["outcomes"]) for r in carry)]
    return all(total <= overall["outcomes"] for total in counted)


def _carryover_ok(rows: object) -> list[dict] | None:
    """Carry-over bins: rising uppers ending at 0, a rate and a count (>= 100) per position."""
    if not isinstance(rows, list):
        return None
    for r in rows:
        if not (isinstance(r, dict) and set(r) == {"upper", "p_accept", "outcomes"}):
            return None
        upper, rates, counts = _finite(r["upper"]), r["p_accept"], r["outcomes"]
        if upper is None or upper > 0 or not isinstance(rates, list) or not isinstance(counts, list):
            return None
        if not 1 <= len(rates) == len(counts) <= 1 << 10:
            return None
        if not all((p := _finite(x)) is not None and 0 <= p <= 1 for x in rates):
            return None
        if not all(_whole(n, 100, 1 << 62) for n in counts):
            return None
    if any(float(b["upper"]) <= float(a["upper"]) for a, b in zip(rows, rows[1:])):
        return None
    if rows and float(rows[-1]["upper"]) != 0.0:
        return None
    return rows


def _lookup_ok(rows: object, first: int) -> bool:
    """Copy bins: match lengths from `first` to at most 12, each bin after the one before without a gap or an
    overlap; per bin 1..=16 rates in [0, 1] and as many counts, each >= 100."""
    if not isinstance(rows, list):
        return False
    start = first
    for r in rows:
        if not (isinstance(r, dict) and set(r) == {"min_match", "max_match", "p_accept", "outcomes"}):
            return False
        lo, hi, rates, counts = r["min_match"], r["max_match"], r["p_accept"], r["outcomes"]
        if not (_whole(lo, start, start) and _whole(hi, start, 12)):
            return False
        if not (isinstance(rates, list) and isinstance(counts, list) and 1 <= len(rates) == len(counts) <= 16):
            return False
        if not all((p := _finite(x)) is not None and 0 <= p <= 1 for x in rates):
            return False
        if not all(_whole(n, 100, 1 << 62) for n in counts):
            return False
        start = hi + 1
    return True


def oracle(data: bytes) -> bool:
    """Whether the file is valid: UTF-8, TOML, and a valid calibration (it has [drafter]) or cost table."""
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, ValueError, RecursionError):
        return False
    return calibration_ok(doc) if "drafter" in doc else table_ok(doc)


# --- the check ------------------------------------------------------------------------------------

runner = CliRunner()


def library(data: bytes) -> str:
    """What the library does with the file: "accepted" or "refused"; any other exception fails the case."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        for kind in (CostTable, AcceptanceCalibration):  # bytes are not text; any str is a table or an error
            for given in (data, data.decode("latin-1")):
                try:
                    kind.parse(given)  # type: ignore[arg-type]
                except TableParseError:
                    pass
                else:
                    assert given is not data, "bytes were parsed as a table"
        return "refused"
    try:
        doc = tomllib.loads(text)
    except Exception:
        doc = {}
    kind = AcceptanceCalibration if "drafter" in doc else CostTable
    try:
        kind.parse(text)
    except TableParseError as exc:
        assert "\n" not in str(exc), f"a multi-line parse error: {exc!r}"
        return "refused"
    return "accepted"


def cli(path: Path, data: bytes) -> tuple[int, str]:
    """`met tables check --no-key PATH` on the file: (exit status, its one line); fails on anything else."""
    path.write_bytes(data)
    result = runner.invoke(tables_app, ["check", "--no-key", str(path)])
    assert isinstance(result.exception, SystemExit) or result.exception is None, repr(result.exception)
    assert result.exit_code in (EX_OK, EX_DATAERR), (result.exit_code, result.output)
    assert "Traceback" not in result.output
    out, err = (result.stdout, result.stderr) if result.exit_code == EX_OK else (result.stderr, result.stdout)
    assert err == "" and out.count("\n") == 1 and out.startswith(f"{path}: "), (result.stdout, result.stderr)
    return result.exit_code, out.rstrip("\n")


def judge(path: Path, data: bytes) -> str:
    """The case's outcome ("accepted", or "refused: <why>"); AssertionError if it was not the documented one."""
    verdict = library(data)
    code, line = cli(path, data)
    assert (code == EX_OK) == (verdict == "accepted"), f"library {verdict}, CLI exit {code}: {line}"
    assert oracle(data) == (verdict == "accepted"), f"the oracle says {'valid' if oracle(data) else 'invalid'}, " \
                                                    f"the library {verdict}: {line}"
    if verdict == "accepted":
        return "accepted"
    why = line.removeprefix(f"{path}: ")
    if why.startswith("not UTF-8"):
        return "refused: not UTF-8"
    if why.startswith("not valid TOML"):
        return "refused: not TOML"
    for words, outcome in (("unknown field", "unknown field"), ("is missing", "missing field"),
                           ("duplicates the cell", "duplicated cell"), ("has no cell at", "missing cell"),
                           ("duplicates the verify cell", "duplicated verify cell"),
                           ("has no verify cell at", "missing verify cell"),
                           ("not a supported schema", "schema version")):
        if words in why:
            return f"refused: {outcome}"
    return "refused: bad value in " + why.split(":")[0].split("[")[0].split(".")[0]
