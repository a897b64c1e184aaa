"""Tests for the DFlash gamma resolver: concurrency tiers, the single-stream levels, hysteresis."""

import copy

import pytest
from hypothesis import given
from hypothesis import strategies as st

from met.speculative.dflash_rung import (MAX_GAMMA, DflashParams, DflashRung, gamma_for_width, next_level,
                                        verify_pools)
from met.speculative.spec_capacity import DEFAULT_POOLS, MAX_POOL_WIDTH

P = DflashParams()


@pytest.mark.parametrize(
    ("width", "expected"),
    [
        (2, 8),  # two streams: still a long block
        (3, 6),  # 3..=4 tier
        (8, 4),  # 5..=8 tier
        (16, 2),  # 9..=16 tier
        (17, 1),  # wider than every tier: one draft
        (500, 1),  # very wide batches: one draft
    ],
)
def test_gamma_by_concurrency(width: int, expected: int) -> None:
    assert gamma_for_width(width, P) == expected
    assert DflashRung().gamma_for(width) == expected


def test_single_stream_starts_at_the_top_and_caps_at_the_block() -> None:
    # unmeasured single stream: 16; a drafter with an 8-token block caps it
    rung = DflashRung()
    assert rung.gamma_for(1) == 16
    assert rung.gamma_for(1, max_gamma=8) == 8


def test_single_stream_follows_acceptance() -> None:
    # low acceptance moves a single stream down to 8, high acceptance back up to 16
    rung = DflashRung(DflashParams(alpha=1.0))
    rung.observe(1, 10, 3)
    assert rung.gamma_for(1) == 8
    rung.observe(1, 10, 6)
    assert rung.gamma_for(1) == 12
    rung.observe(1, 10, 9)
    assert rung.gamma_for(1) == 16


def test_ewma_seeded_with_first_sample() -> None:
    # first observation sets p1 outright; the next moves it by alpha
    rung = DflashRung()
    rung.observe(1, 10, 5)
    assert rung.p1 == pytest.approx(0.5)
    rung.observe(1, 10, 10)
    assert rung.p1 == pytest.approx(0.5 + P.alpha * 0.5)


@pytest.mark.parametrize(
    ("level", "p1", "expected"),
    [
        (0, 0.55, 1),  # up at up[0]
        (0, 0.54, 0),  # just below: stays
        (1, 0.48, 1),  # inside the gap below up[0]: stays at 12
        (1, 0.46, 0),  # below up[0] - gap: down
        (2, 0.70, 2),  # inside the gap below up[1]: stays at 16
        (2, 0.10, 0),  # collapse: straight to the bottom
        (0, 0.99, 2),  # excellent: straight to the top
    ],
)
def test_next_level_literals(level: int, p1: float, expected: int) -> None:
    assert next_level(level, p1, P) == expected


@pytest.mark.parametrize(
    "kwargs",
    [
        {"tiers": ((4, 4), (2, 8))},  # widths not ascending
        {"tiers": ((2, 4), (4, 8))},  # gamma growing with width
        {"single_levels": (4, 8, 32)},  # beyond the 16-token block
        {"single_levels": (2, 8, 16)},  # single stream below the 2-wide tier
        {"up": (0.5,)},  # one threshold for three levels
        {"gap": 0.6},  # gap larger than the lowest threshold
        {"wide_gamma": 0},  # zero gamma is plain decode, not a tier
    ],
)
def test_params_reject_nonsense(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        DflashParams(**kwargs)


observations = st.lists(st.tuples(st.integers(1, 4), st.integers(0, 20), st.integers(0, 20)), max_size=20)


def apply(rung: DflashRung, obs: list[tuple[int, int, int]]) -> None:
    for width, a, b in obs:
        rung.observe(width, max(a, b), min(a, b))


@given(observations, st.integers(1, 64), st.integers(1, MAX_GAMMA))
def test_gamma_bounded_and_never_grows_with_width(obs: list, width: int, cap: int) -> None:
    # 1 <= gamma <= min(16, cap), and a wider step never gets a larger gamma
    rung = DflashRung()
    apply(rung, obs)
    g = rung.gamma_for(width, cap)
    assert 1 <= g <= min(MAX_GAMMA, cap)
    assert rung.gamma_for(width + 1, cap) <= g


@given(observations, st.integers(2, 64), st.integers(0, 10), st.integers(1, 10))
def test_wide_steps_neither_use_nor_move_the_ewma(obs: list, width: int, a: int, extra: int) -> None:
    # concurrency decides at width > 1: observing there changes nothing, and history does not matter
    rung = DflashRung()
    apply(rung, obs)
    before = copy.copy(rung)
    rung.observe(width, a + extra, a)
    assert rung == before
    assert rung.gamma_for(width) == DflashRung().gamma_for(width)


@given(st.integers(0, 2), st.floats(0.0, 1.0))
def test_next_level_hysteresis(level: int, p1: float) -> None:
    # a level moves up only at/above its threshold, down only below threshold - gap; a rate
    # inside a gap leaves the level where it is
    new = next_level(level, p1, P)
    if new > level:
        assert p1 >= P.up[new - 1]
    if new < level:
        assert p1 < P.up[new] - P.gap
    for i, up in enumerate(P.up):
        if up - P.gap <= p1 < up:  # inside gap i: neither crosses it
            assert (level <= i) == (new <= i)


def test_verify_pools_hold_the_rung_tiers() -> None:
    # a 16-token block: 16 alone, 8 / 6 / 4 / 2 by tier, 1 up to the widest pool; the MTP defaults hold 4 alone
    assert verify_pools(P, 16).tiers == ((1, 16), (2, 8), (4, 6), (8, 4), (16, 2), (MAX_POOL_WIDTH, 1))
    assert DEFAULT_POOLS.max_drafts(1) == 4 < verify_pools(P, 16).max_drafts(1)
    # a 4-token block caps every tier at 4
    assert verify_pools(P, 4).tiers == ((1, 4), (2, 4), (4, 4), (8, 4), (16, 2), (MAX_POOL_WIDTH, 1))
    # tiers already reaching the widest pool get no extra tier
    assert verify_pools(DflashParams(tiers=((MAX_POOL_WIDTH, 2),)), 16).tiers == ((1, 16), (MAX_POOL_WIDTH, 2))


@pytest.mark.parametrize("block", [0, MAX_GAMMA + 1])
def test_verify_pools_refuse_a_block_no_drafter_has(block: int) -> None:
    with pytest.raises(ValueError, match="block must be in"):
        verify_pools(P, block)


@given(observations, st.integers(1, MAX_POOL_WIDTH), st.integers(1, MAX_GAMMA), st.integers(0, 2))
def test_verify_pools_never_clamp_the_rung(obs: list, width: int, block: int, level: int) -> None:
    # whatever the level and history, the pool of a width holds the rung's gamma there; at the top level exactly
    rung = DflashRung(level=level)
    apply(rung, obs)
    pools = verify_pools(rung.params, block)
    assert rung.gamma_for(width, block) <= pools.max_drafts(width)
    assert DflashRung(level=-1).gamma_for(width, block) == pools.max_drafts(width)
