"""Adaptive MTP draft count for batch widths 9..=16: one or two drafts from observed acceptance, never below the ladder.

With p1 the first-draft accept rate and p2_cond the second draft's accept rate given an
accepted first draft, two drafts emit token_ratio(p1, p2_cond) = (1 + p1 + p1*p2_cond) / (1 + p1)
times the tokens per verify step of one draft. The controller moves to two drafts when the
smoothed ratio reaches `enter` and back to one when it falls below `leave` (next_state).
At one draft no second token is proposed, so p2_cond cannot be observed there; the
controller then runs two drafts for one flush (a probe) only on evidence (p1 has risen since
the last two-draft flush and two drafts could pay at an optimistic p2_cond) or after a long
backstop. A probe costs about 1.5 steady flushes (seed: 2.90 s against 1.16 s at C=16).

Invariants: drafts_for never returns fewer drafts than the ladder, and returns exactly the
ladder outside 9..=16, when disabled, when METRALE_NO_MTP_K_LADDER is set, or when
num_drafts < 2; observe changes no state outside 9..=16 or when disabled.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Self

from met.speculative.ladder import mtp_ladder_drafts

LADDER_ONLY_ENV = "METRALE_NO_MTP_K_LADDER"  # set (any value, even empty): the rung returns the ladder
RUNG_WIDTHS = range(9, 17)  # widths 9..=16, where the ladder says one draft but two may pay


def token_ratio(p1: float, p2_cond: float) -> float:
    """Tokens per verify step at two drafts relative to one: (1 + p1 + p1*p2_cond) / (1 + p1)."""
    if not (math.isfinite(p1) and math.isfinite(p2_cond)) or p1 <= 0.0:
        return 1.0
    return (1.0 + p1 + p1 * p2_cond) / (1.0 + p1)


def p2_cond_from(mean_na: float, p1: float) -> float | None:
    """Second-draft accept given an accepted first, from mean accepted drafts at two: clamp((mean_na-p1)/p1)."""
    if not p1 > 0.0:  # also refuses NaN
        return None
    return min(1.0, max(0.0, (mean_na - p1) / p1))


@dataclass(frozen=True, slots=True)
class RungParams:
    """The controller's thresholds, fixed for the life of one AdaptiveRung."""

    enter: float = 1.20  # two drafts once the smoothed ratio reaches this: must repay the extra verify slot
    leave: float = 1.10  # back to one draft below this; the gap to `enter` keeps noise from flapping
    alpha: float = 0.25  # EWMA weight of the newest flush
    probe_p2_cond: float = 0.9  # optimistic p2_cond used to judge whether two drafts could pay at all
    probe_p1_rise: float = 0.05  # rise of p1 since the last two-draft flush that counts as evidence
    probe_backstop: int = 200  # one-draft flushes after which a probe runs anyway (< 1% of run time)
    disabled: bool = False  # always the ladder

    def __post_init__(self) -> None:
        # the ratio lies in [1, 1.5] for rates in [0, 1]: outside it a threshold is never crossed
        if not 1.0 < self.leave < self.enter <= 1.5:
            raise ValueError(f"need 1 < leave < enter <= 1.5, got leave={self.leave}, enter={self.enter}")
        if not 0.0 < self.alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha}")
        if not 0.0 < self.probe_p2_cond <= 1.0:
            raise ValueError(f"probe_p2_cond must be in (0, 1], got {self.probe_p2_cond}")
        if not 0.0 <= self.probe_p1_rise < 1.0:
            raise ValueError(f"probe_p1_rise must be in [0, 1), got {self.probe_p1_rise}")
        if self.probe_backstop < 1:
            raise ValueError(f"probe_backstop must be >= 1 flush, got {self.probe_backstop}")


def next_state(two_drafts: bool, ratio: float, params: RungParams) -> bool:
    """The next state from the current one and the smoothed token ratio; True means two drafts."""
    return ratio >= params.leave if two_drafts else ratio >= params.enter


def _ewma(old: float | None, sample: float, alpha: float) -> float:
    return sample if old is None else old + alpha * (sample - old)


@dataclass(slots=True)
class AdaptiveRung:
    """The controller; each scheduler context owns one, so accept history is not shared between contexts."""

    params: RungParams = field(default_factory=RungParams)
    ladder_only: bool = False  # METRALE_NO_MTP_K_LADDER was set when this rung was made
    two_drafts: bool = False
    p1: float | None = None  # EWMA of the first-draft accept rate
    p2_cond: float | None = None  # EWMA of the second-draft conditional accept rate
    p1_at_two: float | None = None  # p1 after the last two-draft flush (None: never ran two)
    flushes_at_one: int = 0  # one-draft flushes since the last two-draft flush

    @classmethod
    def from_env(cls, environ: Mapping[str, str], params: RungParams | None = None) -> Self:
        """A rung that reads METRALE_NO_MTP_K_LADDER once, here, from the given environment."""
        return cls(params=params or RungParams(), ladder_only=LADDER_ONLY_ENV in environ)

    def probe_due(self) -> bool:
        """Whether the next flush at one draft should run two drafts to measure p2_cond."""
        if self.flushes_at_one >= self.params.probe_backstop:
            return True
        if self.p1 is None:
            return False
        could_pay = token_ratio(self.p1, self.params.probe_p2_cond) >= self.params.enter
        risen = self.p1_at_two is None or self.p1 >= self.p1_at_two + self.params.probe_p1_rise
        return could_pay and risen

    def drafts_for(self, width: int, num_drafts: int, env: Mapping[str, str] | None = None) -> int:
        """Drafts per sequence for a step of `width` sequences with `num_drafts` MTP heads."""
        ladder = mtp_ladder_drafts(width, num_drafts)
        if (
            self.params.disabled
            or self.ladder_only
            or (env is not None and LADDER_ONLY_ENV in env)
            or num_drafts < 2
            or width not in RUNG_WIDTHS
        ):
            return ladder
        return max(ladder, 2 if self.two_drafts or self.probe_due() else 1)

    def observe(self, width: int, drafts_used: int, sequences: int, accepted: int, first_accepted: int) -> None:
        """Fold in one flush of `sequences` sequence-steps at `drafts_used` drafts (accepted counts are totals)."""
        if not (0 <= first_accepted <= accepted <= drafts_used * sequences and first_accepted <= sequences):
            raise ValueError(
                f"inconsistent flush: first_accepted={first_accepted}, accepted={accepted}, "
                f"drafts_used={drafts_used}, sequences={sequences}"
            )
        if accepted - first_accepted > first_accepted * (drafts_used - 1):  # later drafts need an accepted first
            raise ValueError(f"{accepted - first_accepted} later drafts accepted after only {first_accepted} first")
        if self.params.disabled or width not in RUNG_WIDTHS or sequences == 0 or drafts_used < 1:
            return
        p1_sample = first_accepted / sequences
        self.p1 = _ewma(self.p1, p1_sample, self.params.alpha)
        if drafts_used == 1:  # one draft says nothing of p2_cond
            self.flushes_at_one += 1
            return
        if drafts_used > 2:  # deeper drafts are not modelled
            return
        p2_sample = p2_cond_from(accepted / sequences, p1_sample)
        if p2_sample is not None:  # with no first draft accepted the flush says nothing of p2_cond
            self.p2_cond = _ewma(self.p2_cond, p2_sample, self.params.alpha)
        self.p1_at_two = self.p1
        self.flushes_at_one = 0
        if self.p2_cond is not None:
            self.two_drafts = next_state(self.two_drafts, token_ratio(self.p1, self.p2_cond), self.params)
        else:
            self.two_drafts = False
