"""The drafting-policy interface: a step plan, a step's outcome, the capacity clamp, and the plain policy.

A policy plans a step for the running sequences (mode, depth before clamps, why), drafts, and
observes the outcome. Every policy's depth goes through `clamp_depths`: the verify pools of the
width tier and each slot's KV room (spec_capacity), and the request's remaining tokens (a draft
past max_tokens could never be emitted). A policy declares what the scheduler must index for its
copies (CopySettings), so that a policy wrapping another passes them on as it passes on its name.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from met.engine.requests import SeqState
from met.engine.runner import Draft, ModelRunner
from met.speculative.spec_capacity import DEFAULT_POOLS, VerifyPools, clamp_drafts_to_rooms, kv_room
from met.speculative.spec_cost import CostTable
from met.speculative.spec_cost.plan import PlanDecision


@dataclass(frozen=True, slots=True)
class StepPlan:
    """One tick's decision: the mode, the planned depth, each sequence's depth after clamps, and why."""

    mode: str  # "plain", "mtp", "lookup" or "dflash"
    depth: int  # drafts per sequence the policy asked for, before the capacity clamp
    depths: tuple[int, ...]  # per running sequence, after clamps (0: a plain decode row)
    why: str  # e.g. "ladder", "rung:two", "gate:plain", "plan k=2 ...", with ", clamp:pool" when clamped
    decision: PlanDecision | None = None  # the measured planner's figures (--spec-cost-model measured)
    table: CostTable | None = None  # prices the step as it ran (the measured planner's table; None: not priced)
    shared: int = 0  # sequences whose drafts are copies from other requests (the measured planner's shared copies)


@dataclass(frozen=True, slots=True)
class CopySettings:
    """What the scheduler indexes for a policy's copies: each request's own history and the shared lookup cache.

    A host-drafting policy (--spec ngram | prompt-lookup) sets min_ngram; a model-drafting policy
    that weighs copies against its drafts (the measured planner, fixed copies) sets copy_ngram, and
    shared_ngram where it copies from the tenant's other requests too. The default copies nothing.
    """

    min_ngram: int = 1  # host drafting: the shortest suffix match that proposes, own history and shared cache alike
    copy_ngram: int = 0  # copies beside model drafts: index each history for suffixes of 1..copy_ngram tokens (0: none)
    shared_ngram: int = 0  # and the shared cache for matches up to this long from other requests (0: none)

    def __post_init__(self) -> None:
        if self.min_ngram < 1:
            raise ValueError(f"min_ngram {self.min_ngram} must be at least 1")
        if self.copy_ngram < 0 or self.shared_ngram < 0:
            raise ValueError(f"copy_ngram {self.copy_ngram} and shared_ngram {self.shared_ngram} must be at least 0")
        if self.shared_ngram and not self.copy_ngram:
            raise ValueError("shared_ngram needs copy_ngram: copies from other requests are weighed beside own copies")


NO_COPIES = CopySettings()


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one sequence got from the step: drafts verified, accepted, and tokens emitted (bonus included)."""

    proposed: int
    accepted: int
    emitted: int


class Policy(Protocol):
    """A drafting policy: plan a step, draft for it, observe its outcome."""

    name: str  # "off", "mtp", "ngram", ...: the scheduler gives host modes (proposer.HOST_MODES) host proposers
    copies: CopySettings  # what the scheduler indexes for this policy's copies (NO_COPIES: nothing)

    def plan(self, runner: ModelRunner, seqs: Sequence[SeqState]) -> StepPlan: ...

    def draft(self, runner: ModelRunner, seqs: Sequence[SeqState], plan: StepPlan) -> list[Draft]: ...

    def observe(self, plan: StepPlan, outcomes: Sequence[Outcome], seconds: float) -> None: ...


def clamp_depths(depth: int, runner: ModelRunner, seqs: Sequence[SeqState],
                 pools: VerifyPools = DEFAULT_POOLS) -> tuple[tuple[int, ...], str]:
    """Per sequence, depth clamped to slot capacity and remaining tokens; and every clamp that cut it ("" if none).

    The reasons, in the order they apply: "clamp:pool" (the width tier's verify pool holds fewer),
    "clamp:kv" (a sequence's KV room holds fewer still), "clamp:remaining" (a sequence has fewer
    tokens left to generate), joined by ", ".
    """
    return Rooms.read(runner, seqs).clamp(depth, pools)


@dataclass(frozen=True, slots=True)
class Rooms:
    """Each running sequence's KV room and tokens left, read once for every depth a plan clamps (the measured
    planner clamps three: its depth, its copies', the one it chose)."""

    kv: tuple[int, ...]  # drafts each slot's KV cache has room to verify (spec_capacity.kv_room)
    left: tuple[int, ...]  # tokens each request may still receive, less the bonus: the most drafts it can emit

    @classmethod
    def read(cls, runner: ModelRunner, seqs: Sequence[SeqState]) -> "Rooms":
        max_len = runner.max_len
        return cls(tuple(kv_room(runner.length(s.slot), max_len) for s in seqs),
                   tuple(s.remaining - 1 for s in seqs))

    def clamp(self, depth: int, pools: VerifyPools = DEFAULT_POOLS) -> tuple[tuple[int, ...], str]:
        """clamp_depths' depths and reasons for `depth` over these sequences."""
        if not self.kv:
            return (), ""
        capped = clamp_drafts_to_rooms(depth, self.kv, pools)
        pool = min(depth, pools.max_drafts(len(self.kv)))
        final = tuple(c if c <= left else max(0, left) for c, left in zip(capped, self.left))
        reasons = ("clamp:pool" if pool < depth else "", "clamp:kv" if min(capped) < pool else "",
                   "clamp:remaining" if final != tuple(capped) else "")
        return final, ", ".join(r for r in reasons if r)


def drafter_width(drafts: Sequence[Draft]) -> int:
    """How many sequences a step's drafter drafted for: drafts with confidences (copies and plain rows have
    none), the width a step's draft is priced at (CostTable.step_joules' draft_width)."""
    return sum(bool(d.confidences) for d in drafts)


def drafting(mode: str, depths: Sequence[int]) -> str:
    """The step's mode, or "plain" when the clamps left no sequence a draft (no draft is made or verified)."""
    return mode if any(depths) else "plain"


def joined(why: str, clamp: str) -> str:
    """A reason with the clamp's appended."""
    return f"{why}, {clamp}" if clamp else why


class PlainPolicy:
    """--spec off: one token per sequence per step, no drafts."""

    name = "off"
    copies = NO_COPIES

    def plan(self, runner: ModelRunner, seqs: Sequence[SeqState]) -> StepPlan:
        return StepPlan("plain", 0, (0,) * len(seqs), "spec off")

    def draft(self, runner: ModelRunner, seqs: Sequence[SeqState], plan: StepPlan) -> list[Draft]:
        return [Draft([], []) for _ in seqs]

    def observe(self, plan: StepPlan, outcomes: Sequence[Outcome], seconds: float) -> None:
        pass
