"""AcceptanceCalibration: the fit (merging, monotonicity, priors), chains, and its file round trip."""

import math

import pytest
import tomli_w
from hypothesis import assume, given
from hypothesis import strategies as st

from met.speculative.spec_cost import (
    MIN_OUTCOMES,
    AcceptanceCalibration,
    ConfidenceBin,
    DrafterKey,
    PositionPrior,
    SpecCostError,
    TableParseError,
)

MTP = DrafterKey("mtp", "met-tiny-py-mtp", "abc")
HIGH, LOW = math.log(0.98), math.log(0.3)  # confidences that fall in far-apart starting bins


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
    groups = draw(st.lists(st.tuples(confidences, st.integers(1, 6), st.integers(1, 300), st.floats(0.0, 1.0)),
                           min_size=1, max_size=12))
    rows = [row for c, pos, total, share in groups for row in outcomes(c, round(share * total), total, pos)]
    filler = max(0, MIN_OUTCOMES - len(rows))  # enough to fit, without rejecting the example
    return rows + [(None, i % 2 == 0, 1) for i in range(filler)]


@given(outcome_rows())
def test_every_fitted_probability_rests_on_min_outcomes_and_bins_rise(rows):
    cal = AcceptanceCalibration.fit(rows, MTP)
    assert all(b.outcomes >= MIN_OUTCOMES for b in cal.bins)
    assert all(p.outcomes >= MIN_OUTCOMES for p in cal.position_priors)
    assert all(a.p_accept <= b.p_accept for a, b in zip(cal.bins, cal.bins[1:]))
    measured = sum(c is not None for c, _, _ in rows)  # too few confidences make no bin at all
    assert sum(b.outcomes for b in cal.bins) == (measured if measured >= MIN_OUTCOMES else 0)
    assert cal.outcomes == len(rows) and cal.p_overall == sum(a for _, a, _ in rows) / len(rows)


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
