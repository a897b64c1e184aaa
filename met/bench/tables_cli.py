"""The `met tables` sub-app: check and show cost tables and calibrations.

`met tables check PATH` exits 0 when the file is a valid cost table or calibration measured
under this box's key, 65 (EX_DATAERR) when it is not valid (not a regular file, over 64 MiB, not
UTF-8, not TOML, nested or dotted past met's limits, or a field invalid: one line naming the field
path and its value), 66 (EX_NOINPUT) when it does not exist
or cannot be read (or the recipe to compare with has no weights here), and 78 (EX_CONFIG) when
its key is not this box's and recipe's (every mismatch listed); `--no-key` checks the file alone.
A draft model's table and calibration are compared with `--draft-model NAME|PATH`, whose recipe and
config their draft_model digest and drafter key cover; an EAGLE-3 head's with `--eagle FOLDER`,
whose config and files their draft_eagle digest and drafter key cover.
PATH may be a folder: every *.toml under it is checked, and the status is the first failure's;
`--this-box tables/` checks only tables/<this box's class>/, the folder a cron job on this box keeps.
"""

from __future__ import annotations  # the table types are imported where they are used: `met --help` needs none

from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from met import bounded_read
from met.choices import DEFAULT_RECIPE
from met.exit_codes import EX_CONFIG, EX_DATAERR, EX_NOINPUT, EX_OK
from met.path_option import nonempty_model, nonempty_path

if TYPE_CHECKING:
    from met.speculative.spec_cost import AcceptanceCalibration, CostTable

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
NoKeyOpt = Annotated[bool, typer.Option("--no-key", help="Check the file alone, not its key against this box.")]
RecipeOpt = Annotated[str, typer.Option(
    "--recipe", "--model", parser=nonempty_model, help="The recipe the key is compared with: an embedded recipe's "
    "name, or a Hugging Face checkpoint folder (as met bench spec-cost --model).")]
BoxClassOpt = Annotated[str | None, typer.Option(
    "--box-class", help="This box's class, if the table was measured with --box-class (default: derived).",
    show_default=False)]
DraftModelOpt = Annotated[str | None, typer.Option(
    "--draft-model", parser=nonempty_model, help="The draft model a serve drafts with (as met bench spec-cost "
    "--draft-model): a draft model's table and calibration are compared with it (default: none, the MTP module).",
    show_default=False)]
EagleOpt = Annotated[Path | None, typer.Option(
    "--eagle", parser=nonempty_path, help="The EAGLE-3 head a serve drafts with (its folder, as met bench spec-cost "
    "--eagle): a head's table and calibration are compared with it (a head is a folder, so there is no default: "
    "without it a head's files are a mismatch that asks for it).", show_default=False)]
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
    """The file's UTF-8 text, read bounded; Refusal 66 if it cannot be read, 65 if it is not UTF-8, not a regular
    file (a FIFO, a device, a socket) or larger than bounded_read.TABLE_LIMIT."""
    try:
        data = bounded_read.read_bytes(path, bounded_read.TABLE_LIMIT)  # a FIFO, /dev/zero or a bomb: refused
    except bounded_read.FileRefused as exc:
        raise Refusal(EX_DATAERR, str(exc)) from None
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
    from met.speculative.spec_cost import AcceptanceCalibration, CostTable, TableParseError, fields

    text = read_text(path)
    try:
        doc = fields.load(text)  # shape-checked before tomllib sees it; parsed once (a wide table is MBs)
        return (AcceptanceCalibration if "drafter" in doc else CostTable).from_doc(doc)
    except TableParseError as exc:
        raise Refusal(EX_DATAERR, f"{path}: {exc}") from None


def _refuse(exc: Refusal) -> typer.Exit:
    typer.echo(str(exc), err=True)
    return typer.Exit(exc.code)


@tables_app.command("check")
def check(path: FileArg, no_key: NoKeyOpt = False, recipe: RecipeOpt = DEFAULT_RECIPE, box_class: BoxClassOpt = None,
          device: DeviceOpt = None, dtype: DtypeOpt = None, this_box: ThisBoxOpt = False,
          draft_model: DraftModelOpt = None, eagle: EagleOpt = None) -> None:
    """Validate a cost table or calibration and compare its key with this box and recipe.

    Exit 0 valid and measured under this key, 65 invalid (naming the field), 66 unreadable,
    78 measured under another key (every mismatch listed; --no-key skips the comparison).
    A folder: every *.toml under it (hidden files aside) is checked and reported, one after the
    other; the status is the first failure's in path order (66 when it holds no *.toml at all).
    --this-box: only PATH/<this box's class> is checked (66 when there is no such folder), so
    `met tables check --this-box tables/` suits a weekly cron job on every box class.
    --draft-model: the key is the one a serve drafting with that draft model has (mode draft_model,
    drafter kind draft); without it, a draft model's table or calibration is a mismatch (78) that says
    which draft model to name. --eagle FOLDER: the same for an EAGLE-3 head (mode draft_eagle, drafter
    kind eagle).
    """
    if draft_model is not None and eagle is not None:
        raise typer.BadParameter("a table prices one drafter: compare with --draft-model or --eagle, not both",
                                 param_hint="--eagle")
    if this_box:
        try:
            path = this_box_folder(path, box_class, device)
        except Refusal as exc:
            raise _refuse(exc) from None
    if not path.is_dir():
        raise typer.Exit(_check_one(path, no_key, recipe, box_class, device, dtype, draft_model, eagle))
    files = sorted(f for f in path.rglob("*.toml") if not f.name.startswith(".") and not f.is_dir())
    if not files:
        raise _refuse(Refusal(EX_NOINPUT, f"{path}: a folder with no *.toml files to check"))
    codes = [_check_one(f, no_key, recipe, box_class, device, dtype, draft_model, eagle) for f in files]
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
               dtype: str | None, draft_model: str | None = None, eagle: Path | None = None) -> int:
    """Check one file, print its line (stdout) or its refusal (stderr); its exit status."""
    from met.speculative.spec_cost import CostTable

    try:
        parsed = load(path)
        if not no_key:
            mismatches = key_mismatches(parsed, recipe, box_class, device, dtype, draft_model, eagle)
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
                   device: str | None, dtype: str | None, draft_model: str | None = None,
                   eagle: Path | None = None) -> list[str]:
    """How the file's key differs from what this box would measure or serve for `recipe` (one line each), drafting
    with `draft_model` or the EAGLE-3 head in `eagle` where one is named, else with the embedded draft model the
    file names, if it is here."""
    # Not at the top: the key needs torch and the recipe, and `--no-key` (and `show`) need neither.
    from met.engine import identity
    from met.model.dflash import DrafterError
    from met.model.recipes import RecipeError
    from met.model.sources import draft_model_for, resolve
    from met.speculative.spec_cost import AcceptanceCalibration, DrafterMismatch

    try:
        found = resolve(recipe)  # an embedded name, or a checkpoint folder (its recipe covers weights and config.json)
        draft = draft_model_for(found, draft_model) if draft_model is not None else None
    except RecipeError as exc:  # its status: 66 missing, 65 a damaged card or another tokenizer (CheckpointError)
        raise Refusal(exc.status, f"cannot compare the key: {exc}; or pass --no-key to check the file alone") \
            from None
    if draft is None and eagle is None and (named := _draft_named(parsed)) is not None:  # an embedded one: itself
        try:
            draft = draft_model_for(found, named)
        except RecipeError:  # a folder's model name, or one not here: the lines below ask for --draft-model
            pass
    try:
        own = (identity.own_drafter(draft) if draft is not None else
               identity.own_drafter(identity.eagle_head(eagle, found.config)) if eagle is not None else None)
    except DrafterError as exc:  # its status: 66 missing, 65 no head for this recipe
        raise Refusal(exc.status, f"cannot compare the key: --eagle {eagle}: {exc}") from None
    if isinstance(parsed, AcceptanceCalibration):
        mine = identity.mtp_drafter_key(found) if own is None else own.key
        if parsed.drafter == mine:
            return []
        hint = [f"the calibration was fitted on {_OWN[parsed.drafter.kind][0]} '{parsed.drafter.name}': pass "
                f"{_OWN[parsed.drafter.kind][1]} to compare it with the one a serve drafts with"] \
            if parsed.drafter.kind in _OWN and own is None else []
        return [DrafterMismatch("drafter", parsed.drafter, mine).message(), *hint]
    try:
        measured_in = parsed.meta.get("dtype")  # a float32 table on a GPU is for a serve run with --dtype float32
        settings = identity.resolve_run(device, dtype or (measured_in if isinstance(measured_in, str) else None),
                                        set_threads=False)
        modes = [m for m in parsed.key.modes if m in identity.KNOWN_MODES]
        own_modes = {"draft_model", "draft_eagle"}  # steps of drafters the key's digest covers but no name gives here
        unnamed = [m for m in modes if m in own_modes] if own is None else []
        if own is not None:  # the serve drafts with it: its draft step must have been measured
            modes = sorted({*(m for m in modes if m not in own_modes), own.mode})
            drafter = own.config
        else:
            modes = [m for m in modes if m not in own_modes]
            drafter = _dflash_config(found, settings) if "draft_dflash" in modes else None
        mine_key = identity.serve_table_key(found.id, found.config, settings, parsed.key.energy_source,
                                            modes or ["decode"], box_class, drafter)
    except (RuntimeError, ValueError) as exc:
        raise typer.BadParameter(f"cannot build this box's key: {exc}; or pass --no-key to check the file alone") \
            from None
    lines = [m.message() for m in parsed.key.check(mine_key)]
    for mode in unnamed:
        kind = "draft" if mode == "draft_model" else "eagle"
        what, option = _OWN[kind]
        drafted = parsed.meta.get("draft_model" if kind == "draft" else "eagle_head")
        named = f"{what} '{drafted}'" if isinstance(drafted, str) else f"an {what}" if kind == "eagle" else f"a {what}"
        lines.append(f"mode '{mode}' timed the draft step of {named}, and no {option} was named to compare it with: "
                     f"pass the {what} a serve drafts with")
    lines += [f"mode '{m}' is not one this met runs ({', '.join(identity.KNOWN_MODES)}); re-measure with this met"
              for m in parsed.key.modes if m not in identity.KNOWN_MODES]
    return lines


_OWN = {"draft": ("draft model", "--draft-model"), "eagle": ("EAGLE-3 head", "--eagle")}  # kind: words, option


def _draft_named(parsed: CostTable | AcceptanceCalibration) -> str | None:
    """The draft model a table's draft step or a calibration's drafts came from, by its recipe name (None: none)."""
    from met.speculative.spec_cost import AcceptanceCalibration

    if isinstance(parsed, AcceptanceCalibration):
        return parsed.drafter.name if parsed.drafter.kind == "draft" else None
    drafted = parsed.meta.get("draft_model")
    return drafted.rsplit("@", 1)[0] if isinstance(drafted, str) and "draft_model" in parsed.key.modes else None


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
    from met.speculative.spec_cost import TableParseError, fields

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
    from met.speculative.spec_cost import AcceptanceCalibration, CostTable

    try:
        table = load(path)
        if not isinstance(table, CostTable):
            raise Refusal(EX_DATAERR, f"{path}: is a calibration, not a cost table; pass it with --calibration")
        cal = None if calibration is None else load(calibration)
        if cal is not None and not isinstance(cal, AcceptanceCalibration):
            raise Refusal(EX_DATAERR, f"{calibration}: is a cost table, not a calibration (it has no [drafter])")
    except Refusal as exc:
        raise _refuse(exc) from None
    from met.bench.table_view import render  # rich, imported when a table is shown

    render(path, table, cal, slack, lift_wide_tier, measured_ago(table.meta))
