"""Tests for draft-count limits: KV room, verify pools by width tier, the serial path's arms."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from met.speculative.spec_capacity import (
    DEFAULT_POOLS,
    SERIAL_VERIFY_ARMS,
    VerifyPools,
    clamp_drafts_to_slot_capacity,
    kv_room,
    serial_arm,
    slot_capacity,
)

LIFTED = VerifyPools(lift_wide_tier=True)


@pytest.mark.parametrize(
    ("current", "max_len", "expected"),
    [
        (100, 110, 9),  # 9 drafts + the bonus fill the last 10 positions
        (109, 110, 0),  # room for the bonus only
        (110, 110, 0),  # full: never negative
        (0, 1, 0),  # a one-token budget: no drafts
    ],
)
def test_kv_room(current: int, max_len: int, expected: int) -> None:
    assert kv_room(current, max_len) == expected


@pytest.mark.parametrize(
    ("width", "pools", "expected"),
    [
        (1, DEFAULT_POOLS, 4),  # narrow tier
        (8, DEFAULT_POOLS, 4),  # its last width
        (9, DEFAULT_POOLS, 1),  # 9..=16 clamped to one draft, as the seed says
        (16, DEFAULT_POOLS, 1),
        (9, LIFTED, 2),  # the flag lifts 9..=16 to two
        (16, LIFTED, 2),
        (17, LIFTED, 1),  # the lift touches 9..=16 only
        (8, LIFTED, 4),  # ... and never lowers a narrower tier
        (257, DEFAULT_POOLS, 0),  # beyond the widest pool: no verify slots
    ],
)
def test_pool_tiers(width: int, pools: VerifyPools, expected: int) -> None:
    assert pools.max_drafts(width) == expected


@pytest.mark.parametrize(
    ("drafts", "expected"),
    [(0, 0), (1, 1), (3, 3), (4, 4), (7, 4)],  # the largest supported arm <= drafts; 0 when none
)
def test_serial_arm(drafts: int, expected: int) -> None:
    assert serial_arm(drafts) == expected


def test_serial_arm_with_gaps() -> None:
    # a serial path with arms {2, 4}: 3 drafts run the 2-arm, 1 draft runs none
    assert serial_arm(3, frozenset({2, 4})) == 2
    assert serial_arm(1, frozenset({2, 4})) == 0


def test_clamp_literals() -> None:
    # width 3 (narrow tier, pool 4): per sequence min(requested, KV room, 4)
    assert clamp_drafts_to_slot_capacity(6, [10, 95, 99], [100, 100, 100]) == [4, 4, 0]
    # width 10 with default pools: one draft each
    assert clamp_drafts_to_slot_capacity(2, [10] * 10, [100] * 10) == [1] * 10
    # width 10 lifted: the rung's two drafts pass
    assert clamp_drafts_to_slot_capacity(2, [10] * 10, [100] * 10, LIFTED) == [2] * 10
    # serial arms {1, 2, 4}: 3 allowed -> the 2-arm
    assert clamp_drafts_to_slot_capacity(3, [0], [100], serial_arms=frozenset({1, 2, 4})) == [2]
    # no sequences: nothing to clamp
    assert clamp_drafts_to_slot_capacity(3, [], []) == []


def test_clamp_rejects_bad_input() -> None:
    # mismatched lengths or negative requests are caller bugs
    with pytest.raises(ValueError):
        clamp_drafts_to_slot_capacity(2, [1, 2], [10])
    with pytest.raises(ValueError):
        clamp_drafts_to_slot_capacity(-1, [1], [10])


@pytest.mark.parametrize("kwargs", [{"tiers": ()}, {"tiers": ((16, 1), (8, 4))}, {"tiers": ((8, -1),)}])
def test_pools_reject_nonsense(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        VerifyPools(**kwargs)


pools = st.builds(
    VerifyPools,
    tiers=st.lists(st.tuples(st.integers(1, 64), st.integers(0, 8)), min_size=1, max_size=4, unique_by=lambda t: t[0])
    .map(sorted)
    .map(tuple),
    lift_wide_tier=st.booleans(),
    lifted_drafts=st.integers(0, 4),
)
seqs = st.lists(st.tuples(st.integers(0, 200), st.integers(0, 60)), min_size=1, max_size=40)
arms = st.none() | st.frozensets(st.integers(1, 8), max_size=5) | st.just(SERIAL_VERIFY_ARMS)


@given(st.integers(0, 12), seqs, pools, arms)
def test_clamp_never_beyond_kv_room_or_pool(requested: int, lens: list, pl: VerifyPools, sa: frozenset | None) -> None:
    # every count <= requested, KV room and the width tier's pool; serial counts are supported arms
    current = [c for c, _ in lens]
    max_lens = [c + extra for c, extra in lens]
    out = clamp_drafts_to_slot_capacity(requested, current, max_lens, pl, sa)
    width = len(lens)
    assert len(out) == width
    for d, cur, mx in zip(out, current, max_lens):
        cap = min(requested, slot_capacity(width, cur, mx, pl))
        assert 0 <= d <= requested
        assert cur + d + 1 <= mx or d == 0
        assert d <= pl.max_drafts(width)
        if sa is None:
            assert d == cap
        else:
            assert d == 0 or d in sa
            assert not any(d < a <= cap for a in sa)  # the largest arm that fits


@given(st.integers(9, 16), st.integers(0, 12), st.integers(0, 100))
def test_default_pools_clamp_wide_tier_to_one(width: int, requested: int, room: int) -> None:
    # widths 9..=16 never verify more than one draft per sequence unless the flag lifts it
    out = clamp_drafts_to_slot_capacity(requested, [0] * width, [room] * width)
    assert all(d <= 1 for d in out)


def test_copy_pools_are_the_dflash_rungs_default_pools_for_a_16_token_block():
    from met.speculative.dflash_rung import MAX_GAMMA, DflashParams, verify_pools
    from met.speculative.spec_capacity import COPY_POOLS

    assert COPY_POOLS == verify_pools(DflashParams(), MAX_GAMMA)
    assert [COPY_POOLS.max_drafts(n) for n in (1, 2, 3, 4, 5, 8, 9, 16, 17)] == [16, 8, 6, 6, 4, 4, 2, 2, 1]
