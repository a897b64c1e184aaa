"""The measured planner across drafters: each step, the drafter whose own plan expects the most.

A serve may hold several recursive drafters (the MTP module, a draft model, an EAGLE-3 head), each
with its own cost table and calibration, each planned by its own measured planner
(policy_mtp.MtpPlannedPolicy: depth, copies, mixed steps, probes). Every step asks each planner for its plan over the same sequences and
runs the best: the most tokens/s, or, where the tables carry joules, the most tokens/J among the plans
within the slack of the fastest (the rule each planner applies to its own depths). The verify cells
of the tables are measured apart, so two tables' plain steps differ by their noise; a plan is
preferred only if it beats the best before it by more than TIE (plain decode and copies, planned the
same by every drafter, stay with the first). A step drafts with one drafter for all its sequences:
no table prices a step whose sequences draft with different drafters.

Each planner reads only its own drafter's confidences (SeqState.drafted_by): after another drafter's
step it plans from its priors, as after a plain step, and prices catching up on the rows it missed.
"""

from collections.abc import Sequence

from met.engine.policy_base import CopySettings, Outcome, StepPlan
from met.engine.policy_mtp import MtpPlannedPolicy
from met.engine.requests import SeqState
from met.engine.runner import Draft, ModelRunner

TIE = 0.01  # a later drafter's plan is chosen only when it expects over 1% more than the best before it


class DrafterChoicePolicy:
    """The measured planners of several drafters, the best plan of each step run."""

    def __init__(self, planners: Sequence[MtpPlannedPolicy]):
        if len(planners) < 2 or len({p.drafter for p in planners}) != len(planners):
            raise ValueError(f"a choice needs two drafters or more, each once; got {[p.drafter for p in planners]}")
        self.planners = list(planners)
        self.name = "+".join(p.drafter for p in planners) + "/measured"
        copies = [p.copies for p in planners]
        self.copies = CopySettings(copy_ngram=max(c.copy_ngram for c in copies),
                                   shared_ngram=max(c.shared_ngram for c in copies))
        self._chosen = self.planners[0]  # whose plan the step being run is

    def plan(self, runner: ModelRunner, seqs: Sequence[SeqState]) -> StepPlan:
        plans = [p.plan(runner, seqs) for p in self.planners]
        best = _best([p.decision for p in plans])
        self._chosen = self.planners[best]
        plan = plans[best]
        return StepPlan(plan.mode, plan.depth, plan.depths, f"{self._chosen.drafter}: {plan.why}",
                        plan.decision, plan.table, plan.shared)

    def draft(self, runner: ModelRunner, seqs: Sequence[SeqState], plan: StepPlan) -> list[Draft]:
        return self._chosen.draft(runner, seqs, plan)

    def observe(self, plan: StepPlan, outcomes: Sequence[Outcome], seconds: float) -> None:
        pass  # each planner is pure: its table and calibration are fixed for the life of the serve


def _best(decisions: Sequence) -> int:
    """The index of the decision to run: the most tokens/s, or tokens/J within the slack of the fastest."""
    if any(d.tokens_per_j is None for d in decisions):
        scores = [d.tokens_per_s for d in decisions]
    else:
        floor = (1.0 - decisions[0].slack) * max(d.tokens_per_s for d in decisions)
        scores = [d.tokens_per_j if d.tokens_per_s >= floor else 0.0 for d in decisions]
    best = 0
    for i, score in enumerate(scores):
        if score > scores[best] * (1.0 + TIE):
            best = i
    return best
