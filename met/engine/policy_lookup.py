"""Host drafting policy (--spec ngram | prompt-lookup): drafts copied from the sequence's history or its tenant's.

Each sequence's Proposer matches its own history (prompt + emitted); only when that has no
match does it copy from the shared lookup cache of its scope (the scheduler wires the fallback).
The depth asked is lookup_depth, clamped by capacity; prompt-lookup's adaptive window may
propose fewer, and a sequence with no match verifies no drafts (a plain row in the same step).
"""

from collections.abc import Sequence

from met.engine.policy_base import Outcome, StepPlan, clamp_depths, drafting, joined
from met.engine.requests import SeqState
from met.engine.runner import Draft, ModelRunner
from met.speculative.spec_capacity import VerifyPools


class LookupPolicy:
    """Copy drafts from history: own first, the tenant's shared cache as fallback."""

    def __init__(self, spec: str, depth: int, pools: VerifyPools, min_ngram: int = 1):
        self.name = spec
        self.depth = depth
        self.pools = pools
        self.min_ngram = min_ngram  # the shortest own-history match that proposes (the scheduler's Proposers)

    def plan(self, runner: ModelRunner, seqs: Sequence[SeqState]) -> StepPlan:
        depths, clamp = clamp_depths(self.depth, runner, seqs, self.pools)
        return StepPlan(drafting("lookup", depths), self.depth, depths, joined(self.name, clamp))

    def draft(self, runner: ModelRunner, seqs: Sequence[SeqState], plan: StepPlan) -> list[Draft]:
        return [s.proposer.host_draft(k) for s, k in zip(seqs, plan.depths)]

    def observe(self, plan: StepPlan, outcomes: Sequence[Outcome], seconds: float) -> None:
        pass  # each Proposer adapts its own window from its own outcomes
