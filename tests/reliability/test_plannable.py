"""Every table the checker accepts can be planned from: at every width and depth, no exception and finite rates.

The tables are drawn as TOML text with extreme values at and beyond the checker's bounds (1 us and an
hour of step time, 1 nJ and 10 MJ, subnormals, 1e308, date-times with +-23:59 offsets at years 1 and
9999), so what the serve boots with is what the planner, the snapshot and `met tables show` then
survive: a table the checker passes never fails a scheduler tick.
"""

import datetime as dt
import math

import tomli_w
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from met.bench.tables_cli import measured_ago
from met.speculative.snapshot import SchedulerSnapshot
from met.speculative.spec_cost import (AcceptanceCalibration, ConfidenceBin, CostTable, DrafterKey, LookupBin,
                                       PositionPrior, TableParseError)
from met.speculative.spec_cost.plan import PlanSeq, copy_depth, plan_depth

OUTSIDE = st.sampled_from([5e-324, 1e-300, 9.99e-10, 9.99e-7, 3600.0000001, 1.0000001e7, 1e308])


def _mostly(valid: st.SearchStrategy) -> st.SearchStrategy:
    """Values at the bounds or between them, and one in 20 just outside (a table of many cells is then still often
    valid, with every cost at an extreme)."""
    return st.integers(0, 19).flatmap(lambda i: OUTSIDE if i == 0 else valid)


seconds = _mostly(st.sampled_from([1e-6, 1.0000001e-6, 1e-3, 3600.0]) | st.floats(1e-6, 3600.0))
joules = _mostly(st.sampled_from([1e-9, 1e-6, 1.0, 1e7]) | st.floats(1e-9, 1e7))
offsets = st.sampled_from([dt.timedelta(0), dt.timedelta(hours=23, minutes=59), -dt.timedelta(hours=23, minutes=59)])
whens = st.builds(lambda d, off: d.replace(tzinfo=dt.timezone(off)),
                  st.sampled_from([dt.datetime(1, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59),
                                   dt.datetime(2026, 11, 30, 2, 11, 6)]), offsets)
FUZZ = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def table_texts(draw) -> str:
    """A table's TOML: 1-3 widths (from 1 to 65,536), depths 0..=kmax, maybe joules, catch-ups, copies."""
    metered = draw(st.booleans())
    widths = draw(st.lists(st.sampled_from([1, 2, 3, 16, 255, 65_536]) | st.integers(1, 65_536), min_size=1,
                           max_size=3, unique=True))
    kmax = draw(st.integers(0, 3))
    cells = []
    for n in widths:
        for k in range(kmax + 1):
            cell = {"n": n, "k": k, "verify_s": draw(seconds), "draft_s": draw(seconds) if k else 0.0}
            if metered:
                cell |= {"verify_j": draw(joules), "draft_j": draw(joules) if k else 0.0}
            if k and draw(st.booleans()):
                cell["catchup_s"] = draw(st.sampled_from([0.0, 1e-300, 3600.0]) | seconds)
            cells.append(cell)
    verify = [{"n": widths[0], "k": k, "verify_s": draw(seconds)} | ({"verify_j": draw(joules)} if metered else {})
              for k in range(kmax + 1, kmax + 1 + draw(st.integers(0, 3)))]
    doc = {"schema": 1, "key": {"box_class": "box", "recipe": "r@1", "energy_source": "rapl" if metered else "none",
                                "plan_digests": {"decode": "d"}},
           "meta": {"when": draw(whens)}, "cells": cells}
    return tomli_w.dumps(doc | ({"verify_cells": verify} if verify else {}))


def _calibrations() -> list[AcceptanceCalibration]:
    """A sure drafter, a hopeless one and one with copies: the planner's expectations at both ends."""
    key = DrafterKey("mtp", "r", "1")
    sure = AcceptanceCalibration(key, 1.0, 1000, [ConfidenceBin(0.0, 1.0, 1000)], [PositionPrior(1, 1.0, 1000)])
    never = AcceptanceCalibration(key, 0.0, 1000, [], [PositionPrior(1, 0.0, 1000)])
    copies = AcceptanceCalibration(key, 0.5, 1000, [], [PositionPrior(1, 0.5, 1000)],
                                   lookup=[LookupBin(1, 12, (1.0,) * 16, (100,) * 16)])
    return [sure, never, copies]


CALIBRATIONS = _calibrations()


def widths_of(table: CostTable) -> list[int]:
    """Every measured width, its neighbours (interpolated, and outside the range), and both ends of the range."""
    found = {1, 65_536}
    for n in table.widths:
        found |= {n - 1, n, n + 1}
    return sorted(w for w in found if 1 <= w <= 65_536)


def plan_everywhere(table: CostTable) -> None:
    for cal in CALIBRATIONS:
        for n in widths_of(table):
            seqs = [PlanSeq(confidences=(0.0, -1e308)[: table.kmax], previous=-1e308, behind=1 << 20,
                            remaining=1 << 20)]
            width = min(n, 3)  # a plan's work is per sequence: wide steps are priced by the cell, not by looping
            deepest = copy_depth(table, width)
            copy = cal.copy_accepted_by_depth(8, deepest, deepest) if cal.lookup else None
            for k in range(table.kmax + 1):
                for drafted in range(k + 1):
                    batch = (seqs * width) if drafted == 0 else [PlanSeq(confidences=(-0.5,) * drafted)] * width
                    if drafted == 0 and copy is not None:
                        batch = [s._replace(copy=copy) for s in batch]
                    d = plan_depth(table, cal, batch, 0.1, kmax=k, drafted=drafted, copy_kmax=deepest)
                    assert math.isfinite(d.tokens_per_s) and d.tokens_per_s > 0, d
                    assert d.tokens_per_j is None or (math.isfinite(d.tokens_per_j) and d.tokens_per_j > 0), d
                    joules = None if d.tokens_per_j is None else 1.0 / d.tokens_per_j
                    SchedulerSnapshot(planned_tokens_per_s=d.tokens_per_s, joules_per_token=joules)  # the tick's
            for k in range(table.kmax + 1):
                cell = table.cell(n, k)
                assert math.isfinite(cell.verify_s + cell.draft_s)


@FUZZ
@given(text=table_texts())
@example(text=tomli_w.dumps({"schema": 1, "key": {"box_class": "b", "recipe": "r@1", "energy_source": "none",
                                                  "plan_digests": {"decode": "d"}},
                             "meta": {"when": dt.datetime(1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=23,
                                                                                                   minutes=59)))},
                             "cells": [{"n": 1, "k": 0, "verify_s": 5e-324, "draft_s": 0.0}]}))
def test_every_table_the_checker_accepts_plans_at_every_width_and_depth(text):
    try:
        table = CostTable.parse(text)
    except TableParseError as exc:
        assert "\n" not in str(exc)
        return
    measured_ago(table.meta)  # the serve's boot line and `met tables show`
    plan_everywhere(table)


def test_the_costs_the_planner_cannot_divide_by_are_refused():
    # 5e-324 s once made every busy tick fail (tokens/s inf); a year-0 UTC time crashed the boot line
    base = {"schema": 1, "key": {"box_class": "b", "recipe": "r@1", "energy_source": "none",
                                 "plan_digests": {"decode": "d"}}}
    for verify_s, words in ((5e-324, "a step costs 1e-06..3600 s"), (1e308, "a step costs 1e-06..3600 s")):
        text = tomli_w.dumps(base | {"cells": [{"n": 1, "k": 0, "verify_s": verify_s, "draft_s": 0.0}]})
        try:
            CostTable.parse(text)
        except TableParseError as exc:
            assert words in str(exc)
        else:
            raise AssertionError(f"verify_s = {verify_s} was accepted")
    when = dt.datetime(1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=23, minutes=59)))
    text = tomli_w.dumps(base | {"meta": {"when": when},
                                 "cells": [{"n": 1, "k": 0, "verify_s": 0.01, "draft_s": 0.0}]})
    try:
        CostTable.parse(text)
    except TableParseError as exc:
        assert "meta.when" in str(exc) and "outside years 1..9999 in UTC" in str(exc)
    else:
        raise AssertionError("a year-0 UTC date-time was accepted")
