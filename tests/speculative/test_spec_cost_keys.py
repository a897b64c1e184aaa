"""TableKey.check and every KeyMismatch variant; DrafterKey; SpecCostState refusing a mismatched key."""

import pytest

from met.speculative.spec_cost import (
    AcceptanceCalibration,
    BoxClassMismatch,
    Cell,
    CostTable,
    DrafterKey,
    DrafterMismatch,
    EnergySourceMismatch,
    KeyMismatchError,
    ModeNotMeasured,
    PlanDigestMismatch,
    RecipeMismatch,
    SchemaMismatch,
    SpecCostState,
    TableKey,
    TableParseError,
)
from met.speculative.spec_cost.plan import unknown

TABLE_KEY = TableKey("nvidia-h200x1", "met-tiny-py@abc", "nvml", {"decode": "d1", "verify": "v1", "draft_mtp": "m1"})
MTP = DrafterKey("mtp", "met-tiny-py-mtp", "abc")


def serve_key(**change) -> TableKey:
    """The serve's key: the table's unless changed; it names the modes it runs."""
    fields = dict(box_class="nvidia-h200x1", recipe="met-tiny-py@abc", energy_source="nvml",
                  plan_digests={"decode": "d1", "verify": "v1", "draft_mtp": "m1"})
    return TableKey(**(fields | change))


def test_equal_keys_have_no_mismatch():
    assert TABLE_KEY.check(serve_key()) == []


def test_modes_measured_but_not_run_are_ignored():
    # A serve without MTP needs only decode and verify; the table measured more.
    assert TABLE_KEY.check(serve_key(plan_digests={"decode": "d1", "verify": "v1"})) == []


@pytest.mark.parametrize(
    ("change", "expected", "words"),
    [
        (dict(box_class="cpu-epyc-2t"), BoxClassMismatch("box_class", "nvidia-h200x1", "cpu-epyc-2t"),
         "table measured under box_class 'nvidia-h200x1', this box is 'cpu-epyc-2t'; run met bench spec-cost "
         "here or pass --box-class"),
        (dict(recipe="met-tiny-py@def"), RecipeMismatch("recipe", "met-tiny-py@abc", "met-tiny-py@def"),
         "recipe 'met-tiny-py@abc'"),
        # A serve that plans by joules cannot use a table measured without them ...
        (dict(energy_source="none"), EnergySourceMismatch("energy_source", "nvml", "none"),
         "run met bench spec-cost --energy none here, or serve with --energy nvml"),
        (dict(plan_digests={"decode": "d1", "verify": "v2", "draft_mtp": "m1"}),
         PlanDigestMismatch("plan_digests.verify", "v1", "v2"), "mode 'verify' was measured under plan digest 'v1'"),
        (dict(plan_digests={"decode": "d1", "draft_dflash": "f1"}),
         ModeNotMeasured("plan_digests.draft_dflash", None, "f1"), "never measured it"),
        (dict(schema=2), SchemaMismatch("schema", 1, 2), "table has schema 1, this met reads schema 2"),
    ],
)
def test_each_difference_is_its_own_mismatch(change, expected, words):
    found = TABLE_KEY.check(serve_key(**change))
    assert found == [expected]
    assert type(found[0]) is type(expected)
    assert words in found[0].message()


def test_energy_source_must_match_both_ways():
    # ... and a table with joules is not used by a serve that has no meter to confirm them.
    bare = TableKey("cpu-epyc-2t", "r", "none", {"decode": "d"})
    assert bare.check(TableKey("cpu-epyc-2t", "r", "nvml", {"decode": "d"})) == [
        EnergySourceMismatch("energy_source", "none", "nvml")]


def test_every_mismatch_is_reported_not_only_the_first():
    found = TABLE_KEY.check(serve_key(box_class="l40s", recipe="x", plan_digests={"verify": "v9", "draft_x": "q"}))
    assert [type(m) for m in found] == [BoxClassMismatch, RecipeMismatch, ModeNotMeasured, PlanDigestMismatch]


def test_key_is_frozen_hashable_and_order_free():
    # plan_digests are kept as sorted pairs: the same digests in another order are the same key.
    other = TableKey("nvidia-h200x1", "met-tiny-py@abc", "nvml", [("verify", "v1"), ("draft_mtp", "m1"), ("decode", "d1")])
    assert other == TABLE_KEY and hash(other) == hash(TABLE_KEY)
    assert TABLE_KEY.modes == ("decode", "draft_mtp", "verify")
    assert TABLE_KEY.digest("verify") == "v1" and TABLE_KEY.digest("nope") is None
    with pytest.raises(AttributeError):
        TABLE_KEY.recipe = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("", "r", "nvml", {"decode": "d"}), "box_class: '' must be a non-empty"),
        (("b", 3, "nvml", {"decode": "d"}), "recipe: 3 is not a string"),
        (("b", "r", "nvlm", {"decode": "d"}), "energy_source: 'nvlm' is not one of nvml, rapl, none"),  # a typo
        (("b", "r", "nvml", {}), "plan_digests: is empty"),
        (("b", "r", "nvml", {"decode": 7}), "plan_digests.decode: 7 is not a string"),
        (("b", "r", "nvml", [("decode", "a"), ("decode", "b")]), "plan_digests.decode: 'decode' is given twice"),
    ],
)
def test_key_validates_itself(args, message):
    with pytest.raises(TableParseError, match="^" + message):
        TableKey(*args)


def test_drafter_key_validates_itself():
    with pytest.raises(TableParseError, match="^digest: '' must be"):
        DrafterKey("mtp", "m", "")
    assert str(MTP) == "mtp 'met-tiny-py-mtp' @ abc"


# -- SpecCostState: only from matching keys --------------------------------------------------------


def small_table() -> CostTable:
    return CostTable(TABLE_KEY, [Cell(1, 0, 0.01, 0.0, 1.0, 0.0), Cell(1, 1, 0.011, 0.001, 1.1, 0.1)])


def calibration(drafter: DrafterKey = MTP) -> AcceptanceCalibration:
    return AcceptanceCalibration.fit([(-0.1, i % 2 == 0, 1) for i in range(200)], drafter)


def test_state_builds_from_matching_keys_and_plans():
    # Half the 200 drafts accepted, so one draft is worth 1.5 tokens: 1.5 / 0.012 s = 125 tok/s and
    # 1.5 / 1.2 J = 1.25 tok/J at depth 1, against 100 tok/s and 1.0 tok/J plain: depth 1 on both counts.
    state = SpecCostState(small_table(), calibration(), 0.1, serve_key(), MTP)
    decision = state.plan(unknown(1))
    assert decision.k == 1
    assert decision.tokens_per_s == pytest.approx(125.0) and decision.tokens_per_j == pytest.approx(1.25)


def test_state_refuses_a_mismatched_table_key():
    with pytest.raises(KeyMismatchError) as caught:
        SpecCostState(small_table(), calibration(), 0.1, serve_key(box_class="cpu-epyc-2t"), MTP)
    assert caught.value.mismatches == [BoxClassMismatch("box_class", "nvidia-h200x1", "cpu-epyc-2t")]
    assert "pass --box-class" in str(caught.value)


def test_state_refuses_a_calibration_of_another_drafter():
    other = DrafterKey("mtp", "met-tiny-py-mtp", "fff")
    with pytest.raises(KeyMismatchError) as caught:
        SpecCostState(small_table(), calibration(other), 0.1, serve_key(), MTP)
    assert caught.value.mismatches == [DrafterMismatch("drafter", other, MTP)]
    assert "fit a calibration for this drafter" in caught.value.mismatches[0].message()


def test_state_refuses_a_slack_outside_0_1():
    with pytest.raises(ValueError, match="slack"):
        SpecCostState(small_table(), calibration(), 1.0, serve_key(), MTP)
