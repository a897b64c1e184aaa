"""What a serve warns about at boot when it plans from a cost table that matched its key but may plan poorly.

A table used under its own key is never refused for these: each is a judgement the operator makes,
so each gets one line at boot saying what was found and what to do. A table narrower than the
serve's batch plans its wider steps from the widest width it measured (CostTable.cell takes the
nearest measured width outside the range); a `--quick` table is a smoke run's few short repeats;
an old table was measured under clocks, drivers and load that may have drifted since.
"""

from __future__ import annotations  # met serve's options read MAX_AGE_DAYS here: nothing else is imported then

from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from met.speculative.spec_cost import CostTable

MAX_AGE_DAYS = 30  # the cron job of a box class re-measures weekly: a month is several missed runs


def table_warnings(table: CostTable, path: Path, max_batch: int, max_age_days: int = MAX_AGE_DAYS,
                   now: datetime | None = None) -> list[str]:
    """One "warning: ..." line for each of: narrower than max_batch, a quick table, older than max_age_days
    (0: no age warning)."""
    from met.speculative.spec_cost import TableParseError, fields

    lines = []
    widest = max(table.widths)
    if widest < max_batch:
        lines.append(f"warning: {path} measured widths up to {widest} and this serve batches up to {max_batch} "
                     f"sequences: steps wider than {widest} are planned from width {widest}'s cells, extrapolated; "
                     f"measure --widths up to {max_batch} (met bench spec-cost), or pass --max-batch {widest}")
    if table.meta.get("quick") is True:
        lines.append(f"warning: {path} is a --quick table (a smoke run's few short repeats, too coarse to plan "
                     "from); measure a full one with met bench spec-cost")
    if max_age_days and "when" in table.meta:
        try:
            when = fields.measured_at(table.meta["when"])
        except TableParseError:  # a parsed table's is valid; one built by hand may not be
            return lines
        days = ((now or datetime.now(timezone.utc)) - when).total_seconds() / 86400
        if days > max_age_days:
            lines.append(f"warning: {path} was measured {int(days)} days ago ({when:%Y-%m-%d}), more than "
                         f"--table-max-age {max_age_days} days; re-measure with met bench spec-cost (its cron job "
                         "keeps it fresh)")
    return lines
