"""`met tables show`'s view of a cost table: a grid per width, and with a calibration what each depth delivers.

Rendered with rich; imported by the command when it runs, so `met --help` and `met tables check`
do not load rich. The plan each width's grid marks is the serve's, through the same function and
clamps (plan_depth at spec_capacity.planned_kmax).
"""

from pathlib import Path

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from met.speculative.spec_capacity import DEFAULT_POOLS, VerifyPools, planned_kmax
from met.speculative.spec_cost import AcceptanceCalibration, CostTable, LookupBin
from met.speculative.spec_cost.plan import PlanSeq, copy_depth, estimate_depths, plan_depth, unknown


def render(path: Path, table: CostTable, cal: AcceptanceCalibration | None, slack: float, lift_wide_tier: bool,
           when: str = "") -> None:
    """Print the table's header line (with `when` it was measured), the calibration's lookup grids (if it has
    bins) and each width's grid."""
    console = Console()
    key = table.key
    kind, drafter = table_drafter(table)
    words = {"draft": "draft model", "eagle": "EAGLE-3 head"}
    drafted = f", {words[kind]} '{escape(drafter)}'" if kind in words else ""
    console.print(f"[bold]{escape(str(path))}[/]: box_class '{escape(key.box_class)}', recipe "
                  f"'{escape(key.recipe)}'{drafted}, energy_source '{key.energy_source}'"
                  + (f"; {when}" if when else ""), highlight=False)
    if cal is not None:
        source = "the position priors" if cal.position_priors else "the overall rate (no position priors)"
        console.print(f"calibration: drafter {escape(str(cal.drafter))}, {cal.outcomes} outcomes; expected tokens from "
                      f"{source}; plan: the planner's depth at slack {slack:g}", highlight=False)
        drafted_for = f"{cal.drafter.name}@{cal.drafter.digest}"
        expected = (kind, drafter) if kind is not None else ("mtp", key.recipe)  # plain decode alone: the recipe's
        if (cal.drafter.kind, drafted_for) != expected:  # the serve refuses this pair (78)
            typer.echo(f"warning: the calibration was fitted on {_drafter_words(cal.drafter.kind, drafted_for)} and "
                       f"the table measured {_drafter_words(*expected)}; met serve refuses such a pair (exit 78), "
                       "so these plans are no serve's", err=True)
    pools = VerifyPools(DEFAULT_POOLS.tiers, lift_wide_tier=lift_wide_tier)  # as met serve builds them
    grids = [_lookup_table(cal), _copy_plans_table(cal, table, slack, pools)] if cal is not None and cal.lookup \
        else []
    if cal is not None and cal.lookup and cal.shared_lookup:
        grids.insert(1, _lookup_table(cal, shared=True))
    plain = len(table.widths) > MANY_WIDTHS
    for grid in [*grids, *([] if plain else (_width_table(table, cal, n, slack, pools) for n in table.widths))]:
        # never narrower than its figures (a pipe is 80 columns): rich would cut "0.6667" to "0.66…" or drop a column
        need = console.measure(grid, options=console.options.update_width(1 << 12)).minimum
        Console(width=max(console.width, need)).print(grid)
    if plain:  # rich lays out a grid in ~10 ms: 30,000 widths would take minutes, plain text takes a second
        typer.echo("\n\n".join(_plain(*_width_rows(table, cal, n, slack, pools)) for n in table.widths))


MANY_WIDTHS = 64  # past this many widths, each width's grid is written as plain text


def table_drafter(table: CostTable) -> tuple[str | None, str]:
    """Whose draft step the table measured, as a calibration's drafter key says it: ("mtp", the recipe's id),
    ("draft", the draft model's id, from its [meta]), ("eagle", the EAGLE-3 head's id, likewise) or ("dflash", the
    recipe's id); (None, "") for plain decode alone."""
    modes = table.key.modes
    for kind, mode, field in (("draft", "draft_model", "draft_model"), ("eagle", "draft_eagle", "eagle_head")):
        if mode in modes:
            named = table.meta.get(field)
            return kind, named if isinstance(named, str) else "(unnamed)"
    if "draft_dflash" in modes:
        return "dflash", table.key.recipe
    return ("mtp", table.key.recipe) if "draft_mtp" in modes else (None, "")


def _drafter_words(kind: str, name: str) -> str:
    """"met-tiny-py@62d4's MTP drafter", "the draft model met-tiny-py-draft@1a2b's drafts"."""
    if kind == "draft":
        return f"the draft model {name}'s drafts"
    if kind == "eagle":
        return f"the EAGLE-3 head {name}'s drafts"
    return f"{name}'s {'DFlash' if kind == 'dflash' else 'MTP'} drafter"


def _plain(title: str, headers: list[str], rows: list[list[str]]) -> str:
    """The grid _grid would draw, as plain right-justified text: its title, headers, a rule and its rows."""
    sizes = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, sizes)).rstrip()  # noqa: E731
    return "\n".join([title, line(headers), "  ".join("-" * w for w in sizes), *map(line, rows)])


def _lookup_table(cal: AcceptanceCalibration, shared: bool = False) -> Table:
    """Prompt lookup's bins: a copy's accept rate at each position (given the ones before it), by match length.

    shared: the bins of copies from other requests (the shared lookup cache), else from the history.
    """
    bins = cal.shared_lookup if shared else cal.lookup
    rows = []
    shown = max(len(b.p_accept) for b in bins)  # every position: the planner copies up to 16 deep
    for b in bins:
        rates = [f"{p:.2f}" for p in b.p_accept[:shown]] + ["-"] * (shown - min(len(b.p_accept), shown))
        rows.append([_match(b), str(b.outcomes[0]), *rates])
    title = ("copies from other requests, where their match is longer than the history's own (the shared lookup "
             "cache)" if shared else "prompt-lookup copies (the planner weighs them against drafting)")
    return _grid(title, ["match", "copies", *(f"p{j}" for j in range(1, shown + 1))], rows)


def _copy_plans_table(cal: AcceptanceCalibration, table: CostTable, slack: float, pools: VerifyPools) -> Table:
    """At each width, the plan when every request's copy follows a match of a bin (copies as deep as the planner
    copies there: the table's verify depth and COPY_POOLS; drafts expected from the position priors)."""
    rows = []
    for b in cal.lookup:
        plans = []
        for n in table.widths:
            deepest = copy_depth(table, n)
            copy = cal.copy_accepted_by_depth(b.min_match, deepest, deepest)
            plans.append(plan_depth(table, cal, [PlanSeq(copy=copy)] * n, slack, kmax=_kmax(table, n, pools),
                                    copy_kmax=deepest))
        rows.append([_match(b), *(f"copy k={d.k}" if d.source == "lookup" else f"k={d.k}" for d in plans)])
    title = (f"plan when every request's copy follows such a match (slack {slack:g}; copies as deep as the "
             "planner's, drafts within the verify pools, as a serve's)")
    return _grid(title, ["match", *(f"n = {n}" for n in table.widths)], rows)


def _match(b: LookupBin) -> str:
    """A bin's match lengths: "3" or "8-11"."""
    return str(b.min_match) if b.min_match == b.max_match else f"{b.min_match}-{b.max_match}"


def _grid(title: str, headers: list[str], rows: list[list[str]]) -> Table:
    """A right-justified table whose columns are never narrower than their figures or their headers' words."""
    grid = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    for i, header in enumerate(headers):  # a narrow terminal wraps the headers, never the figures
        grid.add_column(header, justify="right", min_width=max(*map(len, header.split()), *(len(r[i]) for r in rows)))
    for row in rows:
        grid.add_row(*row)
    return grid


def _kmax(table: CostTable, n: int, pools: VerifyPools) -> int:
    """The deepest a serve plans at width n (planned_kmax, as its policy takes it); the drafter is taken to draft as
    deep as the table measured, as the embedded recipe's does."""
    return planned_kmax(n, table.kmax, table.kmax, pools)


def _width_table(table: CostTable, cal: AcceptanceCalibration | None, n: int, slack: float,
                 pools: VerifyPools = DEFAULT_POOLS) -> Table:
    """One width's grid (_width_rows)."""
    return _grid(*_width_rows(table, cal, n, slack, pools))


def _width_rows(table: CostTable, cal: AcceptanceCalibration | None, n: int, slack: float,
                pools: VerifyPools = DEFAULT_POOLS) -> tuple[str, list[str], list[list[str]]]:
    """One width's title, headers and rows: seconds in ms, joules as measured, and what each depth delivers; beside them the verify of
    copies where the table measured it (past kmax, alone: nothing drafted there, nothing planned).

    One rule for every row: the drafter's cell (verify, draft) to kmax, the copy verify cell where there is one,
    "-" where there is none (a copy there is priced at the cell's verify ms).
    """
    copies = {c.k: c for c in table.verify_cells if c.n == n}
    deepest = max([table.kmax, *copies])
    catchups = any(table.cell(n, k).catchup_s is not None for k in range(1, table.kmax + 1))
    headers = ["k", "verify ms", "draft ms"] + (["catch-up us/row"] if catchups else [])
    headers += ["copy verify ms"] if copies else []
    headers += ["verify J", "draft J"] + (["copy J"] if copies else []) if table.has_energy else []
    if cal is not None:
        headers += ["E tokens", "tok/s"] + (["tok/J"] if table.has_energy else []) + ["plan"]
    estimates = estimate_depths(table, cal, unknown(n)) if cal is not None else []
    kmax = _kmax(table, n, pools)
    # the serve's plan, clamps included (its banner's first plan: SpecCostState.plan at the policy's kmax)
    chosen = plan_depth(table, cal, unknown(n), slack, kmax=kmax).k if cal is not None else None
    rows = []
    for k in range(deepest + 1):
        cell, copy = table.cell(n, k) if k <= table.kmax else None, copies.get(k)
        row = [str(k), *(["-", "-"] if cell is None else [f"{cell.verify_s * 1e3:.4g}", f"{cell.draft_s * 1e3:.4g}"])]
        if catchups:
            row.append("-" if cell is None or cell.catchup_s is None else f"{cell.catchup_s * 1e6:.4g}")
        if copies:
            row.append("-" if copy is None else f"{copy.verify_s * 1e3:.4g}")
        if table.has_energy:
            row += ["-", "-"] if cell is None else [f"{cell.verify_j:.4g}", f"{cell.draft_j:.4g}"]
            row += ["-" if copy is None else f"{copy.verify_j:.4g}"] if copies else []
        if estimates and cell is not None:
            e = estimates[k]
            row += [f"{e.expected_tokens:.3f}", f"{e.tokens_per_s:.4g}"]
            row += [f"{e.tokens_per_j:.4g}"] if table.has_energy else []
            row.append("◀" if k == chosen else "")
        rows.append(row + ["-"] * (len(headers) - len(row)))
    title = f"width n = {n}" + (f", copies priced to k = {deepest}" if copies else "")
    if cal is not None and kmax < table.kmax:  # the rows past it are what the pool forgoes, never planned
        title += f"; the verify pool holds k <= {kmax}"
    return title, headers, rows
