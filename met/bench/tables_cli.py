"""The `met tables` sub-app: check and show cost tables and calibrations.

`met tables check PATH` exits 0 when the file is a valid cost table or calibration, 65
(EX_DATAERR) when it is not (not UTF-8, not TOML, or a field invalid: one line naming the
field path and its value), and 66 (EX_NOINPUT) when it does not exist or cannot be read.
"""

import tomllib
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from met.exit_codes import EX_DATAERR, EX_NOINPUT, EX_OK
from met.speculative.spec_cost import AcceptanceCalibration, CostTable, TableParseError
from met.speculative.spec_cost.plan import choose, estimate_depths

tables_app = typer.Typer(help="Check and show measured cost tables.", no_args_is_help=True)

FileArg = Annotated[Path, typer.Argument(help="A cost table or calibration file (TOML).", show_default=False)]
TableArg = Annotated[Path, typer.Argument(help="A cost table file (TOML).", show_default=False)]
CalibrationOpt = Annotated[
    Path | None,
    typer.Option("--calibration", help="The drafter's calibration file: adds expected tokens, tok/s and tok/J."),
]
SlackOpt = Annotated[float, typer.Option("--slack", min=0.0, max=0.99, help="--spec-cost-slack the plan is shown at.")]


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
def check(path: FileArg) -> None:
    """Validate a cost table or calibration: exit 0 valid, 65 invalid (naming the field), 66 unreadable."""
    try:
        parsed = load(path)
    except Refusal as exc:
        raise _refuse(exc) from None
    if isinstance(parsed, CostTable):
        k = parsed.key
        typer.echo(f"{path}: valid cost table: box_class '{k.box_class}', recipe '{k.recipe}', "
                   f"energy_source '{k.energy_source}', modes {', '.join(k.modes)}; widths "
                   f"{', '.join(map(str, parsed.widths))} at depths 0..={parsed.kmax} ({len(parsed.cells)} cells)")
    else:
        typer.echo(f"{path}: valid calibration for drafter {parsed.drafter}: {parsed.outcomes} outcomes, "
                   f"{len(parsed.bins)} confidence bins, {len(parsed.position_priors)} position priors")
    raise typer.Exit(EX_OK)


@tables_app.command("show")
def show(path: TableArg, calibration: CalibrationOpt = None, slack: SlackOpt = 0.1) -> None:
    """Show a cost table per width: cost per depth, and with --calibration what each depth delivers."""
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
    console.print(f"[bold]{escape(str(path))}[/]: box_class '{escape(key.box_class)}', recipe "
                  f"'{escape(key.recipe)}', energy_source '{key.energy_source}'", highlight=False)
    if cal is not None:
        console.print(f"calibration: drafter {escape(str(cal.drafter))}, {cal.outcomes} outcomes; expected tokens from "
                      f"the position priors; plan: the planner's depth at slack {slack:g}", highlight=False)
    for n in table.widths:
        console.print(_width_table(table, cal, n, slack))


def _width_table(table: CostTable, cal: AcceptanceCalibration | None, n: int, slack: float) -> Table:
    """One width's rows: seconds in ms, joules as measured, and what each depth delivers."""
    grid = Table(title=f"width n = {n}", box=box.SIMPLE_HEAD, title_justify="left")
    headers = ["k", "verify ms", "draft ms"] + (["verify J", "draft J"] if table.has_energy else [])
    if cal is not None:
        headers += ["E tokens", "tok/s"] + (["tok/J"] if table.has_energy else []) + ["plan"]
    for header in headers:
        grid.add_column(header, justify="right")
    estimates = estimate_depths(table, cal, n, None) if cal is not None else []
    chosen = choose(estimates, slack).k if estimates else None
    for k in range(table.kmax + 1):
        cell = table.cell(n, k)
        row = [str(k), f"{cell.verify_s * 1e3:.4g}", f"{cell.draft_s * 1e3:.4g}"]
        if table.has_energy:
            row += [f"{cell.verify_j:.4g}", f"{cell.draft_j:.4g}"]
        if estimates:
            e = estimates[k]
            row += [f"{e.expected_tokens:.3f}", f"{e.tokens_per_s:.4g}"]
            row += [f"{e.tokens_per_j:.4g}"] if table.has_energy else []
            row.append("◀" if k == chosen else "")
        grid.add_row(*row)
    return grid
