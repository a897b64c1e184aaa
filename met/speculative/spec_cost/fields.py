"""Field checks shared by the tables, keys and calibrations: types, ranges, and the TOML shape."""

import datetime as dt
import difflib
import json
import math
import re
import tomllib

import tomli_w
from collections.abc import Mapping, Sequence

from met.speculative.spec_cost.errors import TableParseError

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")

MIN_OUTCOMES = 100
"""The fewest observations behind one fitted probability: a binomial standard error of at most 0.05 at any rate."""


def name(key: object) -> str:
    """A TOML key as a path segment: bare when it can be, else quoted (so a path stays one line)."""
    text = str(key)
    return text if _BARE_KEY.fullmatch(text) else json.dumps(text)


def whole(value: object, field: str, lo: int, hi: int) -> int:
    """`value` as an int in lo..=hi (a bool is not a number, though Python says it is an int)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TableParseError(field, value, "is not a whole number")
    if not lo <= value <= hi:
        raise TableParseError(field, value, f"is out of range (expected {lo}..={hi})")
    return value


def _float(value: object, field: str) -> float:
    """`value` as a float (inf for an int too large for one); a bool or a non-number is refused."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TableParseError(field, value, "is not a number")
    try:
        return float(value)
    except OverflowError:
        return math.inf


def number(value: object, field: str) -> float:
    """`value` as a finite float; ints are accepted (TOML writes `1` for one second)."""
    result = _float(value, field)
    if not math.isfinite(result):
        raise TableParseError(field, value, "is not a finite number")
    return result


# What one measured step can cost: the planner divides tokens by these, so its every rate stays finite
# (at most 65,536 x 65 tokens per step over 1 us or 1 nJ), and nothing a box measures falls outside them.
MIN_STEP_S, MAX_STEP_S = 1e-6, 3600.0  # a step of at least 1 us and at most an hour
MIN_STEP_J, MAX_STEP_J = 1e-9, 1e7  # at least 1 nJ, at most 10 MJ (an hour at 2.8 kW)


def cost(value: object, field: str, *, zero: bool = False, unit: str = "s") -> float:
    """A measured step's seconds (unit "s") or joules ("J"): within the bounds above, or exactly 0 where `zero`."""
    result = _float(value, field)
    if zero:
        if result != 0.0:
            raise TableParseError(field, value, "must be 0 at k = 0 (a plain decode step drafts nothing)")
        return 0.0
    if not (math.isfinite(result) and result > 0.0):
        raise TableParseError(field, value, "is not a finite positive cost")
    lo, hi = (MIN_STEP_S, MAX_STEP_S) if unit == "s" else (MIN_STEP_J, MAX_STEP_J)
    if not lo <= result <= hi:
        raise TableParseError(field, value, f"is not a step's cost (a step costs {lo:g}..{hi:g} {unit})")
    return result


def spread(value: object, field: str) -> float | None:
    """An optional spread of repeated measurements: None, or finite and >= 0."""
    if value is None:
        return None
    result = number(value, field)
    if result < 0.0:
        raise TableParseError(field, value, "is not a spread (finite and >= 0)")
    return result


def probability(value: object, field: str) -> float:
    """A probability in [0, 1]."""
    result = number(value, field)
    if not 0.0 <= result <= 1.0:
        raise TableParseError(field, value, "is not a probability in [0, 1]")
    return result


def text(value: object, field: str) -> str:
    """A non-empty, single-line string."""
    if not isinstance(value, str):
        raise TableParseError(field, value, "is not a string")
    if not value.strip() or "\n" in value or "\r" in value:
        raise TableParseError(field, value, "must be a non-empty single-line string")
    return value


MAX_TEXT = 64 << 20  # characters of a table or calibration: a 65,536-width table at depth 4 is about 40 MB
MAX_NESTING = 32  # arrays and inline tables inside each other; a met file nests 2 deep
MAX_KEY_PARTS = 32  # parts of one dotted key (a.b.c is 3); a met file's longest has 2
# what the shape scan skips: strings (multi-line first) and comments, where brackets and dots mean nothing
_SKIPPED = re.compile(r'"""(?:[^\\"]++|\\[\s\S]|"(?!""))*+"{3,5}'
                      r"|'''(?:[^']++|'(?!''))*+'{3,5}"
                      r'|"(?:[^\\"\n]++|\\.)*+"'
                      r"|'[^'\n]*+'"
                      r"|#[^\n]*+")
_NOT_BRACKET = re.compile(r"[^\[\]{}]++")
_NOT_DOT_OR_END = re.compile(r"[^.\n=,\[\]{}]++")  # a key's parts end at a newline, =, a comma or a bracket


def check_toml_shape(text_: str) -> None:
    """TableParseError if TOML text nests deeper than MAX_NESTING or has a key of more than MAX_KEY_PARTS parts.

    A cheap scan before tomllib parses: its memory grows far faster than the text for a long
    dotted key (a 200 KB one of 100,000 parts took 23 GB) and its stack with nesting. Strings
    and comments are skipped; each pass is one regular expression over the text.
    """
    if len(text_) > MAX_TEXT:
        raise TableParseError("", None, f"the text is {len(text_)} characters, more than the {MAX_TEXT} a met file "
                              "may hold", show_value=False)
    if text_.count("[") + text_.count("{") <= MAX_NESTING and text_.count(".") < MAX_KEY_PARTS:
        return  # a small file: neither limit can be reached
    rest = _SKIPPED.sub(" ", text_)
    if "." * MAX_KEY_PARTS in _NOT_DOT_OR_END.sub("", rest):
        raise TableParseError("", None, f"not valid TOML for met: a dotted key of more than {MAX_KEY_PARTS} parts "
                              "(refused before parsing)", show_value=False)
    depth = 0
    for c in _NOT_BRACKET.sub("", rest):
        depth += 1 if c in "[{" else -1
        if depth > MAX_NESTING:
            raise TableParseError("", None, f"not valid TOML for met: arrays or tables nested more than "
                                  f"{MAX_NESTING} deep (refused before parsing)", show_value=False)


def load(text_: object) -> dict:
    """Parse TOML text (its shape checked first: check_toml_shape); any failure is a TableParseError."""
    if not isinstance(text_, str):
        raise TableParseError("", text_, "is not text (expected the TOML file's contents as a str)")
    check_toml_shape(text_)
    try:
        return tomllib.loads(text_)
    # tomllib raises TOMLDecodeError, but also ValueError (an integer of > 4300 digits) and
    # RecursionError (deeply nested arrays); a parse must only ever refuse with our error.
    except Exception as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise TableParseError("", None, f"not valid TOML: {reason}", show_value=False) from None


def shape(doc: Mapping, path: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
    """Refuse a table with a field it should not have (suggesting the near miss) or missing one it needs."""
    allowed = required + optional
    for key in doc:
        if key not in allowed:
            near = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"did you mean {near[0]}?" if near else f"expected {', '.join(allowed)}"
            raise TableParseError(join(path, name(key)), None, f"unknown field ({hint})", show_value=False)
    for key in required:
        if key not in doc:
            raise TableParseError(join(path, key), None, f"is missing (needs {', '.join(required)})", show_value=False)


def table(doc: Mapping, key: str, path: str) -> dict:
    """The sub-table `doc[key]`, which must be a TOML table."""
    value = doc[key]
    if not isinstance(value, dict):
        raise TableParseError(join(path, key), value, "is not a table")
    return value


def tables(doc: Mapping, key: str, path: str) -> list[dict]:
    """The array of tables `doc[key]` (`[[key]]` in the file)."""
    value = doc[key]
    if not isinstance(value, list):
        raise TableParseError(join(path, key), value, f"is not an array of tables ([[{key}]])")
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise TableParseError(f"{join(path, key)}[{i}]", item, "is not a table")
    return value


def schema(doc: Mapping, supported: int) -> int:
    """The document's schema version, which must be the one this code reads."""
    if "schema" not in doc:
        raise TableParseError("schema", None, f"is missing (this met reads schema = {supported})", show_value=False)
    version = doc["schema"]
    if isinstance(version, bool) or not isinstance(version, int) or version != supported:
        raise TableParseError("schema", version, f"is not a supported schema version (this met reads {supported})")
    return version


def meta(value: object, field: str = "meta") -> dict:
    """The free [meta] table: strings, finite numbers, booleans, dates, or arrays of them; `when` a date-time."""
    if not isinstance(value, Mapping):
        raise TableParseError(field, value, "is not a table")
    result = {}
    for key, item in value.items():
        path = join(field, name(key))
        if not isinstance(key, str):
            raise TableParseError(path, key, "is not a string key")
        for part in item if isinstance(item, list) else [item]:
            _meta_scalar(part, path)
        if key == "when":
            measured_at(item, path)  # read by `met tables show` and the serve's boot line
        result[key] = list(item) if isinstance(item, list) else item
    return result


def measured_at(value: object, field: str = "meta.when") -> dt.datetime:
    """[meta] `when` as an aware date-time: a TOML date-time or date, or ISO 8601 text; naive means UTC.

    met writes a TOML offset date-time in UTC (`when = 2026-11-30 02:11:06+00:00`); a date alone is
    its midnight.
    """
    when = value
    if isinstance(when, str):
        try:
            when = dt.datetime.fromisoformat(when)
        except ValueError:
            raise TableParseError(field, value, "is not an ISO 8601 date-time (met writes 2026-11-30T02:11:06Z)") from None
    elif isinstance(when, dt.date) and not isinstance(when, dt.datetime):
        when = dt.datetime.combine(when, dt.time())
    if not isinstance(when, dt.datetime):
        raise TableParseError(field, value, "is not a date-time (met writes 2026-11-30T02:11:06Z)")
    when = when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)
    try:  # 0001-01-01T00:00:00+23:59 is a valid TOML date-time before year 1 in UTC: no datetime holds it
        when.astimezone(dt.UTC)
    except (OverflowError, ValueError):
        raise TableParseError(field, value, "is a date-time outside years 1..9999 in UTC") from None
    return when


def _meta_scalar(value: object, path: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise TableParseError(path, value, "is not a finite number")
    if not isinstance(value, str | int | float | bool | dt.date | dt.time):
        raise TableParseError(path, value, "is not a string, number, boolean or date")


def join(path: str, key: str) -> str:
    """`path.key`, or `key` at the top level."""
    return f"{path}.{key}" if path else key


def dump(doc: Mapping, arrays: Mapping[str, list[dict]]) -> str:
    """TOML text: `doc` by tomli-w, then each array of tables written as `[[name]]` blocks.

    tomli-w writes short arrays of tables inline; the documented format (and a reviewer reading
    a diff) wants one `[[cells]]` block per entry, the same whatever the entries' length.
    """
    parts = [tomli_w.dumps(doc)]
    for key, items in arrays.items():
        parts += [f"\n[[{key}]]\n{tomli_w.dumps(item)}" for item in items]
    return "".join(parts)


def position_rates(p_accept: object, outcomes: object, most: int) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """Rates by position (1..=most of them, each in [0, 1]) and as many outcome counts, each >= MIN_OUTCOMES."""
    for field, value in (("p_accept", p_accept), ("outcomes", outcomes)):
        if not isinstance(value, list | tuple):
            raise TableParseError(field, value, "is not an array (one value per position)")
        if not 1 <= len(value) <= most:
            raise TableParseError(field, None, f"holds {len(value)} values (expected 1..={most}, one per position)",
                                  show_value=False)
    if len(outcomes) != len(p_accept):
        raise TableParseError("outcomes", outcomes, f"has {len(outcomes)} values for {len(p_accept)} positions of "
                              "p_accept", show_value=False)
    rates = tuple(probability(p, f"p_accept[{j}]") for j, p in enumerate(p_accept))
    counts = tuple(whole(n, f"outcomes[{j}]", MIN_OUTCOMES, 1 << 62) for j, n in enumerate(outcomes))
    return rates, counts


def leading_rates(counts: Sequence[int]) -> tuple[list[float], list[int]]:
    """From counts (judged, accepted) by position, interleaved: the rates and counts of the positions, from the
    first, that each rest on MIN_OUTCOMES."""
    rates, kept = [], []
    for n, a in zip(counts[::2], counts[1::2]):
        if n < MIN_OUTCOMES:
            break
        rates.append(a / n)
        kept.append(n)
    return rates, kept
