"""Block-drafter policy: the DFlash rung sets the verify width K of a drafter that proposes a block per forward.

A block drafter (DFlash-style) costs one forward whatever the block, so the depth is the
rung's gamma: by concurrency tier for wide steps, by the first-draft accept rate for a single
stream; then the drafter's block (it proposes at most that many: "clamp:block") and the capacity
clamp. Its verify pools are the rung's own (dflash_rung.verify_pools), not the MTP drafter's
defaults, which would cut the rung's single-stream 8, 12 and 16 to 4. The drafter is any callable
with the BlockDrafter shape: `met serve --spec dflash` passes RunnerDflash, the runner's own DFlash
drafter (met/model/dflash.py).
"""

from collections.abc import Sequence
from typing import Protocol

from met.engine.policy_base import NO_COPIES, Outcome, StepPlan, clamp_depths, drafting, joined
from met.engine.requests import SeqState
from met.engine.runner import Draft, ModelRunner
from met.speculative.dflash_rung import DflashRung, verify_pools
from met.speculative.spec_capacity import VerifyPools


class BlockDrafter(Protocol):
    """Drafts up to depths[i] tokens for each slot in one forward."""

    block: int  # the block size the drafter was trained with: the most drafts it proposes

    def __call__(self, runner: ModelRunner, slots: list[int], depths: list[int]) -> list[Draft]: ...


class RunnerDflash:
    """The runner's own DFlash drafter (ModelRunner(..., dflash=drafter)) as a BlockDrafter."""

    def __init__(self, block: int):
        self.block = block

    def __call__(self, runner: ModelRunner, slots: list[int], depths: list[int]) -> list[Draft]:
        return runner.draft_dflash(slots, depths)


class DflashPolicy:
    """rung gamma -> clamp -> one block draft -> verify; the rung observes single-stream acceptance."""

    name = "dflash"
    copies = NO_COPIES

    def __init__(self, drafter: BlockDrafter, pools: VerifyPools | None = None, rung: DflashRung | None = None):
        self.drafter = drafter
        self.rung = rung if rung is not None else DflashRung()
        # None: the pools the rung's tiers need for this drafter's block
        self.pools = pools if pools is not None else verify_pools(self.rung.params, drafter.block)

    def plan(self, runner: ModelRunner, seqs: Sequence[SeqState]) -> StepPlan:
        gamma = self.rung.gamma_for(len(seqs))  # the rung's choice, reported as the step's depth
        asked = min(gamma, self.drafter.block)  # a drafter proposes at most its trained block
        depths, clamp = clamp_depths(asked, runner, seqs, self.pools)
        why = joined(f"dflash:{'single' if len(seqs) == 1 else 'tier'}", "clamp:block" if asked < gamma else "")
        return StepPlan(drafting("dflash", depths), gamma, depths, joined(why, clamp))

    def draft(self, runner: ModelRunner, seqs: Sequence[SeqState], plan: StepPlan) -> list[Draft]:
        if not any(plan.depths):
            return [Draft([], []) for _ in seqs]
        return self.drafter(runner, [s.slot for s in seqs], list(plan.depths))

    def observe(self, plan: StepPlan, outcomes: Sequence[Outcome], seconds: float) -> None:
        drafted = [o for o in outcomes if o.proposed > 0]
        self.rung.observe(len(outcomes), len(drafted), sum(o.accepted > 0 for o in drafted))
