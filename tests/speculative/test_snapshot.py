"""Tests for the scheduler snapshot and its cell: immutable, validated, latest value wins."""

import dataclasses
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from met.speculative.snapshot import SchedulerSnapshot, SnapshotCell


def test_empty_cell_reads_an_idle_snapshot() -> None:
    # before the first tick readers get tick 0, idle
    snap = SnapshotCell().latest()
    assert (snap.tick, snap.mode, snap.joules_per_token) == (0, "idle", None)


def test_snapshot_is_immutable() -> None:
    # a published snapshot cannot be changed in place, nor grow new attributes
    snap = SchedulerSnapshot(tick=3, acceptance=(0.8, 0.5))
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.tick = 4  # type: ignore[misc]
    with pytest.raises((AttributeError, TypeError)):
        snap.extra = 1  # type: ignore[attr-defined]
    assert isinstance(snap.acceptance, tuple)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"width": -1},  # negative count
        {"drafts_accepted": 3, "drafts_proposed": 2},  # more accepted than proposed
        {"acceptance": (0.5, 1.2)},  # a rate above 1
        {"tokens_per_s": float("nan")},  # non-finite rate
        {"joules_per_token": 0.0},  # zero energy per token is a broken meter
        {"accepted_at": (3,), "proposed_at": (2,)},  # a position accepted more often than verified
        {"accepted_at": (1, 0), "proposed_at": (2,)},  # per-position counts of different lengths
        {"mode_seconds": (("mtp", -1.0),)},  # negative step time
        {"finished": (("stop", -2),)},  # negative request count
        {"energy_j": float("inf")},  # non-finite energy
        {"max_batch": -1},  # negative slot count
    ],
)
def test_snapshot_rejects_nonsense(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        SchedulerSnapshot(**kwargs)


def test_publish_rejects_other_types() -> None:
    # a dict is not a snapshot: readers rely on the frozen type
    with pytest.raises(TypeError):
        SnapshotCell().publish({"tick": 1})  # type: ignore[arg-type]


@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=20))
def test_latest_value_wins(ticks: list[int]) -> None:
    # whatever order ticks are published in, latest() is the last one published, the same object
    cell = SnapshotCell()
    snaps = [SchedulerSnapshot(tick=t, width=t % 7) for t in ticks]
    for s in snaps:
        cell.publish(s)
    assert cell.latest() is snaps[-1]


def test_concurrent_readers_see_whole_snapshots_in_order() -> None:
    # one writer publishes ticks 1..N (width == tick % 13 in each); readers never see a mixed
    # snapshot or a tick going backwards, and end at N
    cell, n = SnapshotCell(), 5_000
    seen: list[list[int]] = [[] for _ in range(3)]

    def read(out: list[int]) -> None:
        while (s := cell.latest()).tick < n:
            assert s.width == s.tick % 13
            out.append(s.tick)
        out.append(s.tick)

    readers = [threading.Thread(target=read, args=(o,), daemon=True) for o in seen]
    for r in readers:
        r.start()
    for t in range(1, n + 1):
        cell.publish(SchedulerSnapshot(tick=t, width=t % 13))
    for r in readers:
        r.join(timeout=10)
    for out in seen:
        assert out[-1] == n
        assert all(a <= b for a, b in zip(out, out[1:]))
