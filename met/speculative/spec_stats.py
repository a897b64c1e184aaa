"""The speculation counters: drafts and acceptance (per position, and per arm K=2,3,4), B1 margin, steps, requests.

One class counts for every caller: the scheduler keeps one for its run (the snapshot, /metrics
and `met bench policies` read it), and `met generate` keeps one per request. Counting only:
nothing here changes generation, and the counting class formats or exports nothing; `summary`,
`acceptance_by_position` and `recent_tokens_per_s` turn the counts into the derived figures
Prometheus, logs, reports and the snapshot show. Units: a *sequence-step* is one sequence in
one verify step (a plain decode row included).
"""

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

POSITION_ARMS = (2, 3, 4)  # verify depths whose per-position matches are counted
RATE_WINDOW = 32  # steps in the recent tokens/s figure: long enough to smooth one slow step


@dataclass(slots=True)
class SpecStats:
    """Counters for one run (or one request); the scheduler thread is the only writer."""

    # B1 gauge threshold on the target's top-1 minus top-2 log-probability, log(p1 / p2): under 0.05 the
    # runner-up is within 5% of the top token (the logits' difference; it needs no softmax)
    low_margin: float = 0.05
    drafted: int = 0  # tokens the drafter produced, including those the capacity clamp dropped
    proposed: int = 0  # drafts verified (sum of depth k over sequence-steps)
    accepted: int = 0  # verified drafts accepted; excludes the bonus token
    seq_steps: int = 0  # sequence-steps of every kind, plain decode rows included
    verify_seq_steps: int = 0  # sequence-steps that verified at least one draft
    emitted: int = 0  # tokens those sequence-steps emitted: accepted drafts + one bonus each
    # per draft position i at any depth: sequence-steps that verified a draft there, and of those how many
    # had drafts 0..=i all accepted
    proposed_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)
    # per arm K: sequence-steps at depth K, and per position i < K how many had draft i
    # accepted (drafts 0..=i all matched) and how many had draft i match the target at all
    arm_steps: dict[int, int] = field(default_factory=lambda: dict.fromkeys(POSITION_ARMS, 0))
    arm_accepted: dict[int, list[int]] = field(default_factory=lambda: {k: [0] * k for k in POSITION_ARMS})
    arm_matched: dict[int, list[int]] = field(default_factory=lambda: {k: [0] * k for k in POSITION_ARMS})
    b1_steps: int = 0  # width-1 steps whose target margin was recorded
    b1_low_margin: int = 0  # of those, steps with margin < low_margin (a drafter's coin flip)
    mode_steps: dict[str, int] = field(default_factory=dict)  # steps per mode ("mtp", "plain", ...)
    mode_seconds: dict[str, float] = field(default_factory=dict)  # step wall seconds per mode
    fired: set[str] = field(default_factory=set)  # one-shot log latches that have fired
    streamed: int = 0  # tokens streamed to clients: first and bonus tokens included, none past EOS or a stop
    step_streamed: int = 0  # of those, the ones decode and verify steps emitted (not the prefills' first tokens)
    finished: dict[str, int] = field(default_factory=dict)  # requests that left, by reason
    failed_ticks: int = 0  # scheduler ticks (or steps) that raised
    energy_j: float | None = None  # the cost table's joules of every step run (None: no step was priced)
    recent: deque = field(default_factory=lambda: deque(maxlen=RATE_WINDOW))  # (streamed tokens, step seconds)

    def __post_init__(self) -> None:
        if not 0.0 <= self.low_margin <= 1.0:
            raise ValueError(f"low_margin must be a log-prob margin in [0, 1], got {self.low_margin}")

    def record_verify(self, matches: Sequence[bool], drafted: int | None = None) -> None:
        """Count one sequence-step: matches[i] says whether draft i matched the target."""
        k = len(matches)
        drafted = k if drafted is None else drafted
        if drafted < k:
            raise ValueError(f"{k} drafts verified but only {drafted} drafted")
        self.drafted += drafted
        self.seq_steps += 1
        if k == 0:
            return
        n_acc = next((i for i, m in enumerate(matches) if not m), k)  # longest matching prefix
        self.proposed += k
        self.accepted += n_acc
        self.verify_seq_steps += 1
        self.emitted += n_acc + 1
        proposed_at, accepted_at = self.proposed_at, self.accepted_at
        while len(proposed_at) < k:
            proposed_at.append(0)
            accepted_at.append(0)
        for i in range(k):
            proposed_at[i] += 1
            accepted_at[i] += i < n_acc
        if k in self.arm_steps:
            self.arm_steps[k] += 1
            for i in range(n_acc):
                self.arm_accepted[k][i] += 1
            for i, m in enumerate(matches):
                if m:
                    self.arm_matched[k][i] += 1

    def record_b1_margin(self, width: int, margin: float) -> None:
        """Count a step's target top-1 minus top-2 log-probability toward the B1 gauge; width-1 steps only."""
        if not math.isfinite(margin) or margin < 0.0:
            raise ValueError(f"margin must be finite and >= 0, got {margin}")
        if width != 1:
            return
        self.b1_steps += 1
        if margin < self.low_margin:
            self.b1_low_margin += 1

    def record_step(self, mode: str, seconds: float, streamed: int = 0, energy_j: float | None = None) -> None:
        """Count one scheduler step of `mode` that took `seconds` of wall time, streamed `streamed` tokens to
        clients and was priced at `energy_j` (None: not priced)."""
        if not (math.isfinite(seconds) and seconds >= 0.0):
            raise ValueError(f"seconds must be finite and >= 0, got {seconds}")
        self.mode_steps[mode] = self.mode_steps.get(mode, 0) + 1
        self.mode_seconds[mode] = self.mode_seconds.get(mode, 0.0) + seconds
        self.streamed += streamed
        self.step_streamed += streamed
        self.recent.append((streamed, seconds))
        if energy_j is not None:
            self.energy_j = (self.energy_j or 0.0) + energy_j

    def record_streamed(self, tokens: int) -> None:
        """Tokens streamed outside a step (a request's first token, which its prefill chose)."""
        self.streamed += tokens

    def record_finish(self, reason: str) -> None:
        """One request left for `reason`."""
        self.finished[reason] = self.finished.get(reason, 0) + 1

    def record_failed_tick(self) -> None:
        """One tick (or step) that raised."""
        self.failed_ticks += 1

    def latch(self, name: str) -> bool:
        """True the first time `name` is latched in this run, False ever after: log only on True."""
        if name in self.fired:
            return False
        self.fired.add(name)
        return True

    def as_dict(self) -> dict[str, object]:
        """The raw counts as plain data (fresh containers, safe to hand to another thread)."""
        return {
            "drafted": self.drafted,
            "proposed": self.proposed,
            "accepted": self.accepted,
            "seq_steps": self.seq_steps,
            "verify_seq_steps": self.verify_seq_steps,
            "emitted": self.emitted,
            "arm_steps": dict(self.arm_steps),
            "arm_accepted": {k: list(v) for k, v in self.arm_accepted.items()},
            "arm_matched": {k: list(v) for k, v in self.arm_matched.items()},
            "b1_steps": self.b1_steps,
            "b1_low_margin": self.b1_low_margin,
            "mode_steps": dict(self.mode_steps),
            "mode_seconds": dict(self.mode_seconds),
            "fired": sorted(self.fired),
            "proposed_at": list(self.proposed_at),
            "accepted_at": list(self.accepted_at),
            "streamed": self.streamed,
            "finished": dict(self.finished),
            "failed_ticks": self.failed_ticks,
            "energy_j": self.energy_j,
        }


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def summary(stats: SpecStats) -> dict[str, float | None]:
    """Derived figures for reporting; None where nothing was counted yet."""
    out: dict[str, float | None] = {
        "acceptance_rate": _ratio(stats.accepted, stats.proposed),  # accepted / verified drafts
        "mean_accepted_length": _ratio(stats.accepted, stats.verify_seq_steps),  # excludes the bonus
        "mean_emitted_per_verify": _ratio(stats.emitted, stats.verify_seq_steps),  # includes the bonus
        "b1_low_margin_fraction": _ratio(stats.b1_low_margin, stats.b1_steps),
    }
    for k in POSITION_ARMS:
        for i, n in enumerate(stats.arm_accepted[k]):
            out[f"k{k}_accept_pos{i}"] = _ratio(n, stats.arm_steps[k])
    for mode, steps in stats.mode_steps.items():
        out[f"{mode}_seconds_per_step"] = _ratio(stats.mode_seconds[mode], steps)
    return out


def acceptance_by_position(stats: SpecStats) -> tuple[float, ...]:
    """Per draft position: the share of sequence-steps verifying a draft there whose drafts 0..=i were all accepted."""
    return tuple(a / p for a, p in zip(stats.accepted_at, stats.proposed_at) if p)


def recent_tokens_per_s(stats: SpecStats) -> float:
    """Streamed tokens per second of step wall time over the last RATE_WINDOW steps (0 before any)."""
    seconds = sum(s for _, s in stats.recent)
    return sum(n for n, _ in stats.recent) / seconds if seconds > 0 else 0.0
