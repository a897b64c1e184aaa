"""--spec-cost-model measured's resolved state: a table and calibration that matched the serve's keys."""

from collections.abc import Sequence
from dataclasses import dataclass, field

from met.speculative.spec_cost.calibration import AcceptanceCalibration
from met.speculative.spec_cost.keys import DrafterKey, DrafterMismatch, KeyMismatchError, TableKey
from met.speculative.spec_cost.plan import (PlanDecision, PlanSeq, drafting_saving, estimate_depths, plan_depth,
                                            probe_pays, unknown)
from met.speculative.spec_cost.table import CostTable


@dataclass(frozen=True, slots=True)
class SpecCostState:
    """The table, the drafter's calibration and --spec-cost-slack, as the serve checked them at boot.

    Building one runs the key checks: it raises KeyMismatchError (listing every mismatch) unless
    `table.key.check(serve_key)` is empty and the calibration's drafter is `serve_drafter`, so a
    state cannot exist for a table or calibration measured under another key.
    """

    table: CostTable
    calibration: AcceptanceCalibration
    slack: float
    serve_key: TableKey
    serve_drafter: DrafterKey
    _savings: dict[tuple[int, int], float] = field(default_factory=dict, init=False, repr=False, compare=False)
    _prior_rates: dict[tuple[int, int], float] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        mismatches = self.table.key.check(self.serve_key)
        if self.calibration.drafter != self.serve_drafter:
            mismatches.append(DrafterMismatch("drafter", self.calibration.drafter, self.serve_drafter))
        if mismatches:
            raise KeyMismatchError(mismatches)
        if not (isinstance(self.slack, int | float) and 0.0 <= self.slack < 1.0):
            raise ValueError(f"--spec-cost-slack {self.slack!r} is not in [0, 1)")

    def plan(self, seqs: Sequence[PlanSeq], kmax: int | None = None, drafted: int = 0,
             copy_kmax: int | None = None) -> PlanDecision:
        """The draft depth for a step of these sequences at this state's slack (the rest: plan_depth's)."""
        return plan_depth(self.table, self.calibration, seqs, self.slack, kmax, drafted, copy_kmax)

    def probe_pays(self, width: int, kmax: int, behind: Sequence[int], remaining: Sequence[int]) -> list[bool]:
        """Per sequence: whether drafting's expected saving over its tokens left repays its catch-up (plan.probe_pays).

        The saving depends on the width and kmax alone: worked out once for each (a step that finds no
        probe worth it asks again on every plain step after).
        """
        saving = self._savings.get((width, kmax))
        if saving is None:
            saving = self._savings[width, kmax] = drafting_saving(self.table, self.calibration, width, kmax)
        return probe_pays(self.table, self.calibration, width, kmax, behind, remaining, saving)

    def prior_rate(self, width: int, kmax: int) -> float:
        """The most tokens/s any first plan of drafts (no copies) expects at this width when no sequence has a
        previous first draft of this drafter: the priors' best depth, nothing to catch up.

        An upper bound of plan(...).tokens_per_s for such a step: the priors are what each sequence
        expects, and a catch-up only adds to a depth's wall. Worked out once per (width, kmax).
        """
        rate = self._prior_rates.get((width, kmax))
        if rate is None:
            estimates = estimate_depths(self.table, self.calibration, unknown(width), kmax)
            rate = self._prior_rates[width, kmax] = max(e.tokens_per_s for e in estimates)
        return rate
