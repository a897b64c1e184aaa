"""`met tables check` and `met tables show` through CliRunner: exit codes and one-line messages."""

import math
import re
from datetime import datetime, timezone

import pytest
from typer.testing import CliRunner

from met.bench.tables_cli import measured_ago, tables_app
from met.exit_codes import EX_DATAERR, EX_NOINPUT, EX_OK
from met.speculative.spec_cost import AcceptanceCalibration, CostTable, DrafterKey
from met.speculative.spec_cost.plan import unknown

runner = CliRunner()


def tables(*args: str):
    """Run `met tables ARGS` (the sub-app alone: it needs no torch, which `met.cli` imports)."""
    return runner.invoke(tables_app, list(args))

# A table as a user would write it by hand: two widths, depths 0..=1.
TABLE = """\
schema = 1

[key]
box_class = "nvidia-h200x1"
recipe = "met-tiny-py@0123abcd"
energy_source = "nvml"

[key.plan_digests]
decode = "aa11"
verify = "bb22"
draft_mtp = "cc33"

[meta]
when = "2026-10-04T12:00:00Z"
repeats = 5

[[cells]]
n = 1
k = 0
verify_s = 0.0071
draft_s = 0.0
verify_j = 1.9
draft_j = 0.0

[[cells]]
n = 1
k = 1
verify_s = 0.0074
draft_s = 0.0012
verify_j = 2.0
draft_j = 0.3

[[cells]]
n = 8
k = 0
verify_s = 0.0090
draft_s = 0.0
verify_j = 2.6
draft_j = 0.0

[[cells]]
n = 8
k = 1
verify_s = 0.0110
draft_s = 0.0015
verify_j = 3.0
draft_j = 0.4
"""


def write(tmp_path, text: str, name: str = "table.toml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def mistype(old: str, new: str) -> str:
    """TABLE with one of a user's mistakes in it (the first occurrence of `old`)."""
    assert old in TABLE
    return TABLE.replace(old, new, 1)


def check(path) -> tuple[int, str, str]:
    """`met tables check --no-key PATH`: the file alone (its key is compared in test_tables_key.py)."""
    result = tables("check", "--no-key", str(path))
    return result.exit_code, result.stdout, result.stderr


def test_check_accepts_a_valid_table(tmp_path):
    code, out, err = check(write(tmp_path, TABLE))
    assert code == EX_OK and err == ""
    assert "valid cost table" in out and "widths 1, 8 at depths 0..=1 (4 cells)" in out


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # a cost in quotes
        (mistype("verify_s = 0.0074", 'verify_s = "0.0074"'), "cells[1].verify_s: '0.0074' is not a number"),
        # a negative cost
        (mistype("verify_s = 0.0090", "verify_s = -0.2"), "cells[2].verify_s: -0.2 is not a finite positive cost"),
        # a zero cost where a draft was made
        (mistype("draft_s = 0.0015", "draft_s = 0"), "cells[3].draft_s: 0 is not a finite positive cost"),
        # the last depth of width 8 forgotten
        (TABLE[: TABLE.rindex("[[cells]]")], "cells: width n=8 has no cell at k=1"),
        # a typo'd field name
        (mistype("verify_s = 0.0071", "verfy_s = 0.0071"), "cells[0].verfy_s: unknown field (did you mean verify_s?)"),
        # the [key] header left out, so its fields land at the top level
        (mistype("[key]\n", ""), "box_class: unknown field"),
        # [key] missing altogether
        (TABLE[: TABLE.index("[key]")] + TABLE[TABLE.index("[meta]"):], "key: is missing"),
        # a cell copied and not edited
        (TABLE + TABLE[TABLE.rindex("[[cells]]"):], "cells[4]: duplicates the cell n=8 k=1 at cells[3]"),
        # joules left out of one cell of a metered table
        (mistype("verify_j = 2.6\n", ""), "cells[2].verify_j: is missing (a cell has both verify_j and draft_j"),
        # a width written as a float
        (mistype("n = 8", "n = 8.0"), "cells[2].n: 8.0 is not a whole number"),
        # the schema from a future met
        (mistype("schema = 1", "schema = 2"), "schema: 2 is not a supported schema version"),
        # a value with no closing quote
        (mistype('"aa11"', '"aa11'), "not valid TOML"),
        # a time of measurement that says no moment (tables show would leave out the table's age)
        (mistype('"2026-10-04T12:00:00Z"', '"last week"'), "meta.when: 'last week' is not an ISO 8601 date-time"),
    ],
    ids=["string-cost", "negative-cost", "zero-draft", "missing-depth", "typo", "no-key-header", "no-key",
         "duplicate", "missing-joules", "float-width", "future-schema", "bad-toml", "when-no-date"],
)
def test_check_refuses_a_mistyped_table_in_one_line(tmp_path, text, message):
    path = write(tmp_path, text)
    code, out, err = check(path)
    assert code == EX_DATAERR
    assert out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"{path}: {message}")


def test_check_refuses_text_that_is_not_utf8(tmp_path):
    path = tmp_path / "latin1.toml"
    data = TABLE.replace("met-tiny-py", "mét").encode("latin-1")  # a Latin-1 editor's é is byte 0xe9
    path.write_bytes(data)
    code, _, err = check(path)
    assert code == EX_DATAERR and err == f"{path}: not UTF-8 text (byte 0xe9 at offset {data.index(0xE9)})\n"


def test_check_says_66_when_there_is_nothing_to_read(tmp_path):
    code, _, err = check(tmp_path / "nope.toml")
    assert code == EX_NOINPUT and err == f"{tmp_path / 'nope.toml'}: no such file\n"
    code, _, err = check(tmp_path)
    assert code == EX_NOINPUT and err == f"{tmp_path}: a folder with no *.toml files to check\n"


def test_check_of_a_folder_checks_every_toml_under_it_and_exits_with_the_first_failure(tmp_path):
    write(tmp_path, TABLE, "a.toml")
    (tmp_path / "box").mkdir()
    write(tmp_path / "box", calibration_text(), "b.calibration.toml")
    write(tmp_path / "box", mistype("verify_s = 0.0071", "verify_s = -0.2"), "c.toml")
    write(tmp_path / "box", "not a table", "d.toml")
    write(tmp_path, "lock", "a.toml.lock")  # not *.toml: left alone, as is a killed write's hidden temp
    write(tmp_path, "junk", ".a.toml.123.tmp.toml")
    (tmp_path / "old.toml").mkdir()  # a folder named like a table is a folder: searched, not a failing file
    code, out, err = check(tmp_path)
    assert code == EX_DATAERR  # c.toml's, the first failure in path order (d.toml's is 65 too)
    lines = out.splitlines()
    assert lines[0].startswith(f"{tmp_path / 'a.toml'}: valid cost table")
    assert lines[1].startswith(f"{tmp_path / 'box' / 'b.calibration.toml'}: valid calibration")
    assert out.splitlines()[-1] == f"{tmp_path}: 2 of 4 files pass"
    assert [line.split(": ")[0] for line in err.splitlines()] == [str(tmp_path / "box" / "c.toml"),
                                                                  str(tmp_path / "box" / "d.toml")]
    (tmp_path / "box" / "c.toml").unlink()
    (tmp_path / "box" / "d.toml").unlink()
    code, out, err = check(tmp_path)
    assert code == EX_OK and err == "" and out.splitlines()[-1] == f"{tmp_path}: 2 of 2 files pass"


def calibration_text() -> str:
    rows = [(math.log(0.9), i < 90, 1) for i in range(100)] + [(None, i < 50, 2) for i in range(100)]
    return AcceptanceCalibration.fit(rows, DrafterKey("mtp", "met-tiny-py-mtp", "0123abcd")).to_toml()


def test_check_accepts_a_calibration(tmp_path):
    code, out, _ = check(write(tmp_path, calibration_text(), "cal.toml"))
    assert code == EX_OK
    assert "valid calibration for drafter mtp 'met-tiny-py-mtp'" in out and "200 outcomes" in out


def test_check_refuses_a_bad_calibration(tmp_path):
    text = calibration_text().replace("outcomes = 100\n", "outcomes = 40\n", 1)
    code, _, err = check(write(tmp_path, text, "cal.toml"))
    assert code == EX_DATAERR and "bins[0].outcomes: 40 is out of range (expected 100..=" in err


# TABLE with the verify of copies past its kmax 1 (as tables were measured before copies were verified from
# k = 1): to k = 3 at width 1, k = 2 at width 8.
VERIFY_CELLS = "".join(f"\n[[verify_cells]]\nn = {n}\nk = {k}\nverify_s = {s}\nverify_j = {j}\n"
                       for n, k, s, j in ((1, 2, 0.0081, 2.1), (1, 3, 0.0088, 2.25), (8, 2, 0.013, 3.3)))
# TABLE with the verify of copies from k = 1, to k = 3, at width 1 (none at width 8): at k = 1 beside the cell.
COPIES = "".join(f"\n[[verify_cells]]\nn = 1\nk = {k}\nverify_s = {s}\nverify_j = {j}\n"
                 for k, s, j in ((1, 0.0069, 1.8), (2, 0.0081, 2.1), (3, 0.0088, 2.25)))


def test_check_says_at_which_depths_copies_were_verified(tmp_path):
    code, out, _ = check(write(tmp_path, TABLE + VERIFY_CELLS))
    assert code == EX_OK and "at depths 0..=1 (4 cells); copies verified at k=2..3 at n=1, k=2 at n=8 (3 cells)" in out
    code, out, _ = check(write(tmp_path, TABLE + COPIES))
    assert code == EX_OK and "(4 cells); copies verified at k=1..3 at n=1 (3 cells)" in out
    assert "copies" not in check(write(tmp_path, TABLE))[1]


def test_show_prints_the_verify_of_copies_past_kmax_in_the_copy_columns(tmp_path):
    result = tables("show", str(write(tmp_path, TABLE + VERIFY_CELLS)))
    assert result.exit_code == EX_OK, result.output
    rows = [line.split() for line in result.stdout.splitlines()]
    # k, verify ms, draft ms, copy verify ms, verify J, draft J, copy J: no cell past kmax, no copy cell to it
    assert ["1", "7.4", "1.2", "-", "2", "0.3", "-"] in rows
    assert ["2", "-", "-", "8.1", "-", "-", "2.1"] in rows and ["3", "-", "-", "8.8", "-", "-", "2.25"] in rows
    assert ["2", "-", "-", "13", "-", "-", "3.3"] in rows
    assert "width n = 1, copies priced to k = 3" in result.stdout and "width n = 8, copies priced to k = 2" in result.stdout
    assert result.stdout.count("copy verify") == 2 and result.stdout.count("copy J") == 2
    plain = tables("show", str(write(tmp_path, TABLE))).stdout
    assert "copy" not in plain and "priced" not in plain


def test_show_prints_the_verify_of_copies_beside_the_cells_where_measured(tmp_path):
    result = tables("show", str(write(tmp_path, TABLE + COPIES)))
    assert result.exit_code == EX_OK, result.output
    rows = [line.split() for line in result.stdout.splitlines()]
    # width 1: the copy at k = 1 beside the cell's verify and draft; no copy at k = 0 (a plain step)
    assert ["0", "7.1", "0", "-", "1.9", "0", "-"] in rows and ["1", "7.4", "1.2", "6.9", "2", "0.3", "1.8"] in rows
    assert ["3", "-", "-", "8.8", "-", "-", "2.25"] in rows
    # width 8 has no verify cells: its grid as a table without any
    assert ["1", "11", "1.5", "3", "0.4"] in rows and re.search(r"width n = 8 *\n", result.stdout)
    assert "width n = 1, copies priced to k = 3" in result.stdout and result.stdout.count("copy verify") == 1


def test_show_gives_the_shipped_tables_a_copy_column_where_they_verified_copies():
    from pathlib import Path

    shipped = sorted((Path(__file__).parents[2] / "tables").glob("*/*.toml"))
    shipped = [p for p in shipped if not p.name.endswith(".calibration.toml")]
    assert shipped
    for path in shipped:
        table = CostTable.parse(path.read_text())
        result = tables("show", str(path))
        assert result.exit_code == EX_OK, result.output
        assert result.stdout.count("copies priced to k = ") == len({c.n for c in table.verify_cells})
        assert result.stdout.count("width n = ") == len(table.widths)


def test_show_prints_each_width(tmp_path):
    result = tables("show", str(write(tmp_path, TABLE)))
    assert result.exit_code == EX_OK
    assert "width n = 1" in result.stdout and "width n = 8" in result.stdout
    assert "7.1" in result.stdout and "verify J" in result.stdout  # 0.0071 s shown as 7.1 ms
    assert "◀" not in result.stdout  # no calibration, no plan


def test_show_prints_the_catch_up_cost_per_row_when_the_table_measured_it(tmp_path):
    assert "catch-up" not in tables("show", str(write(tmp_path, TABLE))).stdout
    measured = TABLE.replace("draft_s = 0.0012\n", "draft_s = 0.0012\ncatchup_s = 2.5e-05\n", 1)
    assert measured != TABLE
    result = tables("show", str(write(tmp_path, measured)))
    assert result.exit_code == EX_OK and "catch-up us/row" in result.stdout
    assert re.search(r"\b1\s+7\.4\s+1\.2\s+25\s+2\s", result.stdout)  # n = 1, k = 1: 25 us per row


def test_show_with_a_calibration_marks_the_plan(tmp_path):
    # At width 1, k = 1 emits 1 + 0.9 = 1.9 tokens in 8.6 ms (220.9 tok/s) vs 1 in 7.1 ms (140.8):
    # k = 1 is faster and, at 1.9 / 2.3 J = 0.826 tok/J vs 0.526, more frugal too.
    table, cal = write(tmp_path, TABLE), write(tmp_path, calibration_text(), "cal.toml")
    result = tables("show", str(table), "--calibration", str(cal))
    assert result.exit_code == EX_OK
    assert "220.9" in result.stdout and "0.8261" in result.stdout
    assert result.stdout.count("◀") == 2  # one choice per width


def test_show_says_when_the_table_was_measured(tmp_path):
    result = tables("show", str(write(tmp_path, TABLE)))
    assert "measured 2026-10-04 12:00 UTC" in " ".join(result.stdout.split())  # rich wraps the header line


def test_measured_ago_reads_metas_when_as_toml_or_text_and_says_how_long_before_now():
    now = datetime(2026, 11, 30, 2, 40, tzinfo=timezone.utc)
    toml_when = {"when": datetime(2026, 11, 30, 0, 38, 54, tzinfo=timezone.utc)}
    assert measured_ago(toml_when, now) == "measured 2026-11-30 00:38 UTC, 2 h 1 min ago"
    assert measured_ago({"when": "2026-11-30T02:11:00Z"}, now) == "measured 2026-11-30 02:11 UTC, 29 min ago"
    assert measured_ago({"when": "2026-10-04T12:00:00Z"}, now).endswith(", 56 days ago")
    assert measured_ago({"when": "2026-12-01T00:00:00Z"}, now).endswith("in the future by this box's clock")
    assert measured_ago({}, now) == "" and measured_ago({"when": "last tuesday"}, now) == ""


def test_show_refuses_files_in_the_wrong_place(tmp_path):
    table, cal = write(tmp_path, TABLE), write(tmp_path, calibration_text(), "cal.toml")
    result = tables("show", str(cal))
    assert result.exit_code == EX_DATAERR and "is a calibration, not a cost table" in result.stderr
    result = tables("show", str(table), "--calibration", str(table))
    assert result.exit_code == EX_DATAERR and "is a cost table, not a calibration" in result.stderr
    result = tables("show", str(tmp_path / "nope.toml"))
    assert result.exit_code == EX_NOINPUT


def test_check_reads_what_the_library_writes(tmp_path):
    # to_toml output is a valid file for the CLI, byte for byte what parse gives back.
    text = CostTable.parse(TABLE).to_toml()
    assert check(write(tmp_path, text))[0] == EX_OK


def test_met_tables_is_wired_into_met(tmp_path):
    from met.cli import app

    result = runner.invoke(app, ["tables", "check", "--no-key", str(write(tmp_path, TABLE))])
    assert result.exit_code == EX_OK and "valid cost table" in result.stdout


def test_show_warns_when_the_calibration_is_another_models(tmp_path):
    # the serve refuses this pair with 78; show still draws it, but says so (it paired them silently)
    table = write(tmp_path, TABLE)
    mine = write(tmp_path, calibration_text().replace("met-tiny-py-mtp", "met-tiny-py"), "cal.toml")  # as the bench
    assert "warning" not in tables("show", str(table), "--calibration", str(mine)).stderr
    other = write(tmp_path, calibration_text().replace("met-tiny-py-mtp", "other-model"), "other.toml")
    result = tables("show", str(table), "--calibration", str(other))
    assert result.exit_code == EX_OK and "warning: the calibration was fitted on other-model@" in result.stderr


# A calibration written by hand: P(draft 1 accepted) 0.8, P(draft 2 | draft 1) 0.5.
CALIBRATION = """\
schema = 1

[drafter]
kind = "mtp"
name = "met-tiny-py"
digest = "0123abcd"

[overall]
p_accept = 0.7
outcomes = 1000

[[position_priors]]
position = 1
p_accept = 0.8
outcomes = 500

[[position_priors]]
position = 2
p_accept = 0.5
outcomes = 300
"""


def test_show_prints_every_figure_whole_at_80_columns(tmp_path):
    # an energy table with catch-ups and a calibration has 10 columns: at a pipe's 80 columns rich cut
    # tok/J 0.6667 to "0.66…" and the catch-up to "catc…". Recomputed by hand at width 1:
    # k = 1: 1 + 0.8 = 1.8 tokens in 11 + 2 ms = 138.5 tok/s, over 2.2 + 0.5 J = 0.6667 tok/J;
    # k = 2: 1 + 0.8 + 0.4 = 2.2 tokens in 16 ms = 137.5 tok/s (within 10% of the best), 3.4 J = 0.6471 tok/J
    text = TABLE.replace("verify_s = 0.0074\ndraft_s = 0.0012\nverify_j = 2.0\ndraft_j = 0.3\n",
                         "verify_s = 0.011\ndraft_s = 0.002\nverify_j = 2.2\ndraft_j = 0.5\ncatchup_s = 3e-05\n")
    text = text.replace("verify_s = 0.0071\n", "verify_s = 0.010\n").replace("verify_j = 1.9\n", "verify_j = 2.0\n")
    text += "\n".join(["", "[[cells]]", "n = 1", "k = 2", "verify_s = 0.012", "draft_s = 0.004", "verify_j = 2.4",
                       "draft_j = 1.0", "catchup_s = 3.2e-05", "", "[[cells]]", "n = 8", "k = 2", "verify_s = 0.013",
                       "draft_s = 0.002", "verify_j = 3.4", "draft_j = 0.8", ""])
    table, cal = write(tmp_path, text), write(tmp_path, CALIBRATION, "cal.toml")
    result = tables("show", str(table), "--calibration", str(cal))
    assert result.exit_code == EX_OK, result.output
    assert "…" not in result.stdout and "catch-up" in result.stdout
    rows = [line.split() for line in result.stdout.splitlines()]
    assert ["0", "10", "0", "-", "2", "0", "1.000", "100", "0.5"] in rows
    assert ["1", "11", "2", "30", "2.2", "0.5", "1.800", "138.5", "0.6667", "◀"] in rows
    assert ["2", "12", "4", "32", "2.4", "1", "2.200", "137.5", "0.6471"] in rows


def test_check_counts_and_show_prints_prompt_lookups_bins(tmp_path):
    from dataclasses import replace

    from met.speculative.spec_cost import LookupBin

    bare = AcceptanceCalibration.parse(calibration_text())
    bins = [LookupBin(1, 2, (0.25, 0.5), (400, 100)), LookupBin(3, 12, (0.875,), (300,))]
    cal = write(tmp_path, replace(bare, lookup=bins).to_toml(), "cal.toml")
    code, out, _ = check(cal)
    assert code == EX_OK and "2 prompt-lookup bins" in out
    result = tables("show", str(write(tmp_path, TABLE)), "--calibration", str(cal))
    assert result.exit_code == EX_OK and "prompt-lookup copies" in result.stdout
    # the plan when every request copies from such a match, at width 1: a 1-2 token match's copy (0.25) makes
    # 1.25 tokens in 7.4 ms, 168.9 tok/s, under the 10% slack of drafting's 220.9 (1.9 tokens in 8.6 ms): k=1;
    # a 3-12 token match's (0.875) 1.875 tokens in 7.4 ms, 253.4 tok/s and 0.9375 tok/J: it copies
    assert re.search(r"1-2\s+400\s+0\.25\s+0\.50 *\n", result.stdout) and re.search(r"3-12\s+300\s+0\.88\s+- *\n", result.stdout)
    plans = result.stdout.split("plan when every request's copy")[1]
    assert re.search(r"1-2\s+k=1\s+k=1 *\n", plans) and re.search(r"3-12\s+copy k=1\s+copy k=1 *\n", plans)
    plain = tables("show", str(write(tmp_path, TABLE)), "--calibration", str(write(tmp_path, calibration_text(), "c2.toml")))
    assert "prompt-lookup copies" not in plain.stdout
    assert "copies from other requests" not in result.stdout  # no shared bins: no grid for them
    shared = [LookupBin(2, 12, (0.625, 0.75), (200, 150))]
    both = write(tmp_path, replace(bare, lookup=bins, shared_lookup=shared).to_toml(), "both.toml")
    code, out, _ = check(both)
    assert code == EX_OK and "2 prompt-lookup bins, 1 shared-lookup bins" in out
    shown = tables("show", str(write(tmp_path, TABLE)), "--calibration", str(both)).stdout
    grid = shown.split("copies from other requests")[1].split("plan when every request's copy")[0]
    assert re.search(r"2-12\s+200\s+0\.62\s+0\.75 *\n", grid)


def test_show_plans_copies_past_kmax_where_the_table_has_verify_cells_there(tmp_path):
    from dataclasses import replace

    from met.speculative.spec_cost import LookupBin

    bare = AcceptanceCalibration.parse(calibration_text())
    cal = write(tmp_path, replace(bare, lookup=[LookupBin(1, 12, (0.95, 0.95), (300, 250))]).to_toml(), "cal.toml")
    deeper = "\n".join(["", "[[verify_cells]]", "n = 1", "k = 2", "verify_s = 0.0076", "verify_j = 2.0", ""])
    result = tables("show", str(write(tmp_path, TABLE + deeper)), "--calibration", str(cal))
    assert result.exit_code == EX_OK, result.output
    # width 1 copies 2 deep (1 + 0.95 + 0.9025 tokens for the verify cell's 2.0 J); width 8 has no verify cells: 1
    plans = result.stdout.split("plan when every request's copy")[1]
    assert re.search(r"1-12\s+copy k=2\s+copy k=1 *\n", plans), plans


def _marked_depths(stdout: str) -> dict[int, int]:
    """Each width's marked depth in `met tables show` output: {n: k}."""
    marked, width = {}, None
    for line in stdout.splitlines():
        if m := re.match(r"width n = (\d+)", line):
            width = int(m.group(1))
        elif "◀" in line and width is not None:
            marked[width] = int(line.split()[0])
    return marked


@pytest.mark.parametrize("lift", [False, True])
def test_show_marks_the_depth_the_serve_plans_with_the_verify_pools_clamp(lift):
    # The AMD table's best depth at width 16 is deeper than one draft, but the default pools verify one draft at
    # widths 9..=16: the serve plans k <= 1 there, and show must mark what the serve plans, not the unclamped best.
    from pathlib import Path

    from met.engine.policy_mtp import MtpPlannedPolicy
    from met.speculative.spec_capacity import DEFAULT_POOLS, VerifyPools
    from met.speculative.spec_cost import SpecCostState

    pools = VerifyPools(DEFAULT_POOLS.tiers, lift_wide_tier=lift)
    shipped = sorted((Path(__file__).parents[2] / "tables").glob("*/met-tiny-py.toml"))
    assert shipped
    for path in shipped:
        cal_path = path.with_name("met-tiny-py.calibration.toml")
        table, cal = CostTable.parse(path.read_text()), AcceptanceCalibration.parse(cal_path.read_text())
        state = SpecCostState(table, cal, 0.1, table.key, cal.drafter)
        policy = MtpPlannedPolicy(state, table.kmax, pools)  # the serve's policy, as met serve builds it
        serve = {n: state.plan(unknown(n), kmax=policy.kmax(n)).k for n in table.widths}  # its banner's plans
        args = ["show", str(path), "--calibration", str(cal_path)] + (["--lift-wide-tier"] if lift else [])
        result = tables(*args)
        assert result.exit_code == EX_OK, result.output
        assert _marked_depths(result.stdout) == serve, path
    amd = Path(__file__).parents[2] / "tables/cpu-amd-epyc-1t/met-tiny-py.toml"
    cal_path = amd.with_name("met-tiny-py.calibration.toml")
    table, cal = CostTable.parse(amd.read_text()), AcceptanceCalibration.parse(cal_path.read_text())
    state = SpecCostState(table, cal, 0.1, table.key, cal.drafter)
    assert state.plan(unknown(16), kmax=table.kmax).k > 1  # the clamp changes the plan there
    out = tables("show", str(amd), "--calibration", str(cal_path))
    assert _marked_depths(out.stdout)[16] <= 1 and "the verify pool holds k <= 1" in out.stdout
