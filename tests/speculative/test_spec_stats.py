"""Tests for the speculation counters: acceptance, per-position matches, B1 gauge, steps, requests, latches."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from met.speculative.spec_stats import (POSITION_ARMS, SpecStats, acceptance_by_position, recent_tokens_per_s,
                                        summary)


def test_record_verify_counts_prefix_and_bonus() -> None:
    # drafts [hit, miss, hit]: one accepted (prefix), two emitted (with the bonus), three proposed
    s = SpecStats()
    s.record_verify([True, False, True], drafted=4)
    assert (s.drafted, s.proposed, s.accepted, s.verify_seq_steps, s.emitted) == (4, 3, 1, 1, 2)
    assert s.arm_steps[3] == 1
    assert s.arm_accepted[3] == [1, 0, 0]  # accepted only through the first mismatch
    assert s.arm_matched[3] == [1, 0, 1]  # raw matches, wherever they are


def test_arm_positions_per_k() -> None:
    # K=2 and K=4 arms keep separate position counts; K=1 and K=5 have none
    s = SpecStats()
    s.record_verify([True, True])
    s.record_verify([True, False])
    s.record_verify([False, True, True, True])
    s.record_verify([True])
    s.record_verify([True] * 5)
    assert s.arm_steps == {2: 2, 3: 0, 4: 1}
    assert s.arm_accepted[2] == [2, 1]
    assert s.arm_accepted[4] == [0, 0, 0, 0]
    assert s.arm_matched[4] == [0, 1, 1, 1]
    assert s.accepted == 2 + 1 + 0 + 1 + 5


def test_zero_depth_counts_only_drafted() -> None:
    # drafts produced but all clamped away: drafted counts, nothing was verified
    s = SpecStats()
    s.record_verify([], drafted=2)
    assert (s.drafted, s.proposed, s.verify_seq_steps, s.emitted) == (2, 0, 0, 0)
    with pytest.raises(ValueError):
        s.record_verify([True, True], drafted=1)  # cannot verify more than was drafted


def test_b1_gauge_counts_width_one_only() -> None:
    # margins 0.01 and 0.5 at width 1 count (one low); a width-2 step does not count
    s = SpecStats(low_margin=0.05)
    s.record_b1_margin(1, 0.01)
    s.record_b1_margin(1, 0.5)
    s.record_b1_margin(2, 0.0)
    assert (s.b1_steps, s.b1_low_margin) == (2, 1)
    assert summary(s)["b1_low_margin_fraction"] == pytest.approx(0.5)


def test_step_timing_per_mode() -> None:
    # two MTP steps and one plain step, seconds summed per mode
    s = SpecStats()
    s.record_step("mtp", 0.02)
    s.record_step("mtp", 0.04)
    s.record_step("plain", 0.01)
    assert s.mode_steps == {"mtp": 2, "plain": 1}
    assert s.mode_seconds["mtp"] == pytest.approx(0.06)
    assert summary(s)["mtp_seconds_per_step"] == pytest.approx(0.03)


def test_latch_fires_once_per_name() -> None:
    # first call True, then False forever; names are independent
    s = SpecStats()
    assert s.latch("clamp:kv") is True
    assert s.latch("clamp:kv") is False
    assert s.latch("gate:plain") is True
    assert s.latch("clamp:kv") is False


def test_summary_separates_accepted_from_emitted() -> None:
    # mean accepted length excludes the bonus, mean emitted includes it; empty runs give None
    assert summary(SpecStats())["mean_accepted_length"] is None
    s = SpecStats()
    s.record_verify([True, True])
    s.record_verify([False, True])
    got = summary(s)
    assert got["mean_accepted_length"] == pytest.approx(1.0)
    assert got["mean_emitted_per_verify"] == pytest.approx(2.0)
    assert got["acceptance_rate"] == pytest.approx(0.5)
    assert got["k2_accept_pos0"] == pytest.approx(0.5) and got["k2_accept_pos1"] == pytest.approx(0.5)


def test_as_dict_is_a_copy() -> None:
    # mutating the stats after as_dict leaves the returned data unchanged
    s = SpecStats()
    s.record_verify([True, True])
    d = s.as_dict()
    s.record_verify([True, True])
    assert d["arm_accepted"][2] == [1, 1] and d["accepted"] == 2


def test_bad_inputs_rejected() -> None:
    # negative seconds, NaN margins and margins above 1 as thresholds are caller bugs
    with pytest.raises(ValueError):
        SpecStats().record_step("mtp", -1.0)
    with pytest.raises(ValueError):
        SpecStats().record_b1_margin(1, float("nan"))
    with pytest.raises(ValueError):
        SpecStats(low_margin=2.0)


@given(st.lists(st.lists(st.booleans(), max_size=6), max_size=40))
def test_counts_match_a_direct_tally(steps: list[list[bool]]) -> None:
    # totals and per-position counts equal a direct count over the same matches
    s = SpecStats()
    for m in steps:
        s.record_verify(m)

    def prefix(m: list[bool]) -> int:
        return next((i for i, x in enumerate(m) if not x), len(m))

    verified = [m for m in steps if m]
    assert s.proposed == sum(map(len, steps))
    assert s.accepted == sum(prefix(m) for m in steps)
    assert s.emitted == s.accepted + len(verified)
    assert s.accepted <= s.proposed
    for k in POSITION_ARMS:
        at_k = [m for m in steps if len(m) == k]
        assert s.arm_steps[k] == len(at_k)
        for i in range(k):
            assert s.arm_accepted[k][i] == sum(prefix(m) > i for m in at_k)
            assert s.arm_matched[k][i] == sum(m[i] for m in at_k)
            assert s.arm_accepted[k][i] <= s.arm_matched[k][i]


@given(st.lists(st.sampled_from(["a", "b", "c"]), max_size=30))
def test_latches_fire_exactly_once_each(names: list[str]) -> None:
    # over any call sequence, each name returns True exactly once
    s = SpecStats()
    fired = [n for n in names if s.latch(n)]
    assert sorted(fired) == sorted(set(names))


def test_positions_count_at_every_depth_and_a_plain_row_is_a_sequence_step() -> None:
    # depth 3 accepting one, depth 1 accepting one, a plain row: positions verified [2, 1, 1], accepted [2, 0, 0]
    s = SpecStats()
    s.record_verify([True, False, False])
    s.record_verify([True])
    s.record_verify([])
    assert (s.seq_steps, s.verify_seq_steps) == (3, 2)
    assert (s.proposed_at, s.accepted_at) == ([2, 1, 1], [2, 0, 0])
    assert acceptance_by_position(s) == (1.0, 0.0, 0.0)


def test_steps_stream_and_are_priced_and_the_recent_rate_counts_steps_only() -> None:
    # two first tokens outside a step; steps of 4 and 2 tokens in 0.5 s each, one priced at 1.5 J
    s = SpecStats()
    s.record_streamed(2)
    s.record_step("mtp", 0.5, 4, 1.5)
    s.record_step("plain", 0.5, 2)
    assert (s.streamed, s.energy_j, recent_tokens_per_s(s)) == (8, 1.5, 6.0)
    assert s.mode_steps == {"mtp": 1, "plain": 1}
    s.record_finish("stop")
    s.record_finish("stop")
    s.record_failed_tick()
    assert (s.finished, s.failed_ticks) == ({"stop": 2}, 1)
    assert SpecStats().energy_j is None and recent_tokens_per_s(SpecStats()) == 0.0  # nothing priced, no step



def test_step_streamed_counts_the_steps_tokens_and_not_the_prefills():
    s = SpecStats()
    s.record_streamed(3)  # three requests' first tokens, chosen by their prefill
    s.record_step("mtp", 0.01, streamed=5)
    s.record_step("plain", 0.01, streamed=2)
    assert (s.streamed, s.step_streamed) == (10, 7)
