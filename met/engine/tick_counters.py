"""What the scheduler counts beside SpecStats: acceptance per position at every depth, requests, throughput, energy.

Counting only, like SpecStats: the scheduler thread is the only writer, and the snapshot copies
the counts out. Acceptance per position i counts sequence-steps whose drafts 0..=i were all
accepted, over sequence-steps that verified a draft at i, whatever the step's depth (SpecStats
keeps the same per verify arm K=2,3,4 only).
"""

from collections import deque
from dataclasses import dataclass, field

RATE_WINDOW = 32  # steps in the recent tokens/s figure: long enough to smooth one slow step


def count_chain(proposed_at: list[int], accepted_at: list[int], proposed: int, accepted: int) -> None:
    """Add one chain to per-position counts: positions 1..proposed verified, 1..accepted all accepted."""
    while len(proposed_at) < proposed:
        proposed_at.append(0)
        accepted_at.append(0)
    for i in range(proposed):
        proposed_at[i] += 1
        accepted_at[i] += i < accepted

@dataclass(slots=True)
class TickCounters:
    """Per-position acceptance, finished requests by reason, failed ticks, recent rate and priced energy."""

    proposed_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)
    emitted: int = 0  # tokens streamed to clients, first tokens and bonus tokens included
    finished: dict[str, int] = field(default_factory=dict)
    failed_ticks: int = 0
    energy_j: float | None = None  # sum of the cost table's joules of every step run (measured planner only)
    recent: deque = field(default_factory=lambda: deque(maxlen=RATE_WINDOW))  # (emitted tokens, step seconds)

    def record_chain(self, proposed: int, accepted: int) -> None:
        """One sequence-step that verified `proposed` drafts and accepted the first `accepted`."""
        count_chain(self.proposed_at, self.accepted_at, proposed, accepted)

    def record_step(self, emitted: int, seconds: float, energy_j: float | None) -> None:
        """One step: tokens it emitted, its wall seconds, and its priced joules (None: not priced)."""
        self.emitted += emitted
        self.recent.append((emitted, seconds))
        if energy_j is not None:
            self.energy_j = (self.energy_j or 0.0) + energy_j

    def record_finish(self, reason: str) -> None:
        """One request left the scheduler for `reason`."""
        self.finished[reason] = self.finished.get(reason, 0) + 1

    def tokens_per_s(self) -> float:
        """Emitted tokens per second of step wall time over the recent steps (0 before any)."""
        seconds = sum(s for _, s in self.recent)
        return sum(n for n, _ in self.recent) / seconds if seconds > 0 else 0.0

    def acceptance(self) -> tuple[float, ...]:
        """Per position: the fraction of verified drafts accepted there (drafts 0..=i all matched)."""
        return tuple(a / p for a, p in zip(self.accepted_at, self.proposed_at) if p)
