"""The measured speculative-cost table, its keys, the drafter's acceptance calibration, and the planner.

What a verify step and a draft step cost, in wall time and energy, at each batch width and draft
depth, on one box class for one recipe; and how likely the drafter's drafts are to be accepted.
`met bench spec-cost` measures both and writes them; the serve loads them and plans draft depth
from them (`plan.plan_depth`). Pure: parsing and arithmetic only, no I/O, no clock, no torch.

Invariants:
- A table is used only under the key it was measured under (TableKey.check), a calibration only
  for the drafter it was fitted on (DrafterKey); a mismatch is refused, never approximated.
- A parsed table has, for every width, a cell at every depth 0..=kmax, all with finite positive
  costs (CostTable.parse), and optionally verify cells (a width's run from k = 1, or kmax + 1, to
  its deepest: what verifying copies costs, past kmax too); parse raises only TableParseError, whatever the text.
- Costs between measured widths are linear in width; outside the range, the nearest width's.
"""

from met.speculative.spec_cost.calibration import (
    MIN_OUTCOMES,
    AcceptanceCalibration,
    CarryBin,
    ConfidenceBin,
    PositionPrior,
)
from met.speculative.spec_cost.lookup import LookupBin
from met.speculative.spec_cost.errors import SpecCostError, TableParseError
from met.speculative.spec_cost.keys import (
    ENERGY_SOURCES,
    SCHEMA,
    BoxClassMismatch,
    DrafterKey,
    DrafterMismatch,
    EnergySourceMismatch,
    KeyMismatch,
    KeyMismatchError,
    ModeNotMeasured,
    PlanDigestMismatch,
    RecipeMismatch,
    SchemaMismatch,
    TableKey,
)
from met.speculative.spec_cost.state import SpecCostState
from met.speculative.spec_cost.table import MAX_DEPTH, MAX_WIDTH, Cell, CostTable, VerifyCell

__all__ = [
    "ENERGY_SOURCES", "MAX_DEPTH", "MAX_WIDTH", "MIN_OUTCOMES", "SCHEMA",
    "AcceptanceCalibration", "BoxClassMismatch", "CarryBin", "Cell", "ConfidenceBin", "CostTable", "DrafterKey",
    "DrafterMismatch", "EnergySourceMismatch", "KeyMismatch", "KeyMismatchError", "LookupBin", "ModeNotMeasured",
    "PlanDigestMismatch", "PositionPrior", "RecipeMismatch", "SchemaMismatch", "SpecCostError",
    "SpecCostState", "TableKey", "TableParseError", "VerifyCell",
]
