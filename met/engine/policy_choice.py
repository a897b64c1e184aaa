"""The measured planner across drafters: each step, the drafter whose own plan expects the most.

A serve may hold several recursive drafters (the MTP module, a draft model, an EAGLE-3 head), each
with its own cost table and calibration, each planned by its own measured planner
(policy_mtp.MtpPlannedPolicy: depth, copies, mixed steps, probes). Every step asks each planner for
its plan over the same sequences and runs the best: the most tokens/s, or, where the tables carry
joules, the most tokens/J among the plans within the slack of the fastest (the rule each planner
applies to its own depths). The verify cells of the tables are measured apart, so two tables' plain
steps differ by their noise; a plan is preferred only if it beats the best before it by more than
TIE (plain decode, planned the same by every drafter, stays with the first). A step drafts with one
drafter for all its sequences: no table prices a step whose sequences draft with different drafters.

Copies from the history and the shared cache cost a verify alone, the same under every drafter's
table but for its noise, so one planner weighs them: the first whose calibration prices copies
(with its mixed steps of copies and its own drafts); the others plan drafts and plain decode.

Each planner reads only its own drafter's confidences (SeqState.drafted_by): after another drafter's
step it plans from its priors, as after a plain step, and prices catching up on the rows it missed.
Such a plan cannot expect more than the priors' best depth with nothing to catch up
(MtpPlannedPolicy.prior_rate, worked out once per width), so where the choice goes by tokens/s and
that bound does not beat the best plan before it by TIE, the planner is not asked: its plan could not
be chosen. A drafter that costs more per draft and is accepted less (a draft model beside a cheaper
MTP module) then costs the choice one comparison a step. A planner not asked does not count the step
towards its probes.
"""

from collections.abc import Sequence

from met.engine.policy_base import NO_COPIES, Outcome, StepPlan
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
        self._copier = next((p for p in self.planners if p.copies.copy_ngram), None)  # the planner that weighs copies
        self.copies = self._copier.copies if self._copier is not None else NO_COPIES
        self._by_rate = not all(p.state.table.has_energy for p in self.planners)  # tokens/s alone decides
        self._chosen = self.planners[0]  # whose plan the step being run is

    def plan(self, runner: ModelRunner, seqs: Sequence[SeqState]) -> StepPlan:
        width = len(seqs)
        planned: list[tuple[MtpPlannedPolicy, StepPlan]] = []
        for planner in self.planners:
            if planned and self._by_rate and planner is not self._copier and planner.unconfident(seqs):
                leader = planned[_best([p.decision for _, p in planned], True)][1].decision
                if planner.prior_rate(width) <= leader.tokens_per_s * (1.0 + TIE):
                    continue  # the scan below would not choose it over the leader, whatever it planned
            planned.append((planner, planner.plan(runner, seqs, weigh_copies=planner is self._copier)))
        self._chosen, plan = planned[_best([p.decision for _, p in planned], self._by_rate)]
        return StepPlan(plan.mode, plan.depth, plan.depths, f"{self._chosen.drafter}: {plan.why}",
                        plan.decision, plan.table, plan.shared)

    def draft(self, runner: ModelRunner, seqs: Sequence[SeqState], plan: StepPlan) -> list[Draft]:
        return self._chosen.draft(runner, seqs, plan)

    def observe(self, plan: StepPlan, outcomes: Sequence[Outcome], seconds: float) -> None:
        pass  # each planner is pure: its table and calibration are fixed for the life of the serve


def _best(decisions: Sequence, by_rate: bool) -> int:
    """The index of the decision to run: the most tokens/s (by_rate, or where one has no joules), or tokens/J
    within the slack of the fastest."""
    if by_rate or any(d.tokens_per_j is None for d in decisions):
        scores = [d.tokens_per_s for d in decisions]
    else:
        floor = (1.0 - decisions[0].slack) * max(d.tokens_per_s for d in decisions)
        scores = [d.tokens_per_j if d.tokens_per_s >= floor else 0.0 for d in decisions]
    best = 0
    for i, score in enumerate(scores):
        if score > scores[best] * (1.0 + TIE):
            best = i
    return best
