"""AcceptanceCalibration: the fit (merging, monotonicity, priors, the carry-over), chains, and its file round trip."""

import math

import pytest
import tomli_w
from hypothesis import assume, given
from hypothesis import strategies as st

from met.speculative.spec_cost import (
    MIN_OUTCOMES,
    AcceptanceCalibration,
    CarryBin,
    ConfidenceBin,
    DrafterKey,
    PositionPrior,
    SpecCostError,
    TableParseError,
)

MTP = DrafterKey("mtp", "met-tiny-py-mtp", "abc")
HIGH, LOW = math.log(0.98), math.log(0.3)  # confidences that fall in far-apart starting bins
LOW_UPPER = math.log(0.3)  # the starting bin LOW falls in ends at log 0.3 itself (bins include their upper)


def outcomes(confidence, accepted: int, total: int, position: int = 1) -> list:
    """`total` judged drafts at one confidence and position, the first `accepted` of them accepted."""
    return [(confidence, i < accepted, position) for i in range(total)]


def test_fit_refuses_fewer_than_min_outcomes():
    with pytest.raises(SpecCostError, match=f"needs at least {MIN_OUTCOMES} judged drafts, got 99"):
        AcceptanceCalibration.fit(outcomes(HIGH, 50, 99), MTP)
    assert AcceptanceCalibration.fit(outcomes(HIGH, 50, 100), MTP).outcomes == 100


def test_fit_refuses_an_outcome_that_is_not_one():
    with pytest.raises(TableParseError, match=r"^outcomes\[1\]\.confidence: 0.7 is not a log-probability"):
        AcceptanceCalibration.fit([(-0.1, True, 1), (0.7, True, 1)], MTP)  # a probability, not its log
    with pytest.raises(TableParseError, match=r"^outcomes\[0\]\.accepted: 1 is not a bool"):
        AcceptanceCalibration.fit([(-0.1, 1, 1)], MTP)
    with pytest.raises(TableParseError, match=r"^outcomes\[0\]\.position: 0 is out of range"):
        AcceptanceCalibration.fit([(-0.1, True, 0)], MTP)  # positions are 1-based
    with pytest.raises(TableParseError, match=r"^outcomes\[0\]: 'x' is not \(confidence"):
        AcceptanceCalibration.fit(["x"], MTP)


def test_small_bins_merge_until_each_has_min_outcomes():
    # 60 drafts at p=0.3 and 60 at p=0.98 (two starting bins of 60): neither may stand alone,
    # so they merge into one bin of 120 whose rate is (30 + 54) / 120 = 0.7.
    cal = AcceptanceCalibration.fit(outcomes(LOW, 30, 60) + outcomes(HIGH, 54, 60), MTP)
    assert cal.bins == (ConfidenceBin(0.0, 0.7, 120),)


def test_a_short_tail_joins_the_bin_before_it():
    # 100 at LOW stand alone; the 50 at HIGH are too few and join them: one bin of 150.
    cal = AcceptanceCalibration.fit(outcomes(LOW, 30, 100) + outcomes(HIGH, 50, 50), MTP)
    assert [(b.upper, b.outcomes) for b in cal.bins] == [(0.0, 150)]


def test_well_measured_bins_stay_apart_and_rise_with_confidence():
    cal = AcceptanceCalibration.fit(outcomes(LOW, 30, 100) + outcomes(HIGH, 95, 100), MTP)
    assert [(b.p_accept, b.outcomes) for b in cal.bins] == [(0.3, 100), (0.95, 100)]
    assert cal.bins[-1].upper == 0.0  # the last bin reaches log-prob 0
    assert cal.p_accept(LOW, 1) == 0.3 and cal.p_accept(HIGH, 1) == 0.95
    assert cal.p_accept(-50.0, 1) == 0.3  # below the lowest measured: the lowest bin


def test_bins_that_fall_as_confidence_rises_are_pooled():
    # The low bin accepts 60/100, the high one 40/100: pooled adjacent violators give one bin, 100/200.
    cal = AcceptanceCalibration.fit(outcomes(LOW, 60, 100) + outcomes(HIGH, 40, 100), MTP)
    assert cal.bins == (ConfidenceBin(0.0, 0.5, 200),)


confidences = st.none() | st.floats(min_value=-20.0, max_value=0.0)


@st.composite
def outcome_rows(draw) -> list:
    """Judged drafts in groups (one confidence and position, a share accepted): cheap to draw, many rows."""
    # with the previous step's first-draft log-prob (None: no step before) when `carried`: a carry-over is fitted
    carried = draw(st.booleans())
    groups = draw(st.lists(st.tuples(confidences, st.integers(1, 6), st.integers(1, 300), st.floats(0.0, 1.0),
                                     confidences), min_size=1, max_size=12))
    rows = [row + ((before,) if carried else ()) for c, pos, total, share, before in groups
            for row in outcomes(c, round(share * total), total, pos)]
    filler = max(0, MIN_OUTCOMES - len(rows))  # enough to fit, without rejecting the example
    return rows + [(None, i % 2 == 0, 1) for i in range(filler)]


@given(outcome_rows())
def test_every_fitted_probability_rests_on_min_outcomes_and_bins_rise(rows):
    cal = AcceptanceCalibration.fit(rows, MTP)
    assert all(b.outcomes >= MIN_OUTCOMES for b in cal.bins)
    assert all(p.outcomes >= MIN_OUTCOMES for p in cal.position_priors)
    assert all(a.p_accept <= b.p_accept for a, b in zip(cal.bins, cal.bins[1:]))
    measured = sum(row[0] is not None for row in rows)  # too few confidences make no bin at all
    assert sum(b.outcomes for b in cal.bins) == (measured if measured >= MIN_OUTCOMES else 0)
    assert cal.outcomes == len(rows) and cal.p_overall == sum(row[1] for row in rows) / len(rows)
    carried = [row for row in rows if len(row) == 4 and row[3] is not None]
    firsts = sum(row[2] == 1 for row in carried)
    assert sum(c.outcomes[0] for c in cal.carryover) == (firsts if firsts >= MIN_OUTCOMES else 0)
    assert all(min(c.outcomes) >= MIN_OUTCOMES for c in cal.carryover)


@given(outcome_rows())
def test_calibration_round_trips(rows):
    cal = AcceptanceCalibration.fit(rows, MTP, {"when": "2026-10-04", "prompts": 12})
    text = cal.to_toml()
    assert AcceptanceCalibration.parse(text) == cal
    assert AcceptanceCalibration.parse(text).to_toml() == text


# -- priors and chains -----------------------------------------------------------------------------


def priors_cal() -> AcceptanceCalibration:
    # Position 1: 80/100 accepted; position 2: 50/100; position 3: 40 drafts, too few for a prior.
    # Overall: 150/240 = 0.625.
    rows = outcomes(None, 80, 100, 1) + outcomes(None, 50, 100, 2) + outcomes(None, 20, 40, 3)
    return AcceptanceCalibration.fit(rows, MTP)


def test_priors_only_where_min_outcomes_were_seen():
    cal = priors_cal()
    assert cal.position_priors == (PositionPrior(1, 0.8, 100), PositionPrior(2, 0.5, 100))
    assert cal.bins == ()  # no confidences were measured


def test_an_unmeasured_position_takes_the_deepest_prior_before_it():
    cal = priors_cal()
    assert cal.p_accept(None, 3) == 0.5 and cal.p_accept(None, 9) == 0.5
    assert cal.p_accept(-0.01, 1) == 0.8  # no bins: a confidence cannot be used, the prior is


def test_a_position_before_every_prior_takes_the_overall_rate():
    rows = outcomes(None, 90, 100, 2) + outcomes(None, 10, 50, 1)  # position 1 too thin for a prior
    cal = AcceptanceCalibration.fit(rows, MTP)
    assert cal.p_accept(None, 1) == 100 / 150


def test_expected_accepted_is_the_sum_of_running_products():
    # Priors 0.8 then 0.5, then 0.5 again past the last measured position:
    # 0.8 + 0.8*0.5 + 0.8*0.5*0.5 = 0.8 + 0.4 + 0.2 = 1.4 accepted drafts (the bonus not counted).
    cal = priors_cal()
    assert cal.expected_accepted([]) == 0.0
    assert cal.expected_accepted([None]) == 0.8
    assert cal.expected_accepted([None, None, None]) == pytest.approx(1.4, abs=1e-15)


@given(outcome_rows(), st.lists(confidences, max_size=8))
def test_expected_accepted_matches_running_products(rows, chain):
    cal = AcceptanceCalibration.fit(rows, MTP)
    running, total = 1.0, 0.0
    for position, confidence in enumerate(chain, 1):
        running *= cal.p_accept(confidence, position)
        total += running
    assert cal.expected_accepted(chain) == total
    assert 0.0 <= total <= len(chain)


@given(outcome_rows(), st.lists(confidences, max_size=6), st.integers(0, 8))
def test_expected_accepted_by_depth_is_each_prefix_padded_with_priors(rows, chain, depth):
    # The planner's one-pass form: entry k is the chain's first k drafts, priors past its end.
    cal = AcceptanceCalibration.fit(rows, MTP)
    by_depth = cal.expected_accepted_by_depth(chain, depth)
    assert by_depth == [cal.expected_accepted((chain + [None] * k)[:k]) for k in range(depth + 1)]


def test_expected_accepted_by_depth_pads_past_the_chain_with_priors():
    cal = priors_cal()  # priors 0.8, 0.5, then 0.5
    assert cal.expected_accepted_by_depth([], 3) == pytest.approx([0.0, 0.8, 1.2, 1.4], abs=1e-15)
    assert cal.expected_accepted_by_depth([None, None, None, None], 1) == [0.0, 0.8]  # drafts past depth unused


def test_p_accept_takes_rounding_above_zero_but_refuses_probabilities():
    cal = AcceptanceCalibration.fit(outcomes(LOW, 30, 100) + outcomes(HIGH, 95, 100), MTP)
    assert cal.p_accept(1e-6, 1) == 0.95  # a float32 log_softmax a hair above 0
    with pytest.raises(ValueError, match="not a log-probability"):
        cal.p_accept(0.9, 1)
    with pytest.raises(ValueError, match="not a log-probability"):
        cal.p_accept(math.nan, 1)
    with pytest.raises(ValueError, match="1-based"):
        cal.p_accept(None, 0)
    priors_only = priors_cal()  # no confidence bins: the priors answer, but a probability is still refused
    assert priors_only.p_accept(-0.5, 1) == 0.8
    for bad in (0.9, math.nan):
        with pytest.raises(ValueError, match="not a log-probability"):
            priors_only.p_accept(bad, 1)


# -- the carry-over ----------------------------------------------------------------------------------


def carried(previous, accepted_per_position: list[int], total: int = 100) -> list:
    """Judged drafts after a step whose first draft had log-prob `previous`: `total` chains per position."""
    return [(None, i < a, pos, previous) for pos, a in enumerate(accepted_per_position, 1) for i in range(total)]


def test_carryover_bins_by_the_previous_first_draft_with_a_rate_per_position():
    # After a sure first draft: 90/100 then 80/100 then 70/100 at positions 1..3; after an unsure one:
    # 60/100, then 40/100 at position 2, and position 3 had 50 chains: too few for a rate.
    rows = carried(HIGH, [90, 80, 70]) + carried(LOW, [60, 40]) + carried(LOW, [0, 0, 20], total=50)[100:]
    cal = AcceptanceCalibration.fit(rows, MTP)
    assert cal.carryover == (CarryBin(LOW_UPPER, (0.6, 0.4), (100, 100)),
                             CarryBin(0.0, (0.9, 0.8, 0.7), (100, 100, 100)))
    assert [cal.p_carried(LOW, j) for j in (1, 2)] == [0.6, 0.4] and cal.p_carried(HIGH, 3) == 0.7
    assert cal.p_carried(-50.0, 1) == 0.6 and cal.p_carried(1e-6, 1) == 0.9  # below the lowest bin; rounding above 0
    # a position past the bin's rates, or no previous draft: the position prior (position 3: 90/150)
    assert cal.p_carried(LOW, 3) == cal.p_accept(None, 3) == 0.6 and cal.p_carried(None, 1) == cal.p_accept(None, 1)
    with pytest.raises(ValueError, match="not a log-probability"):
        cal.p_carried(0.9, 1)


def test_carryover_bins_need_min_outcomes_at_position_one_and_are_not_forced_to_rise():
    # 60 chains after a LOW first draft cannot stand alone and join the HIGH bin; a rate that falls
    # as the previous confidence rises is kept (the next step's drafts need not follow the last's).
    cal = AcceptanceCalibration.fit(carried(LOW, [50], total=60) + carried(HIGH, [20]), MTP)
    assert cal.carryover == (CarryBin(0.0, ((50 + 20) / 160,), (160,)),)
    cal = AcceptanceCalibration.fit(carried(LOW, [80]) + carried(HIGH, [20]), MTP)
    assert [c.p_accept for c in cal.carryover] == [(0.8,), (0.2,)]
    # outcomes without a previous step (a sequence's first) fit no carry-over
    assert AcceptanceCalibration.fit(carried(None, [80, 50]), MTP).carryover == ()


def test_expected_accepted_by_depth_reads_the_carryover_past_the_chain():
    cal = AcceptanceCalibration.fit(carried(HIGH, [90, 80]) + carried(LOW, [50, 20]), MTP)
    # no chain, a sure previous draft: 0.9 + 0.9 * 0.8; positions past the bin's take the priors (3: none, so 2's)
    assert cal.expected_accepted_by_depth([], 2, HIGH) == pytest.approx([0.0, 0.9, 0.9 + 0.72], abs=1e-15)
    prior2 = cal.p_accept(None, 2)
    assert cal.expected_accepted_by_depth([], 3, LOW)[3] == pytest.approx(0.5 + 0.1 + 0.1 * prior2, abs=1e-15)
    # drafts with confidences use their own bins, the rest the carry-over
    assert cal.expected_accepted_by_depth([None], 2, HIGH)[2] == pytest.approx(cal.p_accept(None, 1) * (1 + 0.8))
    assert cal.expected_accepted_by_depth([], 2, None) == cal.expected_accepted_by_depth([], 2)



@given(outcome_rows(), st.lists(st.tuples(st.sampled_from([LOW, HIGH, None]) | confidences, st.integers(0, 6)),
                                min_size=1, max_size=8), st.lists(confidences, max_size=3))
def test_expected_accepted_by_depth_is_running_products_of_bins_and_carryover_whatever_was_asked_before(
        rows, asks, chain):
    # The carry-over's rates are kept per bin and depth after the first ask: every later answer
    # (another previous, in the same bin or not, another depth) is still the running products.
    cal = AcceptanceCalibration.fit(carried(HIGH, [90, 80]) + carried(LOW, [50, 20]) + rows, MTP)
    for previous, depth in asks + asks[::-1]:
        totals, total, running = [0.0], 0.0, 1.0
        for position in range(1, depth + 1):
            known = position <= len(chain)
            running *= cal.p_accept(chain[position - 1], position) if known else cal.p_carried(previous, position)
            total += running
            totals.append(total)
        assert cal.expected_accepted_by_depth(chain, depth, previous) == totals

@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda c: c[1].update(outcomes=[100]), r"carryover\[1\]\.outcomes: has 1 values for 2 positions"),
        (lambda c: c[1].update(p_accept=[]), r"carryover\[1\]\.p_accept: holds 0 values \(expected 1..=1024"),
        (lambda c: c[0].update(p_accept=[1.2]), r"carryover\[0\]\.p_accept\[0\]: 1.2 is not a probability"),
        (lambda c: c[0].update(outcomes=[99]), r"carryover\[0\]\.outcomes\[0\]: 99 is out of range"),
        (lambda c: c.reverse(), r"carryover\[1\]\.upper: .* is not above carryover\[0\]\.upper"),
        (lambda c: c[1].update(upper=-0.5), r"carryover\[1\]\.upper: -0.5 must be 0.0 in the last bin"),
        (lambda c: c[0].update(upper=0.1), r"carryover\[0\]\.upper: 0.1 is not a log-probability"),
        (lambda c: c[0].update(outcomes=[1000]), r"carryover: count more outcomes than the overall outcomes"),
        (lambda c: c[0].update(extra=1), r"carryover\[0\]\.extra: unknown field"),
    ],
)
def test_malformed_carryovers_are_refused_naming_the_field(mutate, message):
    cal = AcceptanceCalibration.fit(carried(HIGH, [90, 80]) + carried(LOW, [50]), MTP)
    doc = {"schema": 1, "drafter": {"kind": "mtp", "name": MTP.name, "digest": MTP.digest},
           "overall": {"p_accept": cal.p_overall, "outcomes": cal.outcomes},
           "carryover": [{"upper": c.upper, "p_accept": list(c.p_accept), "outcomes": list(c.outcomes)}
                         for c in cal.carryover]}
    assert AcceptanceCalibration.parse(tomli_w.dumps(doc)) == AcceptanceCalibration(
        MTP, cal.p_overall, cal.outcomes, carryover=cal.carryover)
    mutate(doc["carryover"])
    with pytest.raises(TableParseError, match="^" + message):
        AcceptanceCalibration.parse(tomli_w.dumps(doc))


# -- malformed calibration files -------------------------------------------------------------------


def good_doc() -> dict:
    cal = AcceptanceCalibration.fit(outcomes(LOW, 30, 100) + outcomes(HIGH, 95, 100, 2), MTP)
    return {"schema": 1, "drafter": {"kind": "mtp", "name": "m", "digest": "abc"},
            "overall": {"p_accept": cal.p_overall, "outcomes": cal.outcomes},
            "bins": [{"upper": b.upper, "p_accept": b.p_accept, "outcomes": b.outcomes} for b in cal.bins],
            "position_priors": [{"position": p.position, "p_accept": p.p_accept, "outcomes": p.outcomes}
                                for p in cal.position_priors]}


def test_good_doc_parses():
    assert AcceptanceCalibration.parse(tomli_w.dumps(good_doc())).drafter == DrafterKey("mtp", "m", "abc")


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["bins"][0].update(p_accept=1.5), r"bins\[0\]\.p_accept: 1.5 is not a probability"),
        (lambda d: d["bins"][1].update(outcomes=99), r"bins\[1\]\.outcomes: 99 is out of range"),
        (lambda d: d["bins"].reverse(), r"bins\[1\]\.upper: .* is not above bins\[0\]\.upper"),
        (lambda d: d["bins"][1].update(p_accept=0.1), r"bins\[1\]\.p_accept: 0.1 is below bins\[0\]\.p_accept"),
        (lambda d: d["bins"][1].update(upper=-0.01), r"bins\[1\]\.upper: -0.01 must be 0.0 in the last bin"),
        (lambda d: d["bins"][0].update(upper=0.5), r"bins\[0\]\.upper: 0.5 is not a log-probability"),
        (lambda d: d["position_priors"].reverse(), r"position_priors\[1\]\.position: 1 is not after"),
        (lambda d: d["overall"].update(outcomes=150), r"bins: count more outcomes than the overall outcomes"),
        (lambda d: d["overall"].update(p_accept=True), r"overall\.p_accept: true is not a number"),
        (lambda d: d.pop("drafter"), r"drafter: is missing"),
        (lambda d: d["drafter"].pop("digest"), r"drafter\.digest: is missing"),
        (lambda d: d["drafter"].update(digset="x"), r"drafter\.digset: unknown field \(did you mean digest\?\)"),
        (lambda d: d.update(schema=3), r"schema: 3 is not a supported schema version"),
        (lambda d: d.update(bins={"upper": 0.0}), r"bins: a table is not an array of tables"),
    ],
)
def test_malformed_calibrations_are_refused_naming_the_field(mutate, message):
    doc = good_doc()
    mutate(doc)
    with pytest.raises(TableParseError, match="^" + message):
        AcceptanceCalibration.parse(tomli_w.dumps(doc))


junk = (st.text(max_size=6) | st.booleans() | st.sampled_from([math.nan, math.inf, -math.inf, 2.5, 10**400])
        | st.lists(st.integers(), max_size=2) | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@given(st.data())
def test_junk_in_any_field_is_a_parse_error(data):
    doc = good_doc()
    section = data.draw(st.sampled_from(["drafter", "overall", "bins", "position_priors"]))
    target = doc[section] if isinstance(doc[section], dict) else data.draw(st.sampled_from(doc[section]))
    field = data.draw(st.sampled_from(sorted(target)))
    value = data.draw(junk)
    assume(not (section == "drafter" and isinstance(value, str) and value.strip()))
    target[field] = value
    with pytest.raises(TableParseError) as caught:
        AcceptanceCalibration.parse(tomli_w.dumps(doc))
    assert "\n" not in str(caught.value)


@given(st.text(max_size=200))
def test_any_text_is_a_calibration_or_a_parse_error(text):
    try:
        AcceptanceCalibration.parse(text)
    except TableParseError:
        pass


def test_a_table_and_a_calibration_passed_for_each_other_say_what_they_are():
    # the file a user swapped is named for what it is, not refused for an "unknown field"
    from met.speculative.spec_cost import Cell, CostTable, TableKey
    table = CostTable(TableKey("cpu-x-1t", "r@d", "none", {"decode": "d"}), [Cell(1, 0, 0.01, 0.0)])
    with pytest.raises(TableParseError, match="this file is a cost table, not a drafter's calibration"):
        AcceptanceCalibration.parse(table.to_toml())
    with pytest.raises(TableParseError, match="this file is a drafter's calibration, not a cost table"):
        CostTable.parse(priors_cal().to_toml())
