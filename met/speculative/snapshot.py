"""The scheduler's observability snapshot: one frozen record published each tick into a SnapshotCell.

The scheduler thread is the only writer; the TUI, /v1/snapshot and /metrics read. Readers
always get a whole snapshot of one tick, never a mix of two.
"""

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SchedulerSnapshot:
    """What the scheduler did at one tick, and the run's counters as of that tick."""

    tick: int = 0  # scheduler loop iterations since start
    width: int = 0  # sequences in this tick's step
    active: int = 0  # sequences admitted and not finished
    queued: int = 0  # requests waiting for admission
    mode: str = "idle"  # "mtp", "draft" (a draft model), "plain", "dflash", "lookup" or "idle"
    depth: int = 0  # planned drafts per sequence before the capacity clamp
    why: str = ""  # short reason for depth, e.g. "ladder", "rung:two", "gate:plain", "plan", "clamp:kv"
    acceptance: tuple[float, ...] = ()  # per draft position: fraction accepted (drafts 0..=i all matched)
    tokens_per_s: float = 0.0  # emitted tokens per second of step wall time, last 32 steps; 0 once none for 5 s
    joules_per_token: float | None = None  # None without an energy source
    drafts_proposed: int = 0  # drafts verified since start
    drafts_accepted: int = 0  # of those, accepted (the bonus token not counted)
    emitted_tokens: int = 0  # tokens streamed out since start, bonus tokens included
    spec: str = "off"  # the drafting policy served, e.g. "mtp", "mtp/measured", "prompt-lookup"
    max_batch: int = 0  # sequence slots of the KV cache (active of them are held)
    drafted: int = 0  # tokens the drafter produced since start (>= drafts_proposed)
    draft_steps: int = 0  # sequence-steps that verified at least one draft
    accepted_at: tuple[int, ...] = ()  # per position i: sequence-steps whose drafts 0..=i were all accepted
    proposed_at: tuple[int, ...] = ()  # per position i: sequence-steps that verified a draft at i
    mode_steps: tuple[tuple[str, int], ...] = ()  # (mode, steps) since start
    mode_seconds: tuple[tuple[str, float], ...] = ()  # (mode, step wall seconds) since start
    planned_tokens_per_s: float | None = None  # the measured planner's expected rate at this tick's depth
    energy_j: float | None = None  # joules since start as the cost table prices each step; None without one
    shared_lookup_tokens: int = 0  # tokens held by the cross-request lookup cache, all scopes
    finished: tuple[tuple[str, int], ...] = ()  # (finish reason, requests) since start
    failed_ticks: int = 0  # ticks whose step raised; their sequences were failed and freed

    def __post_init__(self) -> None:
        counts = ("tick", "width", "active", "queued", "depth", "drafts_proposed", "drafts_accepted",
                  "emitted_tokens", "max_batch", "drafted", "draft_steps", "shared_lookup_tokens", "failed_ticks")
        negative = {name: getattr(self, name) for name in counts if getattr(self, name) < 0}
        for name in ("accepted_at", "proposed_at"):
            if any(n < 0 for n in getattr(self, name)):
                negative[name] = getattr(self, name)
        for name in ("mode_steps", "mode_seconds", "finished"):
            if any(not v >= 0 for _, v in getattr(self, name)):  # also refuses NaN
                negative[name] = getattr(self, name)
        if negative:
            raise ValueError(f"snapshot counts must be >= 0, got {negative}")
        if self.drafts_accepted > self.drafts_proposed:
            raise ValueError(f"{self.drafts_accepted} drafts accepted of only {self.drafts_proposed} proposed")
        if len(self.accepted_at) != len(self.proposed_at) or any(
                a > p for a, p in zip(self.accepted_at, self.proposed_at)):
            raise ValueError(f"accepted_at {self.accepted_at} does not fit within proposed_at {self.proposed_at}")
        for name in ("planned_tokens_per_s", "energy_j"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0.0):
                raise ValueError(f"{name} must be finite and >= 0 or None, got {value}")
        if not all(0.0 <= a <= 1.0 for a in self.acceptance):
            raise ValueError(f"acceptance rates must be in [0, 1], got {self.acceptance}")
        if not (math.isfinite(self.tokens_per_s) and self.tokens_per_s >= 0.0):
            raise ValueError(f"tokens_per_s must be finite and >= 0, got {self.tokens_per_s}")
        jpt = self.joules_per_token
        if jpt is not None and not (math.isfinite(jpt) and jpt > 0.0):
            raise ValueError(f"joules_per_token must be finite and > 0 or None, got {jpt}")


class SnapshotCell:
    """Holds the latest snapshot: one writer publishes, any number of readers read, the latest value wins.

    No lock is needed: publish is one attribute store and latest one attribute load, each a
    single atomic reference swap in CPython (under the GIL, and under per-object locking in
    free-threaded builds), and a snapshot is immutable once built, so a reader sees either
    the previous snapshot or the new one, whole. With one writer there is no lost update.
    """

    __slots__ = ("_latest",)

    def __init__(self, initial: SchedulerSnapshot | None = None) -> None:
        self._latest = SchedulerSnapshot() if initial is None else initial

    def publish(self, snap: SchedulerSnapshot) -> None:
        """Replace the current snapshot; called by the scheduler thread only."""
        if not isinstance(snap, SchedulerSnapshot):
            raise TypeError(f"publish takes a SchedulerSnapshot, got {type(snap).__name__}")
        self._latest = snap

    def latest(self) -> SchedulerSnapshot:
        """The most recently published snapshot (an empty one before the first tick)."""
        return self._latest
