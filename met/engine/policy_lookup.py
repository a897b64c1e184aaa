"""Host drafting policy (--spec ngram | prompt-lookup): drafts copied from the sequence's history or its tenant's.

Each sequence's Proposer matches its own history (prompt + emitted); only when that has no
match does it copy from the shared lookup cache of its scope (the scheduler wires the fallback).
The depth asked is lookup_depth, clamped by capacity; prompt-lookup's adaptive window may
propose fewer, and a sequence with no match verifies no drafts (a plain row in the same step).

Fixed copies (`met bench spec-cost`'s copy verify cells): every step verifies exactly the
clamped depth of copies per sequence, its own history's matched copy (as the measured planner
weighs it), cycled, else its last tokens: what verifying copies that deep costs in a running decode.
"""

from collections.abc import Sequence

from met.engine.policy_base import CopySettings, Outcome, StepPlan, clamp_depths, drafting, joined
from met.engine.proposer import Proposer
from met.engine.requests import SeqState
from met.engine.runner import Draft, ModelRunner
from met.speculative.spec_capacity import VerifyPools
from met.speculative.spec_cost.lookup import LOOKUP_MAX_NGRAM


class LookupPolicy:
    """Copy drafts from history: own first, the tenant's shared cache as fallback."""

    def __init__(self, spec: str, depth: int, pools: VerifyPools, min_ngram: int = 1):
        self.name = spec
        self.depth = depth
        self.pools = pools
        self.copies = CopySettings(min_ngram=min_ngram)  # the shortest match that proposes (the scheduler's Proposers)

    def plan(self, runner: ModelRunner, seqs: Sequence[SeqState]) -> StepPlan:
        depths, clamp = clamp_depths(self.depth, runner, seqs, self.pools)
        return StepPlan(drafting("lookup", depths), self.depth, depths, joined(self.name, clamp))

    def draft(self, runner: ModelRunner, seqs: Sequence[SeqState], plan: StepPlan) -> list[Draft]:
        return [s.proposer.host_draft(k) for s, k in zip(seqs, plan.depths)]

    def observe(self, plan: StepPlan, outcomes: Sequence[Outcome], seconds: float) -> None:
        pass  # each Proposer adapts its own window from its own outcomes


def fixed_copy(proposer: Proposer, depth: int) -> list[int]:
    """Exactly `depth` tokens copied from the history: its matched copy (cyclic), else its last tokens, cycled.

    Example: history [1, 2, 3] has no recurring suffix: at depth 5 the copy is [1, 2, 3, 1, 2].
    """
    if depth <= 0:
        return []
    source = proposer.matched_copy(depth)[1] or proposer.history[-depth:]
    return [source[j % len(source)] for j in range(depth)]


class CopyFixedPolicy:
    """Copies at one depth every step -> clamp, no drafter pass, no confidences: the verify of copies, timed."""

    def __init__(self, depth: int, pools: VerifyPools):
        if depth < 1:
            raise ValueError(f"fixed copy depth {depth} must be at least 1")
        self.name = f"copy/fixed-{depth}"  # not a host mode: the scheduler gives it Proposers over an index
        self.depth = depth
        self.pools = pools
        self.copies = CopySettings(copy_ngram=LOOKUP_MAX_NGRAM)  # histories indexed, as for the planner's copies

    def plan(self, runner: ModelRunner, seqs: Sequence[SeqState]) -> StepPlan:
        depths, clamp = clamp_depths(self.depth, runner, seqs, self.pools)
        return StepPlan(drafting("lookup", depths), self.depth, depths, joined(f"copy k={self.depth}", clamp))

    def draft(self, runner: ModelRunner, seqs: Sequence[SeqState], plan: StepPlan) -> list[Draft]:
        return [Draft(fixed_copy(s.proposer, k), []) for s, k in zip(seqs, plan.depths)]

    def observe(self, plan: StepPlan, outcomes: Sequence[Outcome], seconds: float) -> None:
        pass  # fixed: nothing to learn
