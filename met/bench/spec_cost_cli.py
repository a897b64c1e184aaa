"""`met bench spec-cost`: measure the cost table (and the drafter's calibration) of this box and write them safely.

The command parses, takes the table's lock, opens the meter, loads the recipe (and the draft model
that drafts for it, if one is given), runs the sweep (met.bench.sweep, met.bench.loop_sweep) and
the calibration (met.bench.calibrate), and writes both atomically (met.bench.table_files); every
refusal is one line on stderr and a documented exit status.
"""

from __future__ import annotations  # the heavy types are imported where they are used: `met --help` needs none

import datetime as dt
import platform
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from met import __version__
from met.bench.table_names import TABLES, calibration_path, table_path
from met.choices import DEFAULT_RECIPE, ENERGY_CHOICES
from met.exit_codes import (EX_CANTCREAT, EX_CONFIG, EX_DATAERR, EX_INTERRUPTED, EX_NOINPUT, EX_OK, EX_TEMPFAIL,
                            EX_UNAVAILABLE)
from met.interrupt import raise_on_sigint, say_interrupted
from met.model.errors import RecipeError
from met.path_option import nonempty_model, nonempty_path
from met.say import say

if TYPE_CHECKING:  # torch, the model, the sweep and the table files are imported by the functions that use them
    import torch

    from met.bench import calibrate as cal
    from met.bench.meters import Meter
    from met.bench.progress import Reporter
    from met.bench.sweep import SweepParams
    from met.bench.table_files import Existing
    from met.engine.identity import OwnDrafter, RunSettings
    from met.model.dflash import DflashDrafter
    from met.model.eagle3 import Eagle3Head
    from met.model.recipes import Recipe
    from met.model.tokenizer import Tokenizer
    from met.speculative.spec_cost import AcceptanceCalibration, CostTable

EX_USAGE = 2  # what click answers a bad option with; the command uses it for bad values it finds later

RecipeOpt = Annotated[str, typer.Option(
    "--recipe", "--model", parser=nonempty_model,
    help="Embedded recipe name, or a Hugging Face checkpoint folder (Llama, Mistral, Qwen2, Qwen3), to measure "
    "(a model without an MTP module and no --draft-model: plain decode cells only, k = 0).")]
DrafterOpt = Annotated[str, typer.Option(
    "--drafter", help="Whose draft step to time: mtp (the recipe's MTP module) or dflash (its DFlash block drafter, "
    "<recipe>.dflash.safetensors beside its weights; table <recipe>.dflash.toml, no calibration).")]
DraftModelOpt = Annotated[str | None, typer.Option(
    "--draft-model", parser=nonempty_model,
    help="Time this draft model's draft step instead of the MTP module's: an embedded recipe name (e.g. "
    "met-tiny-py-draft) or a checkpoint folder with the recipe's tokenizer (table "
    "<recipe>.draft-<draft model>.toml, calibrated on its drafts; as met generate --spec draft).",
    show_default=False)]
EagleOpt = Annotated[Path | None, typer.Option(
    "--eagle", parser=nonempty_path,
    help="Time this EAGLE-3 head's draft step instead of the MTP module's: the head's folder (config.json and "
    "model.safetensors, trained on the recipe; as met serve --spec eagle --drafter FOLDER) (table "
    "<recipe>.eagle-<folder name>.toml, calibrated on its drafts). An option of its own, as --draft-model, not a "
    "--drafter value: --drafter picks between the recipe's own drafters (mtp, dflash), which ship beside its "
    "weights, while a head, like a draft model, is a model of its own that the table is also keyed by.",
    show_default=False)]
WithMtpOpt = Annotated[bool, typer.Option(
    "--with-mtp",
    help="With --draft-model or --eagle on a model with an MTP module: time the MTP module's draft step in the same "
    "sweep and write its table and calibration too (<recipe>.toml). A joint sweep (this, or --draft-model with "
    "--eagle) times the plain step (k = 0) and the copies' verify cells once, and every table it writes holds "
    "those figures, so a serve choosing among the drafters (met serve --spec mtp+draft) compares their drafts, not "
    "two sweeps' noise. Its tables go under their default file names into the folder --out names (default "
    "tables/<box_class>/).")]
BoxClassOpt = Annotated[str | None, typer.Option(
    "--box-class", help="Box class the table is keyed by (default: derived, e.g. nvidia-h200x1, cpu-amd-epyc-2t).",
    show_default=False)]
DeviceOpt = Annotated[str | None, typer.Option(
    "--device", help="Torch device to measure on (default: cuda if available, else cpu).", show_default=False)]
DtypeOpt = Annotated[str | None, typer.Option(
    "--dtype", help="Model dtype (default: bfloat16 on cuda, float32 on cpu).", show_default=False)]
WidthsOpt = Annotated[str | None, typer.Option(
    "--widths", help="Batch widths, comma-separated (default: 1,2,4,8,16; --quick: 1,2).", show_default=False)]
DepthOpt = Annotated[int | None, typer.Option(
    "--max-depth", min=0, max=16,
    help="Deepest draft depth k; cells 0..=k (default: 4; --quick: 2; 0 for a model with neither an MTP module "
    "nor --draft-model).",
    show_default=False)]
VerifyDepthOpt = Annotated[int | None, typer.Option(
    "--verify-depth", min=0, max=16,
    help="Copies verified at depths 1..=N: what verifying k copies costs (prompt lookup's copies of the "
         "sequence's history, no drafter pass), which the measured planner prices copies at, at each depth apart "
         "from the MTP cells' verify; at each width no deeper than it copies there (spec_capacity.COPY_POOLS: 16 at "
         "width 1, 8 at 2, 6 at 3-4, 4 at 5-8, 2 at 9-16) (default: 16; --quick: 3; 0: none; --drafter dflash and "
         "a model without an MTP module or --draft-model measure none and refuse a depth).", show_default=False)]
ContextOpt = Annotated[int | None, typer.Option(
    "--context-len", min=1,
    help="Tokens in the first sequence's KV cache while timing; sequence i holds i fewer, a ragged batch "
         "as a serve's (in-loop: bytes of each held-out prompt) (default: 256; --quick: 64).",
    show_default=False)]
RepeatsOpt = Annotated[int | None, typer.Option(
    "--repeats", min=1, max=1000, help="Runs (or windows) per cell; the figure is their median, each paired with "
    "its width's cells of the same repeat (default: 9; --quick: 3).",
    show_default=False)]
WindowOpt = Annotated[float | None, typer.Option(
    "--window", min=0.001, max=600.0,
    help="Shortest window in seconds (NVML: at least 1; unused in-loop) (default: 0.4; --quick: 0.03).",
    show_default=False)]
EnergyOpt = Annotated[str, typer.Option(
    "--energy", help="Energy source: auto (NVML on a GPU, RAPL on a CPU, where they work; else none), nvml, "
    "rapl, none.")]
CalibrateOpt = Annotated[bool | None, typer.Option(
    "--calibrate/--no-calibrate", help="Also fit the drafter's acceptance calibration (written beside the table) "
    "(default: when the model has an MTP drafter, or with --draft-model or --eagle).", show_default=False)]
PromptsOpt = Annotated[Path | None, typer.Option(
    "--calibration-prompts", parser=nonempty_path,
    help="Calibration prompts: a JSON Lines file (strings or {\"prompt\": ...}) or a folder of text files "
    "(default: 128 mid-file windows of the model card's held-out files).", show_default=False)]
OutOpt = Annotated[Path | None, typer.Option(
    "--out", parser=nonempty_path,
    help="Table file (default: tables/<box_class>/<recipe>.toml; --draft-model, --eagle: "
    "<recipe>.draft-<draft model>.toml, <recipe>.eagle-<head folder>.toml there); the calibration goes to "
    "<out>.calibration.toml with .toml dropped.",
    show_default=False)]
QuickOpt = Annotated[bool, typer.Option(
    "--quick", help="A small sweep for tests and smoke runs (seconds), marked quick = true in its [meta]; needs an "
    "--out outside any tables/ folder (exit 2 otherwise), so it never replaces a table a serve plans from.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", help="No progress and no change report; errors and warnings only.")]
ReplaceOpt = Annotated[bool, typer.Option(
    "--replace", help="Overwrite what is at --out even if it is not a met cost table (exit 73 otherwise) or a table "
    "of another box class or model (exit 78 otherwise).")]

FULL = {"repeats": 9, "window_s": 0.4}  # the sweep without --quick: SweepParams' defaults but these


class Refusal(Exception):
    """The run stops: the exit status and the one-line message to print."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def in_tables_folder(out: Path) -> bool:
    """Whether `out` (or a symlink's target) lies under a folder named tables/, where committed tables live."""
    try:
        places = [out.absolute(), out.resolve()]
    except (OSError, RuntimeError):  # a name too long, a symlink loop: the lock or the write check refuses it
        places = [out.absolute()]
    return any(TABLES in place.parent.parts for place in places)


MAX_SWEEP_WIDTH = 256  # as serve's --max-batch: every slot's KV cache is allocated up front


def parse_widths(text: str) -> tuple[int, ...]:
    """`1,2,4` -> (1, 2, 4); BadParameter naming the bad part."""
    widths = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or not 1 <= int(part) <= MAX_SWEEP_WIDTH:
            raise typer.BadParameter(f"{part!r} in {text!r} is not a whole number in 1..{MAX_SWEEP_WIDTH}; "
                                     "e.g. 1,2,4,8,16", param_hint="--widths")
        widths.append(int(part))
    if len(set(widths)) != len(widths):
        raise typer.BadParameter(f"{text!r} repeats a value", param_hint="--widths")
    return tuple(widths)


def spec_cost(
    recipe: RecipeOpt = DEFAULT_RECIPE,
    drafter: DrafterOpt = "mtp",
    draft_model: DraftModelOpt = None,
    eagle: EagleOpt = None,
    with_mtp: WithMtpOpt = False,
    box_class_: BoxClassOpt = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
    widths: WidthsOpt = None,
    max_depth: DepthOpt = None,
    verify_depth: VerifyDepthOpt = None,
    context_len: ContextOpt = None,
    repeats: RepeatsOpt = None,
    window: WindowOpt = None,
    energy: EnergyOpt = "auto",
    calibrate: CalibrateOpt = None,
    calibration_prompts: PromptsOpt = None,
    out: OutOpt = None,
    quick: QuickOpt = False,
    quiet: QuietOpt = False,
    replace_: ReplaceOpt = False,
) -> None:
    """Measure what a verify step and a draft step cost at each width and depth on this box; write the table.

    Without an energy source (--energy none, or auto where none works) the cells are timed inside
    running decodes: per cell, held-out prompts (in the model's own tokenizer) through the
    scheduler at that width drafting k every step, the mean of its full steps, each step's
    verify time the rest of its scheduler tick (a step timed alone, again and again, runs with
    caches warm for it: on a CPU that priced draft steps 10-30% low). With energy, for DFlash, for
    a checkpoint folder without tokenizer.json, and where a decode ends before a step can be
    timed, each cell is timed in windows of many identical steps. Either way each repeat times a
    width's cells back to back (widths and cells in a new shuffled order), and a cell's time is
    its median over repeats paired with its width's other cells of the same repeat, so a
    slowdown they share cancels. Verify cells price verifying k copies with no draft (a decode
    verifying its histories' copies every step, or in windows each prompt's last k tokens), at
    each width at depths 1.. as deep as --verify-depth and the planner's copy pools allow. The run holds a
    lock beside the table and replaces the table atomically (the table and its calibration are
    both written out before either is replaced; a symlinked --out has its target replaced), so
    cron may run it unattended. When a table is already there, each cell's change is printed; a
    file there that is no met table, or the table of another box class or model, is refused
    before measuring unless --replace is given. A checkpoint folder (--model PATH) has no MTP
    drafter: without --draft-model its table holds the plain decode cells (k = 0) of each width,
    its recipe is the folder's model name and the digest of its weights and config, and no
    calibration is written. --drafter dflash times the recipe's DFlash block drafter instead of its
    MTP module (one pass whatever k; mode draft_dflash, its digest covering the drafter's config)
    and writes <recipe>.dflash.toml, without a calibration. --draft-model NAME|PATH times a draft
    model's draft step instead (a smaller model of the recipe's tokenizer and vocabulary with a KV
    cache of its own, as met generate --spec draft drafts with; its catch-up after a drafting step
    is at most 2 rows, its last draft and the bonus token): mode draft_model, its digest covering
    the draft model's recipe and config, cells as deep as --max-depth whether or not the recipe has
    an MTP module, written to <recipe>.draft-<draft model>.toml, its calibration fitted on the
    draft model's drafts (drafter kind draft) beside it. It is what met serve --spec-cost-model
    measured plans from when it drafts with that draft model. --eagle FOLDER does the same for an
    EAGLE-3 head (mode draft_eagle, its digest covering the head's config and the digest of its
    config.json and safetensors; its catch-up before a draft is as the MTP block's, every row the
    last step emitted), written to <recipe>.eagle-<folder name>.toml with its calibration (drafter
    kind eagle): what met serve --spec eagle --drafter FOLDER --spec-cost-model measured plans from.
    --with-mtp (beside --draft-model or --eagle), or --draft-model with --eagle, times several
    drafters in one sweep on one runner holding them all, as a serve choosing among them runs: each
    drafter's cells at k >= 1 are its own, the plain step and the copies are timed once, and each
    drafter's table and calibration are written (all of them or none) under their default names in
    the folder --out names.

    Exit statuses: 0 table (and calibration) written; 2 bad option value (and --quick without
    --out, or with an --out inside a tables/ folder, or --draft-model or --eagle with --drafter
    dflash, or --with-mtp without either or on a model without an MTP module, or several drafters
    with an --out that names a file: nothing is written); 65 (EX_DATAERR) nothing written: the calibration prompts are invalid or
    gave too few judged drafts, or the measured table did not validate, or the checkpoint folder
    cannot be loaded (unsupported architecture), or the draft model has another tokenizer or
    vocabulary than the recipe's, or the EAGLE-3 head is not one for this recipe; 66 (EX_NOINPUT) the recipe's weights, the folder, the draft
    model, the EAGLE-3 head or the calibration prompts are missing; 69 (EX_UNAVAILABLE) the energy source asked for
    does not work here (the reason is printed); 73 (EX_CANTCREAT) the table cannot be written there
    (--out is a folder, a FIFO, a device or a socket, or a symbolic link to nothing, or its folder,
    lock file or file cannot be created, a full disk included, or a file there is no met table and
    --replace was not given): the table there before is untouched; 75 (EX_TEMPFAIL) another run
    holds the table's lock: nothing was touched, try later; 78 (EX_CONFIG) --out holds the table of
    another box class or model (or of another draft model or EAGLE-3 head, or of none where this
    run measures one, or the reverse) and --replace was not given: nothing was measured; 130 interrupted (Ctrl-C):
    the table and its calibration are each whole, as they were or as the run wrote them (SIGTERM,
    SIGKILL: the same, unannounced).
    """
    if drafter not in ("mtp", "dflash"):
        raise typer.BadParameter(f"{drafter!r} is not one of mtp, dflash", param_hint="--drafter")
    if drafter == "dflash" and draft_model is not None:
        raise typer.BadParameter("--draft-model times a draft model's step and --drafter dflash a DFlash block "
                                 "drafter's; a table prices one drafter: drop one of them", param_hint="--draft-model")
    if eagle is not None and drafter == "dflash":
        raise typer.BadParameter("--eagle times an EAGLE-3 head's step and --drafter dflash a DFlash block "
                                 "drafter's; a DFlash table prices its drafter alone: drop one of them",
                                 param_hint="--eagle")
    if with_mtp and draft_model is None and eagle is None:
        raise typer.BadParameter("--with-mtp times the MTP module beside a draft model or an EAGLE-3 head; "
                                 "without --draft-model or --eagle the MTP module's table is what is measured: "
                                 "drop --with-mtp", param_hint="--with-mtp")
    if drafter == "dflash" and calibrate:
        raise typer.BadParameter("the calibration is fitted for the MTP drafter only; drop --calibrate",
                                 param_hint="--calibrate")
    if drafter == "dflash" and verify_depth:
        raise typer.BadParameter("a DFlash table prices its block drafter's steps (--max-depth); verify cells "
                                 "price the copies of the MTP drafter's planner; drop --verify-depth",
                                 param_hint="--verify-depth")
    from met.bench import calibrate as cal
    from met.bench.progress import Reporter
    from met.bench.sweep import QUICK, SweepParams
    from met.bench.table_files import LockHeld, TableLock, Unwritable, resolve_out
    from met.engine.identity import box_class, resolve_run
    from met.model.sources import recipe_name

    energy = energy.lower()
    if energy not in ENERGY_CHOICES:
        raise typer.BadParameter(f"{energy!r} is not one of {', '.join(ENERGY_CHOICES)}", param_hint="--energy")
    if quick and out is None:
        raise typer.BadParameter("a --quick table is a smoke run's, too coarse to plan from; pass --out (e.g. "
                                 "--out /tmp/quick.toml) so it does not replace tables/<box_class>/<recipe>.toml",
                                 param_hint="--quick")
    base = QUICK if quick else SweepParams(**FULL)
    if drafter == "dflash":
        base = replace(base, verify_depth=0)  # its cells price its own depths: nothing is copied past them
    try:
        settings = resolve_run(device, dtype)
        device = settings.device
        params = replace(base, widths=parse_widths(widths) if widths is not None else base.widths,
                         max_depth=base.max_depth if max_depth is None else max_depth,
                         verify_depth=base.verify_depth if verify_depth is None else verify_depth,
                         context_len=context_len or base.context_len, repeats=repeats or base.repeats,
                         window_s=window or base.window_s)
        box = box_class(device, box_class_)
    except (RuntimeError, ValueError) as exc:
        raise typer.BadParameter(str(exc)) from None
    cal_params = replace(cal.QUICK_CALIBRATION if quick else cal.CalibrationParams(), depth=max(1, params.max_depth))
    try:
        name = recipe_name(recipe)  # a folder's model name, from its config.json; the weights are read later
        draft_name = recipe_name(draft_model) if draft_model is not None else None
    except RecipeError as exc:
        _fail(exc.status, str(exc))
    if eagle is not None and not eagle.is_dir():
        _fail(EX_NOINPUT, f"--eagle {eagle}: no such folder; pass an EAGLE-3 head's folder (config.json and "
              "model.safetensors)")
    owned = {"mtp": None, "dflash": None, "draft": f"draft-{draft_name}" if draft_name is not None else None,
             "eagle": f"eagle-{eagle.resolve().name}" if eagle is not None else None}
    kinds = [k for k, wanted in (("mtp", with_mtp), ("draft", draft_model is not None), ("eagle", eagle is not None))
             if wanted] or [drafter]
    calibrated = cal_params if calibrate is not False and drafter == "mtp" else None
    paths = _table_paths(out, box, name, [(k, owned[k]) for k in kinds])
    for path in paths if quick else ():
        if in_tables_folder(path):
            example = "/tmp/quick.toml" if len(paths) == 1 else "/tmp/quick"
            raise typer.BadParameter(f"{path} is inside a {TABLES} folder, where the tables a serve plans from live; "
                                     "a --quick table is too coarse to plan from, so it is never written there: pass "
                                     f"an --out elsewhere (e.g. --out {example})", param_hint="--out")
    outputs = []
    try:  # a symlinked --out: both files go beside its target; a dangling link is refused
        for kind, path in zip(kinds, paths):
            target = resolve_out(path)
            outputs.append(Output(kind, owned[kind], target, resolve_out(calibration_path(target))))
    except Unwritable as exc:
        _fail(EX_CANTCREAT, f"{exc}; nothing was measured")
    request = Request(recipe, box_class_, settings, params, energy, calibrated, calibration_prompts, tuple(outputs),
                      max_depth is not None, calibrate is True, drafter, box, replace_,
                      verify_depth is not None, quick, draft_model, eagle)
    raise_on_sigint()  # from here a Ctrl-C leaves the tables and calibrations whole, and says so
    try:
        with ExitStack() as locks, Reporter(quiet) as reporter:
            for output in request.outputs:
                locks.enter_context(TableLock(output.out))
            _run(request, reporter)
    except LockHeld as exc:
        _fail(EX_TEMPFAIL, str(exc))
    except Unwritable as exc:
        _fail(EX_CANTCREAT, f"{exc}; nothing was measured")
    except Refusal as exc:
        _fail(exc.code, str(exc))
    except KeyboardInterrupt:  # true at any moment: each file is renamed into place whole, or not at all
        say_interrupted(f"error: interrupted: {', '.join(str(o.out) for o in request.outputs)} and "
                        f"{'their calibrations' if len(request.outputs) > 1 else 'its calibration'} are each whole, "
                        "as they were or as this run wrote them")
        raise typer.Exit(EX_INTERRUPTED) from None
    raise typer.Exit(EX_OK)


@dataclass(frozen=True, slots=True)
class Output:
    """One table a run writes, with its calibration: whose drafts it prices, and where the files go."""

    kind: str  # the drafter whose draft step its cells time: mtp, dflash, draft or eagle
    own_name: str | None  # draft-<draft model> or eagle-<head folder>: what its default file name adds
    out: Path
    calibration_out: Path  # beside out (x.toml -> x.calibration.toml), or a symlink's target there


@dataclass(frozen=True, slots=True)
class Request:
    """One run, its options resolved: what to measure, where, how, and where the files go."""

    recipe: str
    box_override: str | None  # --box-class, else None: derived from the hardware
    settings: RunSettings
    params: SweepParams
    energy: str  # --energy as given: auto, nvml, rapl or none
    calibration: cal.CalibrationParams | None  # None: --no-calibrate
    prompts: Path | None  # --calibration-prompts, else None: windows of the held-out files
    outputs: tuple[Output, ...]  # the tables the run writes: one per drafter it times (several: a joint sweep)
    depth_given: bool = False  # --max-depth was passed (a model without a drafter refuses k > 0, not drops it)
    calibrate_given: bool = False  # --calibrate was passed (likewise)
    drafter: str = "mtp"  # whose draft step is timed: mtp or dflash
    box: str = ""  # the box class the table will be keyed by
    overwrite: bool = False  # --replace: write over a file that is no table of ours, or of another box or model
    verify_depth_given: bool = False  # --verify-depth was passed (likewise)
    quick: bool = False  # --quick: the table's [meta] says so (quick = true), and a serve warns that it plans from it
    draft_model: str | None = None  # --draft-model as given: its draft step is timed instead of the MTP module's
    eagle: Path | None = None  # --eagle: the EAGLE-3 head whose draft step is timed instead of the MTP module's


def _fail(code: int, message: str) -> None:
    say(f"error: {message}", err=True)
    raise typer.Exit(code)


def _refuse_foreign(req: Request, output: Output, old: Existing) -> None:
    """Refusal 73 if the file at --out, or where its calibration goes, is no met file (unless --replace).

    Someone's other file (a typo'd --out README.md, notes beside it) is not ours to replace.
    """
    from met.bench.table_files import foreign_calibration

    if req.overwrite:
        return
    if old.foreign:
        raise Refusal(EX_CANTCREAT, f"{output.out} {old.problem}, so it is not a met cost table to replace; nothing "
                      "was measured; pass another --out, or --replace to overwrite it")
    if req.calibration is not None and (problem := foreign_calibration(output.calibration_out)) is not None:
        raise Refusal(EX_CANTCREAT, f"{output.calibration_out} {problem}, so it is not a calibration to replace; "
                      "nothing was measured; pass another --out, --no-calibrate, or --replace to overwrite it")


def _default_out(box: str, name: str, drafter: str, own_name: str | None) -> Path:
    """Where the table goes without --out (table_names.table_path), where the measured boot looks for it."""
    return table_path(box, name, "dflash" if drafter == "dflash" else own_name)


def _table_paths(out: Path | None, box: str, name: str, owners: list[tuple[str, str | None]]) -> list[Path]:
    """Where each table goes (owners: each one's drafter kind and own name): --out or its default name for one;
    for several (a joint sweep), their default names in the folder --out names (default tables/<box>/)."""
    if len(owners) == 1:
        return [out or _default_out(box, name, *owners[0])]
    folder = out if out is not None else Path(TABLES) / box
    if folder.suffix == ".toml" or folder.is_file():
        raise typer.BadParameter(f"{folder} names a file; a joint sweep writes a table per drafter, each under its "
                                 f"default name (e.g. {_default_out(box, name, *owners[0]).name}), into the folder "
                                 "--out names: pass a folder", param_hint="--out")
    return [folder / _default_out(box, name, *owner).name for owner in owners]


def _refuse_other_key(req: Request, output: Output, old: Existing, name: str) -> None:
    """Refusal 78 if --out holds the table of another box class, model or draft model (unless --replace).

    A changed plan digest or weights digest is what a re-measure is for, so only the box class, the
    recipe's name and the draft model's or EAGLE-3 head's name (none for a table of the MTP
    module's drafts) are compared. Checked before measuring: a refusal costs nothing.
    """
    if old.table is None or req.overwrite:
        return
    key = old.table.key
    theirs = _own_of(old.table)
    if (key.box_class, key.recipe.split("@", 1)[0], theirs) != (req.box, name, output.own_name):
        raise Refusal(EX_CONFIG, f"{output.out} holds the table of {_measured(key.box_class, key.recipe, theirs)}; "
                      f"this run measures {_measured(req.box, name, output.own_name)}; nothing was measured; pass "
                      f"another --out (the default is {_default_out(req.box, name, output.kind, output.own_name)}), "
                      "or --replace to overwrite it")


# a drafter that is not the model's: its kind, the mode of its draft step, the [meta] field naming it
_OWN_FIELDS = (("draft", "draft_model", "draft_model"), ("eagle", "draft_eagle", "eagle_head"))
_OWN_WORDS = {"draft": "draft model", "eagle": "EAGLE-3 head"}


def _own_of(table: CostTable) -> str | None:
    """draft-<name> or eagle-<name>: the draft model or EAGLE-3 head the table was measured for (its [meta]
    draft_model or eagle_head, written also at --max-depth 0); None for a table of another drafter's steps, or of
    plain decode alone."""
    for kind, mode, field in _OWN_FIELDS:
        drafted = table.meta.get(field)
        if isinstance(drafted, str):
            return f"{kind}-{drafted.split('@', 1)[0]}"
        if mode in table.key.modes:
            return f"{kind}-(unnamed)"
    return None


def _measured(box: str, recipe: str, own: str | None) -> str:
    """"box_class 'b', recipe 'r'", and ", draft model 'd'" (or ", EAGLE-3 head 'h'") where one drafted."""
    where = f"box_class '{box}', recipe '{recipe}'"
    if own is None:
        return where
    kind, _, name = own.partition("-")
    return f"{where}, {_OWN_WORDS[kind]} '{name}'"


def _run(req: Request, reporter: Reporter) -> None:
    """Everything under the locks: what is at each --out, meter, recipe, sweep, calibrations, then the writes."""
    import torch

    from met.bench import calibrate as cal
    from met.bench.meters import EnergyUnavailable, open_meter
    from met.bench.sweep import check_fits
    from met.bench.table_files import check_writable, read_existing
    from met.engine import heap
    from met.engine.identity import mtp_drafter_key
    from met.model.sources import tokenizer_for
    from met.speculative.spec_cost import SpecCostError

    for output in req.outputs:
        for path in (output.out, output.calibration_out) if req.calibration is not None else (output.out,):
            try:
                check_writable(path)
            except OSError as exc:
                raise Refusal(EX_CANTCREAT, f"cannot write beside {path}: {exc.strerror or exc}; nothing was "
                              "measured") from None
    olds = [read_existing(output.out) for output in req.outputs]
    for output, old in zip(req.outputs, olds):
        _refuse_foreign(req, output, old)
    try:
        meter = open_meter(req.energy, req.settings.device)
    except EnergyUnavailable as exc:
        raise Refusal(EX_UNAVAILABLE, f"--energy {req.energy}: {exc}") from None
    note = meter.info().get("energy_note")
    reporter.say(f"energy source: {meter.source}" + (f" ({note})" if note else ""))
    params = replace(req.params, window_s=max(req.params.window_s, meter.min_window_s))
    recipe = _recipe(req.recipe)
    draft = _draft_recipe(recipe, req.draft_model) if req.draft_model is not None else None
    owns = {o.kind: _own_drafter(recipe, draft if o.kind == "draft" else None, req.eagle if o.kind == "eagle" else None)
            for o in req.outputs}
    for output, old in zip(req.outputs, olds):
        _refuse_other_key(req, output, old, recipe.name)
    joint = len(req.outputs) > 1
    if joint and "mtp" in owns and not recipe.config.mtp_depth:
        raise Refusal(EX_USAGE, f"{recipe.name} has no MTP module to time beside the "
                      f"{' and '.join(_OWN_WORDS[k] for k in owns if k != 'mtp')}; drop --with-mtp")
    calibration_params = req.calibration
    block = _block_drafter(recipe, req.settings) if req.drafter == "dflash" else None
    if block is None and not joint and owns.get(req.outputs[0].kind) is None and not recipe.config.mtp_depth:
        params, calibration_params = _without_drafter(req, recipe, params), None
        reporter.say(f"{recipe.name} has no MTP drafter: measuring plain decode (k = 0) only, no calibration")
    try:
        check_fits(recipe.config, params, block.block if block is not None else None,
                   draft.config if draft is not None else None, req.eagle is not None)
    except ValueError as exc:
        raise Refusal(EX_USAGE, str(exc)) from None
    texts = _prompts(req.prompts, calibration_params) if calibration_params else []
    dtype = getattr(torch, req.settings.dtype)
    model = recipe.load(dtype, req.settings.device)
    small = draft.load(dtype, req.settings.device) if draft is not None else None
    head = _eagle_head(req.eagle, recipe, req.settings) if req.eagle is not None else None
    heap.settle()  # steps timed as met serve runs them: no full collector pass over the model's heap
    tables = _sweep(req, params, recipe, model, meter, reporter, block, owns, small, head)
    calibrations: dict[str, AcceptanceCalibration] = {}
    for kind in tables if calibration_params else ():
        own = owns[kind]
        key = mtp_drafter_key(recipe) if own is None else own.key
        reporter.say(f"calibrating drafter {key.kind} '{key.name}' on {len(texts)} prompts")
        try:
            calibrations[kind] = cal.calibrate(
                model, texts, key, calibration_params, {"when": tables[kind].meta["when"], "met_version": __version__},
                lambda done, total: reporter.step("calibration", done, total, "prompts"),
                small if kind == "draft" else None, tokenizer_for(recipe), head if kind == "eagle" else None)
        except SpecCostError as exc:
            raise Refusal(EX_DATAERR, f"calibration failed, so nothing was written: {exc}") from None
    _write([(o, old, tables[o.kind], calibrations.get(o.kind)) for o, old in zip(req.outputs, olds)], reporter)


def _sweep(req: Request, params: SweepParams, recipe: Recipe, model: torch.nn.Module, meter: Meter,
           reporter: Reporter, block: DflashDrafter | None, owns: dict[str, OwnDrafter | None],
           small: torch.nn.Module | None = None, head: Eagle3Head | None = None) -> dict[str, CostTable]:
    """Each drafter's measured table ({kind: table}), validated exactly as a reader will parse it.

    owns: each drafter the run times, and the OwnDrafter its table is keyed by (None: the model's MTP module or
    DFlash drafter); small or head: the draft model or EAGLE-3 head, loaded. Several: one joint sweep.
    """
    import torch

    from met.bench.loop_sweep import NothingTimed, measure_joint_in_loop
    from met.bench.meters import EnergyReadError
    from met.bench.sweep import measure_joint
    from met.engine.identity import device_name, serve_table_key
    from met.speculative.spec_cost import CostTable, TableParseError

    s = req.settings
    with_mtp = "mtp" in owns and len(owns) > 1
    loop = _loop_prompts(recipe, params) if meter.source == "none" and block is None else None
    how = "a short decode per cell, timed in the loop" if loop else f"{params.window_s:g} s windows"
    copies = f", copies verified at depths 1..={params.deepest_copy}" if params.deepest_copy else ""
    by = ["MTP module" if own is None else own.id for own in owns.values()]
    drafted = (f" drafted by {' and '.join(by)} in one sweep" if len(owns) > 1 else
               "" if None in owns.values() else f" drafted by {by[0]}")
    reporter.say(f"measuring {recipe.id}{drafted} on {device_name(s.device)} ({s.device}, {s.dtype}, {s.threads} "
                 f"threads): widths {','.join(map(str, params.widths))}, depths 0..={params.max_depth}{copies}, "
                 f"{params.repeats} repeats of {how}")
    started = time.perf_counter()

    def progress(done: int, total: int, label: str) -> None:
        reporter.step("sweep", done, total, label)

    try:
        results = None
        if loop:
            try:
                prompts, tokenizer = loop
                results = measure_joint_in_loop(model, recipe.id, prompts, params, progress, tokenizer, small, head,
                                                with_mtp)
            except NothingTimed as exc:  # the model ends its requests at once: time the steps held instead
                reporter.say(f"in the loop, {exc}; timing every cell in {params.window_s:g} s windows instead")
        if results is None:
            results = measure_joint(model, meter, params, progress, block, small, head, with_mtp)
    except EnergyReadError as exc:
        raise Refusal(EX_UNAVAILABLE, f"the energy source stopped giving usable readings: {exc}") from None
    except ValueError as exc:  # the in-loop decode does not fit the model's context
        raise Refusal(EX_USAGE, str(exc)) from None
    sweep_s = round(time.perf_counter() - started, 1)
    when = dt.datetime.now(dt.UTC).replace(microsecond=0)
    tables = {}
    for kind, own in owns.items():
        result = results[kind]
        if own is not None:
            modes, drafter = own.modes, own.config
        else:
            modes = ("decode", "verify", "draft_dflash" if block is not None else "draft_mtp")
            drafter = asdict(block.cfg) if block is not None else None
        key = serve_table_key(recipe.id, recipe.config, s, meter.source, modes if params.max_depth else ("decode",),
                              req.box_override, drafter)
        meta = {"when": when, "met_version": __version__,
                "torch_version": torch.__version__, "python_version": platform.python_version(),
                "device": device_name(s.device), "dtype": s.dtype, "threads": s.threads,
                **({own.meta_field: own.id} if own is not None else {}),
                "sweep_s": sweep_s, **result.meta, **meter.info(),
                **({"quick": True} if req.quick else {})}
        try:
            tables[kind] = CostTable.parse(CostTable(key, result.cells, meta, result.verify_cells).to_toml())
        except TableParseError as exc:
            raise Refusal(EX_DATAERR, f"the measured table is invalid, so nothing was written: {exc}") from None
    return tables


def _write(items: list[tuple[Output, Existing, CostTable, AcceptanceCalibration | None]],
           reporter: Reporter) -> None:
    """Every file staged, then each renamed into place (each calibration before its table); then what changed.

    Staging all before replacing any means a full disk or a failed write replaces none; a joint sweep's
    tables are replaced all of them or none.
    """
    from met.bench.table_files import changes, commit_pair, remove_stale_temps, stage

    pairs: list[tuple[Path, Path]] = []
    try:
        for output, _, table, calibration in items:
            remove_stale_temps(output.out)
            remove_stale_temps(output.calibration_out)  # also under --no-calibrate: a killed run's temp is ours
            if calibration is not None:
                pairs.append((stage(output.calibration_out, calibration.to_toml()), output.calibration_out))
            pairs.append((stage(output.out, table.to_toml()), output.out))
    except OSError as exc:
        for temp, _ in pairs:
            temp.unlink(missing_ok=True)
        raise Refusal(EX_CANTCREAT, f"cannot write {exc.filename or items[0][0].out}: {exc.strerror or exc}; "
                      f"{_untouched(items)}") from None
    try:  # all of them, or none: a failed rename puts back the file it replaced
        commit_pair(pairs)
    except OSError as exc:
        raise Refusal(EX_CANTCREAT, f"cannot replace {exc.filename or items[0][0].out}: {exc.strerror or exc}; "
                      f"{_untouched(items)}") from None
    for output, old, table, calibration in items:
        path, cal_path = output.out, output.calibration_out
        if old.problem:  # said even under --quiet: a file was replaced that was no valid table
            say(f"warning: {path} {old.problem}; replaced it with the new table", err=True)
        if reporter.quiet:
            continue
        for line in changes(old, table):
            say(line)
        deeper = f", {len(table.verify_cells)} copy verify cells" if table.verify_cells else ""
        say(f"wrote {path} ({len(table.cells)} cells{deeper}, energy_source '{table.key.energy_source}', "
            f"sweep {table.meta['sweep_s']:.0f} s)")
        if calibration is not None:
            say(f"wrote {cal_path} ({calibration.outcomes} judged drafts, "
                f"{len(calibration.bins)} confidence bins, {len(calibration.position_priors)} position priors, "
                f"{len(calibration.carryover)} carry-over bins, {len(calibration.lookup)} prompt-lookup bins, "
                f"{len(calibration.shared_lookup)} shared-lookup bins)")


def _untouched(items: list[tuple[Output, Existing, CostTable, AcceptanceCalibration | None]]) -> str:
    """What a failed write says was kept: the one table and calibration, or every one of a joint sweep's."""
    if len(items) == 1:
        return "the table and calibration there before are untouched"
    return "the tables and calibrations there before are all untouched"


def _recipe(name: str) -> Recipe:
    from met.model.recipes import embedded
    from met.model.sources import is_path, resolve

    try:
        return resolve(name) if is_path(name) else embedded(name)
    except RecipeError as exc:
        raise Refusal(exc.status, str(exc)) from None


def _draft_recipe(recipe: Recipe, spec: str) -> Recipe:
    """The draft model's recipe; Refusal 65 if its tokenizer or vocabulary is not the recipe's, 66 if it is missing."""
    from met.model.sources import draft_model_for

    try:
        return draft_model_for(recipe, spec)
    except RecipeError as exc:
        raise Refusal(exc.status, f"--draft-model {spec}: {exc}") from None


def _own_drafter(recipe: Recipe, draft: Recipe | None, eagle: Path | None) -> OwnDrafter | None:
    """The draft model or EAGLE-3 head drafting instead of the MTP module, as its table is keyed; Refusal 65 or 66
    for a head that is none or not this recipe's."""
    from met.engine.identity import eagle_head, own_drafter
    from met.model.dflash import DrafterError

    if draft is not None:
        return own_drafter(draft)
    if eagle is None:
        return None
    try:
        return own_drafter(eagle_head(eagle, recipe.config))
    except DrafterError as exc:
        raise Refusal(exc.status, f"--eagle {eagle}: {exc}") from None


def _eagle_head(folder: Path, recipe: Recipe, settings: RunSettings) -> Eagle3Head:
    """The EAGLE-3 head, loaded to run; Refusal 65 or 66 if it cannot be."""
    import torch

    from met.model.dflash import DrafterError
    from met.model.eagle3 import load_eagle3

    try:
        return load_eagle3(folder, recipe.config, getattr(torch, settings.dtype), settings.device)
    except DrafterError as exc:
        raise Refusal(exc.status, f"--eagle {folder}: {exc}") from None


def _block_drafter(recipe: Recipe, settings: RunSettings) -> DflashDrafter:
    """The recipe's shipped DFlash drafter; Refusal 66 if there is none, 65 if it is unusable or another model's."""
    import torch

    from met.model.dflash import DrafterError, load_drafter, shipped_path

    try:
        return load_drafter(shipped_path(recipe), recipe.id, getattr(torch, settings.dtype), settings.device)
    except DrafterError as exc:
        raise Refusal(exc.status, str(exc)) from None


def _loop_prompts(recipe: Recipe, params: SweepParams) -> tuple[list[list[int]], Tokenizer] | None:
    """Prompts for the in-loop sweep, cycled to the widest width, and the tokenizer the scheduler streams with.

    Held-out file openings, each --context-len tokens at most: --context-len bytes for the byte
    tokenizer, for a checkpoint's own tokenizer the tokens of 8 x --context-len bytes cut to length.
    None (time the steps in windows instead) where no held-out files are readable, or the
    checkpoint folder has no tokenizer.json.
    """
    from met.model.corpus import heldout_prompts
    from met.model.sources import tokenizer_for
    from met.model.tokenizer import BYTES

    try:
        tokenizer = tokenizer_for(recipe)
    except RecipeError:
        return None
    per_token = 1 if tokenizer is BYTES else 8
    texts = heldout_prompts(max(params.widths), params.context_len * per_token)
    ids = [tokenizer.encode(t)[: params.context_len] for t in texts]
    ids = [i for i in ids if i]
    if not ids:
        return None
    return [ids[i % len(ids)] for i in range(max(params.widths))], tokenizer


def _without_drafter(req: Request, recipe: Recipe, params: SweepParams) -> SweepParams:
    """A model with no MTP module has no draft step: k = 0 only, no copy verify cells; an explicit ask for more is
    refused."""
    if req.depth_given and params.max_depth:
        raise Refusal(EX_USAGE, f"{recipe.name} has no MTP module, so there is no draft step to measure at "
                      f"--max-depth {params.max_depth}; drop --max-depth (its table holds k = 0 cells only)")
    if req.verify_depth_given and params.verify_depth:
        raise Refusal(EX_USAGE, f"{recipe.name} has no MTP module, and the measured planner copies only where it "
                      f"drafts, so there are no copies to verify (--verify-depth {params.verify_depth}); drop "
                      "--verify-depth (its table holds k = 0 cells only)")
    if req.calibrate_given:
        raise Refusal(EX_USAGE, f"{recipe.name} has no MTP drafter to calibrate; drop --calibrate")
    return replace(params, max_depth=0)


def _prompts(path: Path | None, params: cal.CalibrationParams) -> list[str]:
    from met.bench import calibrate as cal
    from met.engine.prompts import PromptError, PromptsMissing
    from met.model.corpus import root_named

    try:
        texts = cal.default_prompts(params) if path is None else cal.read_prompts(path, params)
    except PromptsMissing as exc:
        raise Refusal(EX_NOINPUT, f"--calibration-prompts {exc}") from None
    except PromptError as exc:
        raise Refusal(EX_DATAERR, f"--calibration-prompts {exc}") from None
    if not texts:
        raise Refusal(EX_NOINPUT, f"the model card's corpus has no held-out files here to calibrate on (read from "
                      f"{root_named()}); pass --calibration-prompts PATH or --no-calibrate")
    return texts
