"""The `met tables` sub-app: check and show cost tables and calibrations.

`met tables check PATH` exits 0 when the file is a valid cost table or calibration measured
under this box's key, 65 (EX_DATAERR) when it is not valid (not UTF-8, not TOML, or a field
invalid: one line naming the field path and its value), 66 (EX_NOINPUT) when it does not exist
or cannot be read (or the recipe to compare with has no weights here), and 78 (EX_CONFIG) when
its key is not this box's and recipe's (every mismatch listed); `--no-key` checks the file alone.
PATH may be a folder: every *.toml under it is checked, and the status is the first failure's;
`--this-box tables/` checks only tables/<this box's class>/, the folder a cron job on this box keeps.
"""

import tomllib
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from met.exit_codes import EX_CONFIG, EX_DATAERR, EX_NOINPUT, EX_OK
from met.path_option import nonempty_model, nonempty_path
from met.speculative.spec_cost import AcceptanceCalibration, CostTable, DrafterMismatch, LookupBin, TableParseError
from met.speculative.spec_cost import fields
from met.speculative.spec_capacity import DEFAULT_POOLS, VerifyPools, planned_kmax
from met.speculative.spec_cost.plan import PlanSeq, copy_depth, estimate_depths, plan_depth, unknown

tables_app = typer.Typer(help="Check and show measured cost tables.", no_args_is_help=True, rich_markup_mode=None)

FileArg = Annotated[Path, typer.Argument(
    parser=nonempty_path, help="A cost table or calibration file (TOML), or a folder of them (every *.toml under it).",
    show_default=False)]
TableArg = Annotated[Path, typer.Argument(parser=nonempty_path, help="A cost table file (TOML).", show_default=False)]
CalibrationOpt = Annotated[
    Path | None,
    typer.Option("--calibration", parser=nonempty_path,
                 help="The drafter's calibration file: adds expected tokens, tok/s and tok/J."),
]
DEFAULT_RECIPE = "met-tiny-py"  # met.model.recipes.DEFAULT_RECIPE, not imported: that module needs torch
NoKeyOpt = Annotated[bool, typer.Option("--no-key", help="Check the file alone, not its key against this box.")]
RecipeOpt = Annotated[str, typer.Option(
    "--recipe", "--model", parser=nonempty_model, help="The recipe the key is compared with: an embedded recipe's "
    "name, or a Hugging Face checkpoint folder (as met bench spec-cost --model).")]
BoxClassOpt = Annotated[str | None, typer.Option(
    "--box-class", help="This box's class, if the table was measured with --box-class (default: derived).",
    show_default=False)]
DeviceOpt = Annotated[str | None, typer.Option(
    "--device", help="Device the serve would run on (default: cuda if available, else cpu).", show_default=False)]
DtypeOpt = Annotated[str | None, typer.Option(
    "--dtype", help="Dtype the serve would run in (default: the table's own, as its [meta] records it; else bfloat16 "
    "on cuda, float32 on cpu).", show_default=False)]
ThisBoxOpt = Annotated[bool, typer.Option(
    "--this-box", help="PATH is a folder of box classes' folders (as tables/): check only this box's, "
    "PATH/<box class> (--box-class, else derived), not the tables of other boxes beside it.")]
SlackOpt = Annotated[float, typer.Option("--slack", min=0.0, max=0.99, help="--spec-cost-slack the plan is shown at.")]
LiftOpt = Annotated[bool, typer.Option(
    "--lift-wide-tier", help="Plan as met serve --lift-wide-tier: widths 9..=16 verify two drafts, not one.")]


class Refusal(Exception):
    """A file this command cannot use: the exit code and the one-line message to print."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def read_text(path: Path) -> str:
    """The file's UTF-8 text; Refusal 66 if it cannot be read, 65 if it is not UTF-8."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise Refusal(EX_NOINPUT, f"{path}: no such file") from None
    except IsADirectoryError:
        raise Refusal(EX_NOINPUT, f"{path}: is a directory, not a table file") from None
    except OSError as exc:
        raise Refusal(EX_NOINPUT, f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Refusal(EX_DATAERR, f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None


def load(path: Path) -> CostTable | AcceptanceCalibration:
    """The cost table or calibration in `path` (a calibration is the file with a [drafter] table)."""
    text = read_text(path)
    try:
        doc = tomllib.loads(text)
    except Exception:  # CostTable.parse below reports the TOML error in its own words
        doc = {}
    kind = AcceptanceCalibration if "drafter" in doc else CostTable
    try:
        return kind.parse(text)
    except TableParseError as exc:
        raise Refusal(EX_DATAERR, f"{path}: {exc}") from None


def _refuse(exc: Refusal) -> typer.Exit:
    typer.echo(str(exc), err=True)
    return typer.Exit(exc.code)


@tables_app.command("check")
def check(path: FileArg, no_key: NoKeyOpt = False, recipe: RecipeOpt = DEFAULT_RECIPE, box_class: BoxClassOpt = None,
          device: DeviceOpt = None, dtype: DtypeOpt = None, this_box: ThisBoxOpt = False) -> None:
    """Validate a cost table or calibration and compare its key with this box and recipe.

    Exit 0 valid and measured under this key, 65 invalid (naming the field), 66 unreadable,
    78 measured under another key (every mismatch listed; --no-key skips the comparison).
    A folder: every *.toml under it (hidden files aside) is checked and reported, one after the
    other; the status is the first failure's in path order (66 when it holds no *.toml at all).
    --this-box: only PATH/<this box's class> is checked (66 when there is no such folder), so
    `met tables check --this-box tables/` suits a weekly cron job on every box class.
    """
    if this_box:
        try:
            path = this_box_folder(path, box_class, device)
        except Refusal as exc:
            raise _refuse(exc) from None
    if not path.is_dir():
        raise typer.Exit(_check_one(path, no_key, recipe, box_class, device, dtype))
    files = sorted(f for f in path.rglob("*.toml") if not f.name.startswith(".") and not f.is_dir())
    if not files:
        raise _refuse(Refusal(EX_NOINPUT, f"{path}: a folder with no *.toml files to check"))
    codes = [_check_one(f, no_key, recipe, box_class, device, dtype) for f in files]
    failed = [c for c in codes if c != EX_OK]
    typer.echo(f"{path}: {len(files) - len(failed)} of {len(files)} files pass")
    raise typer.Exit(failed[0] if failed else EX_OK)


def this_box_folder(root: Path, box_class: str | None, device: str | None) -> Path:
    """root/<this box's class>: the folder of tables measured on this class of box; Refusal 66 if there is none."""
    from met.engine import identity  # the derived class reads the device and CPU model through torch

    if not root.is_dir():
        raise Refusal(EX_NOINPUT, f"{root}: --this-box takes a folder of box classes' folders (e.g. tables/), and "
                      "this is no folder")
    try:
        settings = identity.resolve_run(device, None, set_threads=False)
        box = identity.box_class(settings.device, box_class, settings.threads)
    except (RuntimeError, ValueError) as exc:
        raise typer.BadParameter(str(exc)) from None
    folder = root / box
    if not folder.is_dir():
        others = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
        held = f" (it holds {', '.join(others)})" if others else ""
        raise Refusal(EX_NOINPUT, f"{root}: no folder for this box's class '{box}'{held}; measure its table with "
                      "met bench spec-cost here, or pass --box-class if this box was measured under another name")
    return folder


def _check_one(path: Path, no_key: bool, recipe: str, box_class: str | None, device: str | None,
               dtype: str | None) -> int:
    """Check one file, print its line (stdout) or its refusal (stderr); its exit status."""
    try:
        parsed = load(path)
        if not no_key:
            mismatches = key_mismatches(parsed, recipe, box_class, device, dtype)
            if mismatches:
                lines = "\n".join(f"{path}: {m}" for m in mismatches)
                raise Refusal(EX_CONFIG, f"{lines}\n{path}: measured under another key ({len(mismatches)} "
                              "mismatches); re-measure here, or pass --no-key to check the file alone")
    except Refusal as exc:
        typer.echo(str(exc), err=True)
        return exc.code
    if isinstance(parsed, CostTable):
        k = parsed.key
        typer.echo(f"{path}: valid cost table: box_class '{k.box_class}', recipe '{k.recipe}', "
                   f"energy_source '{k.energy_source}', modes {', '.join(k.modes)}; widths "
                   f"{', '.join(map(str, parsed.widths))} at depths 0..={parsed.kmax} ({len(parsed.cells)} cells)"
                   + _copies_summary(parsed))
    else:
        typer.echo(f"{path}: valid calibration for drafter {parsed.drafter}: {parsed.outcomes} outcomes, "
                   f"{len(parsed.bins)} confidence bins, {len(parsed.position_priors)} position priors, "
                   f"{len(parsed.carryover)} carry-over bins, {len(parsed.lookup)} prompt-lookup bins, "
                   f"{len(parsed.shared_lookup)} shared-lookup bins")
    return EX_OK


def _copies_summary(table: CostTable) -> str:
    """"; copies verified at k=1..16 at n=1, k=1..8 at n=2, k=1 at n=16 (25 cells)", or "" without verify cells."""
    if not table.verify_cells:
        return ""
    runs = []
    for n in table.widths:
        depths = [c.k for c in table.verify_cells if c.n == n]  # sorted by (n, k): a width's run, shallowest first
        if depths:
            runs.append(f"k={depths[0]}..{depths[-1]} at n={n}" if len(depths) > 1 else f"k={depths[0]} at n={n}")
    return f"; copies verified at {', '.join(runs)} ({len(table.verify_cells)} cells)"


def key_mismatches(parsed: CostTable | AcceptanceCalibration, recipe: str, box_class: str | None,
                   device: str | None, dtype: str | None) -> list[str]:
    """How the file's key differs from what this box would measure or serve for `recipe` (one line each)."""
    # Not at the top: the key needs torch and the recipe, and `--no-key` (and `show`) need neither.
    from met.engine import identity
    from met.model.recipes import RecipeError
    from met.model.sources import resolve

    try:
        found = resolve(recipe)  # an embedded name, or a checkpoint folder (its recipe covers weights and config.json)
    except RecipeError as exc:  # its status: 66 missing, 65 a damaged card (CheckpointError)
        raise Refusal(exc.status, f"cannot compare the key: {exc}; or pass --no-key to check the file alone") \
            from None
    if isinstance(parsed, AcceptanceCalibration):
        mine = identity.mtp_drafter_key(found)
        if parsed.drafter == mine:
            return []
        return [DrafterMismatch("drafter", parsed.drafter, mine).message()]
    try:
        measured_in = parsed.meta.get("dtype")  # a float32 table on a GPU is for a serve run with --dtype float32
        settings = identity.resolve_run(device, dtype or (measured_in if isinstance(measured_in, str) else None),
                                        set_threads=False)
        modes = [m for m in parsed.key.modes if m in identity.KNOWN_MODES]
        drafter = _dflash_config(found, settings) if "draft_dflash" in modes else None
        mine_key = identity.serve_table_key(found.id, found.config, settings, parsed.key.energy_source,
                                            modes or ["decode"], box_class, drafter)
    except (RuntimeError, ValueError) as exc:
        raise typer.BadParameter(f"cannot build this box's key: {exc}; or pass --no-key to check the file alone") \
            from None
    lines = [m.message() for m in parsed.key.check(mine_key)]
    lines += [f"mode '{m}' is not one this met runs ({', '.join(identity.KNOWN_MODES)}); re-measure with this met"
              for m in parsed.key.modes if m not in identity.KNOWN_MODES]
    return lines


def _dflash_config(recipe, settings) -> dict:
    """The config of the recipe's shipped DFlash drafter (its draft_dflash digest covers it); Refusal 66 or 65."""
    from dataclasses import asdict

    import torch

    from met.model.dflash import DrafterError, load_drafter, shipped_path

    try:
        return asdict(load_drafter(shipped_path(recipe), recipe.id, getattr(torch, settings.dtype)).cfg)
    except DrafterError as exc:
        raise Refusal(exc.status, f"cannot compare the key of a DFlash table: {exc}") from None


def measured_ago(meta: Mapping[str, object], now: datetime | None = None) -> str:
    """When [meta] says a table was measured, and how long before now; "" when it does not say.

    "measured 2026-11-30 02:11 UTC, 3 h 10 min ago": relative step costs drift with a box's load and
    clocks, so a table's age is worth seeing beside its plans (the planner itself reads no clock).
    """
    if "when" not in meta:
        return ""
    try:
        when = fields.measured_at(meta["when"])
    except TableParseError:  # a parsed table's is valid; a hand-made mapping's may not be
        return ""
    minutes = int(((now or datetime.now(timezone.utc)) - when).total_seconds() // 60)
    if minutes < 0:
        age = "in the future by this box's clock"
    elif minutes < 60:
        age = f"{minutes} min ago"
    elif minutes < 48 * 60:
        age = f"{minutes // 60} h {minutes % 60} min ago"
    else:
        age = f"{minutes // (24 * 60)} days ago"
    return f"measured {when.astimezone(timezone.utc):%Y-%m-%d %H:%M} UTC, {age}"


@tables_app.command("show")
def show(path: TableArg, calibration: CalibrationOpt = None, slack: SlackOpt = 0.1,
         lift_wide_tier: LiftOpt = False) -> None:
    """Show a cost table per width: cost per depth (the verify and draft of the drafter's cells to kmax, the verify
    of copies where measured), and with --calibration what each depth delivers and the depth met serve plans there
    (marked; its first plan, through the same function and verify-pool clamp as the serve's).

    Exit statuses: 0 shown; 2 bad option; 65 (EX_DATAERR) the file (or --calibration) is invalid, or
    is a calibration where a table belongs (or the reverse); 66 (EX_NOINPUT) a file is missing.
    """
    try:
        table = load(path)
        if not isinstance(table, CostTable):
            raise Refusal(EX_DATAERR, f"{path}: is a calibration, not a cost table; pass it with --calibration")
        cal = None if calibration is None else load(calibration)
        if cal is not None and not isinstance(cal, AcceptanceCalibration):
            raise Refusal(EX_DATAERR, f"{calibration}: is a cost table, not a calibration (it has no [drafter])")
    except Refusal as exc:
        raise _refuse(exc) from None
    console = Console()
    key = table.key
    when = measured_ago(table.meta)
    console.print(f"[bold]{escape(str(path))}[/]: box_class '{escape(key.box_class)}', recipe "
                  f"'{escape(key.recipe)}', energy_source '{key.energy_source}'" + (f"; {when}" if when else ""),
                  highlight=False)
    if cal is not None:
        source = "the position priors" if cal.position_priors else "the overall rate (no position priors)"
        console.print(f"calibration: drafter {escape(str(cal.drafter))}, {cal.outcomes} outcomes; expected tokens from "
                      f"{source}; plan: the planner's depth at slack {slack:g}", highlight=False)
        drafted_for = f"{cal.drafter.name}@{cal.drafter.digest}"
        if cal.drafter.kind == "mtp" and drafted_for != key.recipe:  # the serve refuses this pair (78)
            typer.echo(f"warning: the calibration was fitted on {drafted_for}'s MTP drafter and the table measured "
                       f"{key.recipe}; met serve refuses such a pair (exit 78), so these plans are no serve's",
                       err=True)
    pools = VerifyPools(DEFAULT_POOLS.tiers, lift_wide_tier=lift_wide_tier)  # as met serve builds them
    grids = [_lookup_table(cal), _copy_plans_table(cal, table, slack, pools)] if cal is not None and cal.lookup \
        else []
    if cal is not None and cal.lookup and cal.shared_lookup:
        grids.insert(1, _lookup_table(cal, shared=True))
    for grid in [*grids, *(_width_table(table, cal, n, slack, pools) for n in table.widths)]:
        # never narrower than its figures (a pipe is 80 columns): rich would cut "0.6667" to "0.66…" or drop a column
        need = console.measure(grid, options=console.options.update_width(1 << 12)).minimum
        Console(width=max(console.width, need)).print(grid)


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
    """One width's rows: seconds in ms, joules as measured, and what each depth delivers; beside them the verify of
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
    return _grid(title, headers, rows)
