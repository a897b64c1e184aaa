"""Tests for the adaptive MTP rung: formulas, hysteresis, probes, and the seed's invariants."""

import copy
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from met.speculative.adaptive_rung import (
    LADDER_ONLY_ENV,
    AdaptiveRung,
    RungParams,
    next_state,
    p2_cond_from,
    token_ratio,
)
from met.speculative.ladder import mtp_ladder_drafts

P = RungParams()
rates = st.floats(0.0, 1.0)


def flush(rung: AdaptiveRung, p1: float, p2: float | None = None, width: int = 12, n: int = 100) -> None:
    """Observe one flush of n sequence-steps: at one draft when p2 is None, else at two."""
    first = round(p1 * n)
    if p2 is None:
        rung.observe(width, 1, n, first, first)
    else:
        rung.observe(width, 2, n, first + round(p2 * first), first)


# --- token_ratio and p2_cond_from -------------------------------------------------------------


@pytest.mark.parametrize(
    ("p1", "p2", "expected"),
    [
        (0.5, 0.5, 1.75 / 1.5),  # the formula: (1 + p1 + p1*p2) / (1 + p1)
        (1.0, 1.0, 1.5),  # perfect drafts: 3 tokens per step against 2
        (0.8, 0.0, 1.0),  # a second draft never accepted adds nothing
        (0.0, 1.0, 1.0),  # p1 <= 0: 1.0
        (-0.2, 0.5, 1.0),  # negative p1: 1.0
        (math.nan, 0.5, 1.0),  # non-finite p1: 1.0
        (0.5, math.inf, 1.0),  # non-finite p2_cond: 1.0
        (math.inf, 0.5, 1.0),  # infinite p1: 1.0
    ],
)
def test_token_ratio_literals(p1: float, p2: float, expected: float) -> None:
    assert token_ratio(p1, p2) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("mean_na", "p1", "expected"),
    [
        (0.9, 0.6, 0.5),  # (0.9 - 0.6) / 0.6
        (0.5, 0.6, 0.0),  # below p1 (noise): clamped to 0
        (1.5, 0.6, 1.0),  # above 2*p1 (noise): clamped to 1
        (0.3, 0.0, None),  # p1 <= 0: no estimate
        (0.3, -0.1, None),  # negative p1: no estimate
        (0.3, math.nan, None),  # NaN p1: no estimate
    ],
)
def test_p2_cond_from_literals(mean_na: float, p1: float, expected: float | None) -> None:
    got = p2_cond_from(mean_na, p1)
    assert got == (None if expected is None else pytest.approx(expected))


@given(rates, rates, rates)
def test_token_ratio_bounds_and_monotone(p1: float, p2a: float, p2b: float) -> None:
    # within [1, 1.5] for rates in [0, 1], and never falls as p2_cond grows
    lo, hi = sorted((p2a, p2b))
    assert 1.0 <= token_ratio(p1, lo) <= token_ratio(p1, hi) <= 1.5 + 1e-12


@given(st.floats(0.01, 1.0), rates)
def test_p2_cond_from_inverts_the_two_draft_mean(p1: float, p2: float) -> None:
    # mean accepted at two drafts is p1 + p1*p2_cond; p2_cond_from recovers p2_cond
    assert p2_cond_from(p1 + p1 * p2, p1) == pytest.approx(p2, abs=1e-9)


# --- RungParams and next_state ----------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"enter": 1.1, "leave": 1.1},  # no hysteresis gap
        {"enter": 1.1, "leave": 1.2},  # leave above enter
        {"leave": 1.0},  # ratio never falls below 1: would never leave
        {"enter": 1.6},  # ratio never reaches 1.6: would never enter
        {"alpha": 0.0},  # EWMA that never moves
        {"probe_p2_cond": 0.0},  # optimism of zero can never justify a probe
        {"probe_backstop": 0},  # a backstop of zero flushes would probe every flush
        {"probe_p1_rise": -0.1},  # a negative rise counts a fall as evidence
    ],
)
def test_params_reject_nonsense(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        RungParams(**kwargs)


@pytest.mark.parametrize(
    ("two", "ratio", "expected"),
    [
        (False, 1.20, True),  # one -> two at enter
        (False, 1.19, False),  # one stays below enter
        (True, 1.15, True),  # two stays between leave and enter
        (True, 1.10, True),  # two stays at leave exactly
        (True, 1.09, False),  # two -> one below leave
    ],
)
def test_next_state_literals(two: bool, ratio: float, expected: bool) -> None:
    assert next_state(two, ratio, P) is expected


@given(st.booleans(), st.floats(1.0, 1.5))
def test_next_state_hysteresis(two: bool, ratio: float) -> None:
    # at/above enter: two; below leave: one; between: unchanged
    got = next_state(two, ratio, P)
    if ratio >= P.enter:
        assert got
    elif ratio < P.leave:
        assert not got
    else:
        assert got is two


# --- the controller ---------------------------------------------------------------------------


def test_ewma_seeded_with_first_sample() -> None:
    # the first flush sets p1 outright; the second moves it by alpha
    rung = AdaptiveRung()
    flush(rung, 0.4)
    assert rung.p1 == pytest.approx(0.4)
    flush(rung, 0.8)
    assert rung.p1 == pytest.approx(0.4 + P.alpha * 0.4)


def test_probe_on_evidence_then_enter_two() -> None:
    # high p1 at one draft is evidence; the probe finds p2_cond high and stays at two
    rung = AdaptiveRung()
    assert rung.drafts_for(12, 3) == 1  # no evidence yet
    flush(rung, 0.9)
    assert rung.drafts_for(12, 3) == 2  # probe
    flush(rung, 0.9, p2=0.9)
    assert rung.two_drafts and rung.drafts_for(12, 3) == 2


def test_failed_probe_waits_for_a_rise() -> None:
    # a probe that finds p2_cond = 0 returns to one draft and does not probe again until p1 rises
    rung = AdaptiveRung(RungParams(alpha=1.0))
    flush(rung, 0.6)
    assert rung.drafts_for(12, 2) == 2
    flush(rung, 0.6, p2=0.0)
    assert not rung.two_drafts and rung.drafts_for(12, 2) == 1
    flush(rung, 0.62)
    assert rung.drafts_for(12, 2) == 1  # rose by less than probe_p1_rise
    flush(rung, 0.7)
    assert rung.drafts_for(12, 2) == 2  # rose by 0.1: evidence again


def test_no_evidence_when_two_drafts_cannot_pay() -> None:
    # p1 = 0.1: even p2_cond = 0.9 gives a ratio of about 1.08 < enter, so no probe
    rung = AdaptiveRung()
    flush(rung, 0.1)
    assert token_ratio(0.1, P.probe_p2_cond) < P.enter
    assert rung.drafts_for(12, 3) == 1


def test_probe_on_backstop() -> None:
    # with no evidence, a probe still runs after probe_backstop one-draft flushes, then the count restarts
    rung = AdaptiveRung(RungParams(probe_backstop=5))
    for _ in range(4):
        flush(rung, 0.1)
        assert rung.drafts_for(12, 3) == 1
    flush(rung, 0.1)
    assert rung.drafts_for(12, 3) == 2
    flush(rung, 0.1, p2=0.0)
    assert rung.flushes_at_one == 0 and rung.drafts_for(12, 3) == 1


def test_leaves_two_drafts_after_sustained_low_ratio() -> None:
    # at two drafts a dip between leave and enter keeps two; a collapse of p2_cond returns to one
    rung = AdaptiveRung(RungParams(alpha=1.0))
    flush(rung, 0.9)
    flush(rung, 0.9, p2=0.9)
    assert rung.two_drafts
    flush(rung, 0.5, p2=0.5)  # ratio 1.167: between leave and enter
    assert rung.two_drafts
    flush(rung, 0.5, p2=0.1)  # ratio 1.033: below leave
    assert not rung.two_drafts


def test_exactly_the_ladder_in_a_two_draft_state() -> None:
    # a rung that wants two drafts still returns the ladder outside 9..=16, below two heads, when disabled
    rung = AdaptiveRung(RungParams(alpha=1.0))
    flush(rung, 0.9)
    flush(rung, 0.9, p2=0.9)
    assert rung.drafts_for(12, 3) == 2  # inside the band: lifted
    assert rung.drafts_for(12, 1) == 1  # one MTP head: the ladder
    assert rung.drafts_for(12, 0) == 0  # none: the ladder
    assert rung.drafts_for(8, 3) == 3  # narrow: the ladder
    assert rung.drafts_for(17, 3) == 1  # wide: the ladder
    disabled = AdaptiveRung(RungParams(disabled=True))
    flush(disabled, 0.9)
    assert disabled.drafts_for(12, 3) == 1


def test_observe_rejects_inconsistent_counts() -> None:
    # more first-draft accepts than sequences, or more second than first, is a caller bug
    rung = AdaptiveRung()
    with pytest.raises(ValueError):
        rung.observe(12, 1, 10, 11, 11)
    with pytest.raises(ValueError):
        rung.observe(12, 2, 10, 9, 4)
    with pytest.raises(ValueError):
        rung.observe(12, 1, 10, 5, 4)  # at one draft every accepted draft is a first draft
    with pytest.raises(ValueError):
        rung.observe(12, 2, 10, 15, 15)  # at two drafts too: 15 first drafts of 10 sequences
    assert rung.p1 is None  # nothing refused was folded in


def test_from_env_reads_the_variable_once() -> None:
    # set (even empty): the ladder forever; unset: the rung may lift
    off = AdaptiveRung.from_env({LADDER_ONLY_ENV: ""})
    on = AdaptiveRung.from_env({"PATH": "/bin"})
    for rung in (off, on):
        flush(rung, 0.9)
        flush(rung, 0.9, p2=0.9)
    assert off.drafts_for(12, 3) == 1
    assert on.drafts_for(12, 3) == 2
    assert on.drafts_for(12, 3, env={LADDER_ONLY_ENV: "1"}) == 1


# --- invariants (hypothesis) ------------------------------------------------------------------


widths = st.integers(9, 16) | st.integers(1, 24)  # half the draws inside the band


@st.composite
def flushes(draw: st.DrawFn) -> tuple[int, int, int, int, int]:
    """(width, drafts_used, sequences, accepted, first_accepted), consistent."""
    width = draw(widths)
    drafts = draw(st.integers(0, 3))
    n = draw(st.integers(0, 50))
    first = draw(st.integers(0, n)) if drafts else 0
    deeper = draw(st.integers(0, first * (drafts - 1))) if drafts >= 2 else 0
    return width, drafts, n, first + deeper, first


params = st.builds(
    RungParams,
    probe_backstop=st.integers(1, 6),
    alpha=st.floats(0.05, 1.0),
    disabled=st.booleans(),
)


@given(params, st.booleans(), st.lists(flushes(), max_size=30), widths, st.integers(0, 5), st.booleans())
def test_never_below_ladder_and_exactly_ladder_where_the_seed_says(
    prm: RungParams, ladder_only: bool, history: list, width: int, num_drafts: int, env_set: bool
) -> None:
    rung = AdaptiveRung(prm, ladder_only=ladder_only)
    for f in history:
        rung.observe(*f)
    env = {LADDER_ONLY_ENV: "1"} if env_set else {}
    ladder = mtp_ladder_drafts(width, num_drafts)
    got = rung.drafts_for(width, num_drafts, env=env)
    assert ladder <= got <= max(num_drafts, 0)
    if not 9 <= width <= 16 or prm.disabled or ladder_only or env_set or num_drafts < 2:
        assert got == ladder
    else:
        assert got in (1, 2)


@given(params, st.lists(flushes(), max_size=30), flushes())
def test_observe_is_inert_outside_the_band_or_when_disabled(prm: RungParams, history: list, last: tuple) -> None:
    rung = AdaptiveRung(prm)
    for f in history:
        rung.observe(*f)
    before = copy.copy(rung)
    rung.observe(*last)
    if prm.disabled or not 9 <= last[0] <= 16:
        assert rung == before
