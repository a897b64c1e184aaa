"""Hostile cost tables and calibrations: every mutation of a valid file is refused as documented, or is valid.

Refused means TableParseError from the library (never another exception) and exit 65 with one line
and no traceback from `met tables check --no-key`; a mutation that leaves a valid file (by the
independent oracle in table_mutations.py) must be accepted by both. `benchmarks/soak.py --fuzz N`
runs the same cases many more times.
"""

import re
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings

from table_mutations import mutations, valid_calibration, valid_table
from table_oracle import cli, judge, oracle

TABLE, CALIBRATION = valid_table(), valid_calibration()
FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """One file path the cases are written to in turn (hypothesis runs the examples of a test one by one)."""
    return tmp_path_factory.mktemp("fuzz") / "case.toml"


def test_the_valid_files_are_valid(scratch):
    # the starting points pass all three judges, and the oracle is not a constant
    assert judge(scratch, TABLE) == "accepted" and judge(scratch, CALIBRATION) == "accepted"
    assert not oracle(TABLE.replace(b"verify_s = 0.01\n", b"verify_s = -0.01\n", 1))
    assert oracle(TABLE.replace(b"k = 2\nverify_s = 0.014", b"k = 1\nverify_s = 0.014"))  # width 1: copies at k = 1
    assert not oracle(TABLE.replace(b"k = 2\nverify_s = 0.044", b"k = 1\nverify_s = 0.044"))  # width 4: 1, 3: a gap
    assert not oracle(TABLE.replace(b"k = 2\nverify_s = 0.044", b"k = 4\nverify_s = 0.044"))  # width 4: k = 3, 4, none at 2
    assert oracle(TABLE[: TABLE.rindex(b"\n[[verify_cells]]")] + b"\n")  # width 4's deepest dropped: still valid
    # without a meter: no joules anywhere, so width 4's verify_j_spread is refused; without it, valid
    bare = re.sub(rb"^(verify_j|draft_j) = .*\n", b"", TABLE, flags=re.M).replace(b'"rapl"', b'"none"', 1)
    assert judge(scratch, bare) == "refused: bad value in verify_cells"
    assert judge(scratch, re.sub(rb"^verify_j_spread = .*\n", b"", bare, flags=re.M)) == "accepted"
    assert not oracle(CALIBRATION.replace(b"outcomes = 300", b"outcomes = 20", 1))
    roomy = CALIBRATION.replace(b"outcomes = 300", b"outcomes = 400", 1)  # valid: more outcomes overall
    assert oracle(roomy) and not oracle(roomy.replace(b"    100,\n    100,\n", b"    100,\n    99,\n", 1))
    # copy bins: the history's start at 1 and the shared ones at 2, each bin where the one before ends
    assert not oracle(CALIBRATION.replace(b"min_match = 2", b"min_match = 1", 1))  # the shared bin from 1
    assert not oracle(CALIBRATION.replace(b"min_match = 4", b"min_match = 5", 1))  # a gap in the history's


@pytest.mark.parametrize("base", [TABLE, CALIBRATION], ids=["table", "calibration"])
def test_truncation_at_every_byte(scratch, base):
    # a write cut short anywhere (mid-line, mid-number, inside a multi-byte character): refused or valid
    outcomes = Counter(judge(scratch, base[:end]) for end in range(len(base) + 1))
    assert outcomes["accepted"] >= 2  # the whole file, and the file less its last newline
    assert outcomes["refused: not UTF-8"] >= (2 if base is TABLE else 0)  # inside the "™" of the meta value
    assert sum(outcomes.values()) == len(base) + 1


@FUZZ
@given(case=mutations(TABLE))
def test_mutated_tables(scratch, case):
    judge(scratch, case[1])


@FUZZ
@given(case=mutations(CALIBRATION))
def test_mutated_calibrations(scratch, case):
    judge(scratch, case[1])


@pytest.mark.parametrize(("old", "new", "why"), [
    (b"verify_s = 0.012", b"verify_s = nan", "cells[1].verify_s: nan is not a finite positive cost"),
    (b"verify_s = 0.012", b"verify_s = -inf", "cells[1].verify_s: -inf is not a finite positive cost"),
    (b"verify_j = 2.0", b"verify_j = 0", "cells[2].verify_j: 0 is not a finite positive cost"),
    (b"n = 4", b"n = 1" + b"0" * 30, "cells[2].n: 1000000000000000000000000000000 is out of range"),
    (b"verify_s = 0.04", b"verify_s = 1" + b"0" * 400, "cells[2].verify_s: an integer of 1329 bits is not a fini"),
    (b"schema = 1", b"schema = 2", "schema: 2 is not a supported schema version"),
    (b'recipe = "met-tiny-py@0e39"', b"recipe = " + b"[" * 5000 + b"]" * 5000, "not valid TOML"),
    (b"\xe2\x84\xa2", b"\xe2\x84", "not UTF-8 text (byte 0xe2 at offset"),
    (b"k = 2\nverify_s = 0.044", b"k = 1\nverify_s = 0.044", "verify_cells: width n=4 has no verify cell at k=2"),
    (b"k = 3\nverify_s = 0.046", b"k = 4\nverify_s = 0.046", "verify_cells: width n=4 has no verify cell at k=3"),
    (b"n = 1\nk = 2", b"n = 2\nk = 2", "verify_cells[0].n: 2 is not a width of the cells (1, 4)"),
    (b"k = 2\nverify_s = 0.014\nverify_j = 0.6\n", b"k = 2\nverify_s = 0.014\n",
     'verify_cells[0].verify_j: must be given under key.energy_source "rapl"'),
], ids=["nan", "-inf", "zero-joules", "huge-width", "huge-cost", "future-schema", "deep-nesting", "cut-utf8",
        "verify-gap-from-one", "verify-gap", "verify-stray-width", "verify-no-joules"])
def test_named_mutations_say_what_is_wrong(scratch, old, new, why):
    # a few of the fuzzed shapes, each with the message an operator reads
    assert old in TABLE
    outcome = judge(scratch, TABLE.replace(old, new, 1))
    assert outcome.startswith("refused")

    assert why in cli(scratch, TABLE.replace(old, new, 1))[1]
