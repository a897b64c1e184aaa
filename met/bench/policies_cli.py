"""`met bench policies`: every drafting policy on one held-out workload at several concurrencies, side by side.

The command parses, boots the measured planner's table exactly as `met serve --spec-cost-model
measured` does (met.bench.measured_boot: same key checks, same exit statuses; the draft model's
table as `met serve --spec draft --draft-model` boots it), runs the policies
(met.bench.policies), summarises and checks (met.bench.policies_report), and writes JSON,
markdown and a PNG (met.bench.policies_plot) under --out-dir, by default a new folder of the run's own
under met-results/ (the results kept in benchmarks/results/ are replaced only when --out-dir names them).
"""

from __future__ import annotations  # the run's types are imported where they are used: `met --help` needs none

import datetime as dt
import itertools
import json
import os
import platform
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from met import __version__
from met.bench.spec_cost_cli import EX_USAGE, parse_widths
from met.choices import DEFAULT_RECIPE, ENERGY_CHOICES, OPTIONAL_POLICIES, POLICIES
from met.exit_codes import EX_CANTCREAT, EX_NOINPUT, EX_OK, EX_SOFTWARE
from met.model.errors import RecipeError
from met.path_option import nonempty_model, nonempty_path

if TYPE_CHECKING:  # torch, the engine and the report are imported when the command runs
    from met.bench import policies as pol
    from met.bench.policies_report import Row
    from met.engine.identity import RunSettings

DEFAULTS = {"prompts": 16, "max_tokens": 128, "repeats": 3, "concurrency": "1,4,16"}
QUICK = {"prompts": 4, "max_tokens": 16, "repeats": 1, "concurrency": "1,2,4"}
OUT_NAMES = ("policies.json", "policies.md", "policies.png")
RESULTS_ROOT = Path("met-results")  # where a run without --out-dir makes its own folder

RecipeOpt = Annotated[str, typer.Option("--recipe", help="Embedded model recipe to run.")]
PromptsOpt = Annotated[int | None, typer.Option(
    "--prompts", min=1, help="Held-out code prompts in the workload (default: 16; --quick: 4).", show_default=False)]
MaxTokensOpt = Annotated[int | None, typer.Option(
    "--max-tokens", min=1, help="Tokens generated per prompt (default: 128; --quick: 16).", show_default=False)]
ConcurrencyOpt = Annotated[str | None, typer.Option(
    "--concurrency", help="Requests in flight, comma-separated (default: 1,4,16; --quick: 1,2,4).",
    show_default=False)]
RepeatsOpt = Annotated[int | None, typer.Option(
    "--repeats", min=1, max=100, help="Interleaved repeats; figures are medians (default: 3; --quick: 1).",
    show_default=False)]
PoliciesOpt = Annotated[str | None, typer.Option(
    "--policies", help=f"Comma-separated subset of: {', '.join(POLICIES)} (default: all of these, with "
    "--draft-model the draft-* ones too, with --eagle the eagle-* ones and the choice among every drafter given); "
    "also dflash (the recipe's DFlash drafter, its rung's gamma, as met serve --spec dflash), "
    f"{', '.join(p for p in OPTIONAL_POLICIES if p != 'dflash' and '+' not in p)} (the MTP policies of the same "
    "name drafting with --draft-model or --eagle, as met serve --spec draft or eagle), and the choices "
    f"{', '.join(p for p in OPTIONAL_POLICIES if '+' in p)}: one rule, <met serve --spec choice>-measured, each "
    "drafter named planning from its own table, the best plan run each step.", show_default=False)]
DraftModelOpt = Annotated[str | None, typer.Option(
    "--draft-model", parser=nonempty_model, help="Draft model of the draft-* policies: an embedded recipe name (e.g. "
    "met-tiny-py-draft) or a checkpoint folder with the recipe's tokenizer (as met serve --spec draft).",
    show_default=False)]
EagleOpt = Annotated[Path | None, typer.Option(
    "--eagle", parser=nonempty_path, help="EAGLE-3 head of the eagle-* policies: its folder (as met serve --spec "
    "eagle --drafter FOLDER, and met bench spec-cost --eagle FOLDER).", show_default=False)]
EagleTableOpt = Annotated[Path | None, typer.Option(
    "--eagle-table", parser=nonempty_path, help="Cost table of eagle-measured, measured with met bench spec-cost "
    "--eagle (default: tables/<box_class>/<recipe>.eagle-<head folder>.toml).", show_default=False)]
EagleCalibrationOpt = Annotated[Path | None, typer.Option(
    "--eagle-calibration", parser=nonempty_path, help="The EAGLE-3 head's calibration (default: beside "
    "--eagle-table).", show_default=False)]
DraftTableOpt = Annotated[Path | None, typer.Option(
    "--draft-table", parser=nonempty_path, help="Cost table of draft-measured, measured with met bench spec-cost "
    "--draft-model (default: tables/<box_class>/<recipe>.draft-<draft model>.toml).", show_default=False)]
DraftCalibrationOpt = Annotated[Path | None, typer.Option(
    "--draft-calibration", parser=nonempty_path, help="The draft model's calibration (default: beside --draft-table).",
    show_default=False)]
TableOpt = Annotated[Path | None, typer.Option(
    "--table", parser=nonempty_path, help="Cost table of the measured planner (default: "
    "tables/<box_class>/<recipe>.toml); also prices joules/token when it has energy.", show_default=False)]
CalibrationOpt = Annotated[Path | None, typer.Option(
    "--calibration", parser=nonempty_path, help="Drafter calibration (default: beside the table).", show_default=False)]
SlackOpt = Annotated[float, typer.Option(
    "--slack", min=0.0, max=0.99, help="The planner's --spec-cost-slack, as met serve (0: tokens/s alone).")]
EnergyOpt = Annotated[str, typer.Option(
    "--energy", help="Energy source the planner's key is checked under, as met serve: auto | nvml | rapl | none.")]
BoxClassOpt = Annotated[str | None, typer.Option(
    "--box-class", help="Box class (default: derived from the hardware).", show_default=False)]
DeviceOpt = Annotated[str | None, typer.Option(
    "--device", help="Torch device (default: cuda if available, else cpu).", show_default=False)]
DtypeOpt = Annotated[str | None, typer.Option(
    "--dtype", help="Model dtype (default: bfloat16 on cuda, float32 on cpu).", show_default=False)]
LiftOpt = Annotated[bool, typer.Option(
    "--lift-wide-tier", help="Let widths 9..=16 verify two drafts, as met serve --lift-wide-tier (the MTP and "
    "prompt-lookup policies; dflash sizes its own pools from its rung).")]
OutDirOpt = Annotated[Path | None, typer.Option(
    "--out-dir", parser=nonempty_path, help=f"Folder of the results: {', '.join(OUT_NAMES)} (default: a new folder "
    f"{RESULTS_ROOT}/policies-<UTC time>/ under the current one, so no run replaces results kept elsewhere).",
    show_default=False)]
QuickOpt = Annotated[bool, typer.Option(
    "--quick", help="4 prompts, 16 tokens, concurrency 1,2,4, 1 repeat: for tests and smoke runs.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", help="No progress lines; the report and errors only.")]


def _fail(code: int, *lines: str) -> typer.Exit:
    for line in lines:
        typer.echo(line, err=True)
    return typer.Exit(code)


def policies(
    recipe: RecipeOpt = DEFAULT_RECIPE,
    prompts: PromptsOpt = None,
    max_tokens: MaxTokensOpt = None,
    concurrency: ConcurrencyOpt = None,
    repeats: RepeatsOpt = None,
    policies_: PoliciesOpt = None,
    table: TableOpt = None,
    calibration: CalibrationOpt = None,
    draft_model: DraftModelOpt = None,
    draft_table: DraftTableOpt = None,
    draft_calibration: DraftCalibrationOpt = None,
    eagle: EagleOpt = None,
    eagle_table: EagleTableOpt = None,
    eagle_calibration: EagleCalibrationOpt = None,
    slack: SlackOpt = 0.1,
    energy: EnergyOpt = "auto",
    box_class_: BoxClassOpt = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
    lift_wide_tier: LiftOpt = False,
    out_dir: OutDirOpt = None,
    quick: QuickOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Run held-out code prompts through the scheduler under every drafting policy; tokens/s side by side.

    Policies: off; fixed-1..fixed-4 (MTP at that depth every step); static (MTP gate, ladder and
    adaptive rung: met serve --spec mtp); prompt-lookup; measured (the cost table's planner: met
    serve --spec mtp --spec-cost-model measured, which also copies from each request's history
    where its calibration's prompt-lookup bins say a copy pays more than drafting); and, only when
    named, dflash (the recipe's DFlash block drafter beside its weights, met serve --spec dflash).
    With --draft-model (by default, or when named): draft-fixed-1..draft-fixed-4 and
    draft-measured, the same policies drafting with the draft model (met serve --spec draft),
    draft-measured planning from the draft model's own table and calibration (--draft-table, booted
    as the serve boots it), and mtp+draft-measured, both planners, the better plan run each step
    (met serve --spec mtp+draft). With --eagle FOLDER: eagle-fixed-1..eagle-fixed-4 and
    eagle-measured, the same with an EAGLE-3 head (met serve --spec eagle --drafter FOLDER, its
    table --eagle-table), and by default the choice among every drafter given (mtp+eagle-measured,
    or mtp+draft+eagle-measured with --draft-model too); any choice is named
    <met serve --spec choice>-measured. Each runs at every concurrency, interleaved over the repeats (the order
    reversed every other repeat); greedy outputs must be identical everywhere. Prints and writes the
    report with PASS/FAIL for the planner's three checks (within 3% of every fixed depth, 10% ahead
    of the best fixed depth on average, 1.8x plain decode at concurrency 1) and, for each choice among
    drafters, a fourth (at least the best of its drafters' planners at every concurrency, 5% ahead of
    it on average), each paired ratio with
    a distribution-free interval for its median (from 5 repeats on), so a verdict within the box's
    noise reads as such (a FAIL there is a result, not an error: the status stays 0).

    Exit statuses: 0 results written (under --out-dir, else a new met-results/policies-<UTC time>/);
    2 bad option value (or fewer held-out prompts here than --prompts, or a draft-* policy without
    --draft-model, or an eagle-* one without --eagle); 65 (EX_DATAERR) a cost table or calibration
    is missing or invalid, or the DFlash drafter is damaged or another model's, or the draft model
    has another tokenizer or vocabulary than the recipe's, or the EAGLE-3 head is not one for the
    recipe; 66 (EX_NOINPUT) the recipe's weights, its DFlash drafter (policy dflash), the draft
    model, the EAGLE-3 head or the held-out files are missing; 69 (EX_UNAVAILABLE) the --energy
    source does not work here; 70 (EX_SOFTWARE) greedy outputs differ between policies or concurrencies, or a
    request failed (results are still written; each difference is named); 73 (EX_CANTCREAT) the
    results could not be written (the folder is checked before anything runs; the report is printed
    either way); 78 (EX_CONFIG) a table or calibration was measured under another key (the draft
    model's or head's: under another draft model or head, or for the MTP drafter).
    """
    import torch

    from met.bench import policies as pol
    from met.bench.measured_boot import (BootError, MeasuredBoot, boot_measured, default_calibration, default_table,
                                         energy_source)
    from met.bench.policies_identity import mismatches
    from met.bench.policies_report import checks, document, markdown, summarise
    from met.bench.progress import Reporter
    from met.engine.identity import DRIFT, EXACT_DTYPES, box_class, device_name, eagle_head, resolve_run
    from met.model.corpus import root_named
    from met.model.dflash import DrafterError, load_drafter, shipped_path
    from met.model.eagle3 import load_eagle3
    from met.model.recipes import embedded
    from met.model.sources import draft_model_for
    from met.speculative.spec_capacity import DEFAULT_POOLS, VerifyPools

    base = QUICK if quick else DEFAULTS
    names = _policy_names(policies_, draft_model is not None, eagle is not None)
    drafting = [n for n in names if "draft" in pol.policy_drafters(n)]  # the policies that draft with the draft model
    heading = [n for n in names if "eagle" in pol.policy_drafters(n)]  # and those with the EAGLE-3 head
    if drafting and draft_model is None:
        raise typer.BadParameter(f"{', '.join(drafting)} draft with a draft model: pass --draft-model NAME|PATH "
                                 "(e.g. met-tiny-py-draft)", param_hint="--policies")
    if heading and eagle is None:
        raise typer.BadParameter(f"{', '.join(heading)} draft with an EAGLE-3 head: pass --eagle FOLDER",
                                 param_hint="--policies")
    if (draft_table is not None or draft_calibration is not None) and draft_model is None:
        raise typer.BadParameter("--draft-table and --draft-calibration are the draft model's: pass --draft-model "
                                 "too", param_hint="--draft-table")
    if (eagle_table is not None or eagle_calibration is not None) and eagle is None:
        raise typer.BadParameter("--eagle-table and --eagle-calibration are the EAGLE-3 head's: pass --eagle too",
                                 param_hint="--eagle-table")
    if energy not in ENERGY_CHOICES:
        raise typer.BadParameter(f"{energy!r} is not one of {', '.join(ENERGY_CHOICES)}", param_hint="--energy")
    try:
        settings = resolve_run(device, dtype)
        device = settings.device
        box = box_class(device, box_class_)
    except (RuntimeError, ValueError) as exc:
        raise typer.BadParameter(str(exc)) from None
    concurrencies = _concurrencies(concurrency if concurrency is not None else base["concurrency"])
    try:
        model_recipe = embedded(recipe)
    except RecipeError as exc:  # its status: 66 missing, 65 a damaged card
        raise _fail(exc.status, f"error: {exc}") from None
    count = prompts or base["prompts"]
    heldout = pol.heldout_workload_prompts(count)
    if not heldout:
        raise _fail(EX_NOINPUT, "error: the model card's corpus has no held-out files here long enough for prompts "
                    f"(read from {root_named()})")
    if len(heldout) < count:
        raise _fail(EX_USAGE, f"error: only {len(heldout)} held-out code prompts are available here (read from "
                    f"{root_named()}); pass --prompts {len(heldout)} or fewer")
    try:
        draft_recipe = draft_model_for(model_recipe, draft_model) if draft_model is not None else None
    except RecipeError as exc:  # its status: 66 missing, 65 another tokenizer or vocabulary, or unusable
        raise _fail(exc.status, f"error: --draft-model {draft_model}: {exc}") from None
    try:
        head_id = eagle_head(eagle, model_recipe.config) if eagle is not None else None
    except DrafterError as exc:  # its status: 66 missing, 65 not a head for this recipe
        raise _fail(exc.status, f"error: --eagle {eagle}: {exc}") from None
    longest = max(len(p) for p in heldout)
    for r in [model_recipe] + ([draft_recipe] if draft_recipe is not None else []):
        if longest + 1 > r.config.max_seq_len:
            raise _fail(EX_USAGE, f"error: a prompt of {longest} tokens does not fit the context of "
                        f"{r.config.max_seq_len} of recipe {r.name}")
    table_path = draft_table_path = eagle_table_path = None
    cost_state = draft_state = eagle_state = None
    choosing = {d for n in names if n in pol.CHOICE_POLICIES for d in pol.policy_drafters(n)}
    planned = "measured" in names or "mtp" in choosing or table is not None
    draft_planned = "draft-measured" in names or "draft" in choosing or draft_table is not None
    eagle_planned = "eagle-measured" in names or "eagle" in choosing or eagle_table is not None
    if not planned and not draft_planned and not eagle_planned:
        try:  # no table prices joules here, but a source asked for by name must work, as with a table
            energy_source(energy, settings.device)
        except BootError as exc:
            raise _fail(exc.code, *exc.lines) from None
    try:
        if planned:
            table_path = table or default_table(box, model_recipe.name)
            cost_state = boot_measured(model_recipe, settings, MeasuredBoot(
                table_path, calibration or default_calibration(table_path), slack, energy, box_class_,
                table_option="--table"))
        if draft_planned:
            draft_table_path = draft_table or default_table(box, model_recipe.name, draft_recipe.name)
            draft_state = boot_measured(model_recipe, settings, MeasuredBoot(
                draft_table_path, draft_calibration or default_calibration(draft_table_path), slack, energy,
                box_class_, table_option="--draft-table"), draft=draft_recipe)
        if eagle_planned:
            eagle_table_path = eagle_table or default_table(box, model_recipe.name, eagle_name=head_id.name)
            eagle_state = boot_measured(model_recipe, settings, MeasuredBoot(
                eagle_table_path, eagle_calibration or default_calibration(eagle_table_path), slack, energy,
                box_class_, table_option="--eagle-table"), draft=head_id)
    except BootError as exc:
        raise _fail(exc.code, *exc.lines) from None
    drafter = None
    if "dflash" in names:
        try:
            drafter = load_drafter(shipped_path(model_recipe), model_recipe.id, getattr(torch, settings.dtype),
                                   settings.device)
        except DrafterError as exc:  # its status: 66 missing, 65 damaged or another model's
            raise _fail(exc.status, f"error: {exc}") from None
    pools = VerifyPools(DEFAULT_POOLS.tiers, lift_wide_tier=lift_wide_tier)
    try:
        factories = pol.policy_factories(names, model_recipe.config.mtp_depth, pools, cost_state, os.environ,
                                         drafter.block if drafter is not None else None, bool(drafting), draft_state,
                                         bool(heading), eagle_state)
        workload = pol.Workload(tuple(heldout), max_tokens or base["max_tokens"],
                                concurrencies, repeats or base["repeats"])
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    out_dir = out_dir or fresh_out_dir(dt.datetime.now(dt.UTC))
    _check_out_dir(out_dir)
    model = model_recipe.load(getattr(torch, settings.dtype), settings.device)
    # loaded only for a policy that drafts with it: a runner holding it pays its bookkeeping every step
    small = draft_recipe.load(getattr(torch, settings.dtype), settings.device) if drafting else None
    try:  # likewise: a runner holding the head hands it the target's features at every step
        head = load_eagle3(eagle, model_recipe.config, getattr(torch, settings.dtype), settings.device) \
            if heading else None
    except DrafterError as exc:
        raise _fail(exc.status, f"error: --eagle {eagle}: {exc}") from None
    load = os.getloadavg()
    if settings.dtype not in EXACT_DTYPES and set(names) != {"off"}:  # before the run, not after its minutes
        typer.echo(f"warning: in {settings.dtype} {DRIFT}: greedy outputs may differ between policies (exit 70); "
                   "--dtype float32 (with a table measured in it) keeps them identical", err=True)
    with Reporter(quiet) as reporter:
        reporter.say(f"running {len(names)} policies x concurrency {','.join(map(str, concurrencies))} x "
                     f"{workload.repeats} repeats: {len(heldout)} prompts of {workload.max_tokens} tokens, "
                     f"{model_recipe.id} on {settings.device} ({settings.dtype}, {settings.threads} threads)")
        runs = pol.run_all(model, model_recipe.id, factories, workload,
                           lambda done, total, label: reporter.step("runs", done, total, label), drafter, small,
                           head)
    rows = summarise(runs, cost_state.table if cost_state else None, draft_state.table if draft_state else None,
                     eagle_state.table if eagle_state else None)
    results = checks(rows, runs)
    problems = mismatches(runs)
    meta = {
        "command": _command(recipe, workload, names, table_path, calibration, slack, energy, box_class_,
                            settings, lift_wide_tier, out_dir, draft_model, draft_table_path, draft_calibration,
                            eagle, eagle_table_path, eagle_calibration),
        "argv": sys.argv, "when": dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(),
        "recipe": model_recipe.id,
        "machine": {"box_class": box, "device": device_name(settings.device), "torch_device": settings.device,
                    "dtype": settings.dtype, "threads": settings.threads, "cpu_count": os.cpu_count(),
                    "load_average_at_start": [round(x, 2) for x in load], "torch": torch.__version__,
                    "python": platform.python_version(), "met": __version__, "platform": platform.platform()},
        "table": str(table_path) if table_path else None,
        "calibration": str(calibration or default_calibration(table_path)) if table_path else None,
        "energy_source": next((s.table.key.energy_source for s in (cost_state, draft_state, eagle_state) if s),
                              None),
        **({"draft_model": draft_recipe.id,
            "draft_table": str(draft_table_path) if draft_table_path else None,
            "draft_calibration": str(draft_calibration or default_calibration(draft_table_path))
            if draft_table_path else None} if draft_recipe is not None else {}),
        **({"eagle_head": head_id.id,
            "eagle_table": str(eagle_table_path) if eagle_table_path else None,
            "eagle_calibration": str(eagle_calibration or default_calibration(eagle_table_path))
            if eagle_table_path else None} if head_id is not None else {}),
        "slack": slack, "pools": f"{pools.tiers}, lift_wide_tier={pools.lift_wide_tier}",
        "workload": {"prompts": len(heldout), "max_tokens": workload.max_tokens,
                     "concurrencies": list(concurrencies), "repeats": workload.repeats, "policies": names,
                     "prompt_source": f"held-out stdlib files, {pol.PROMPT_BYTES} bytes from the first line start "
                                      f"after byte {pol.PROMPT_OFFSET}"},
    }
    report = markdown(meta, rows, results, problems)
    typer.echo(report)  # first: should the writes fail, the run's results are still on the screen
    _write(out_dir, meta, report, document(meta, rows, results, runs, problems), rows)
    if not quiet:
        typer.echo(f"results written under {out_dir}", err=True)
    if problems:
        failed = sum(p.failed for p in problems)
        head = ([f"{failed} request(s) failed"] if failed else []) + (
            [f"greedy outputs differ in {len(problems) - failed} request(s); speculation must never change greedy "
             "text"] if failed < len(problems) else [])
        lines = [f"error: {'; '.join(head)}:"] + [f"  {p.message()}" for p in problems[:10]]
        if len(problems) > 10:
            lines.append(f"  ... and {len(problems) - 10} more (all in {out_dir / OUT_NAMES[0]})")
        if failed < len(problems) and settings.dtype not in EXACT_DTYPES:  # as on an H200 in bf16 (README)
            lines.append(f"  in {settings.dtype} {DRIFT}: --dtype float32 (with a table measured in it) keeps greedy "
                         "text identical")
        raise _fail(EX_SOFTWARE, *lines)
    raise typer.Exit(EX_OK)


def _concurrencies(text: str) -> tuple[int, ...]:
    try:
        return parse_widths(text)
    except typer.BadParameter as exc:
        raise typer.BadParameter(exc.message.replace("1,2,4,8,16", "1,4,16"), param_hint="--concurrency") from None


def _policy_names(text: str | None, draft_model: bool = False, eagle: bool = False) -> list[str]:
    """The policies --policies names; by default POLICIES, the draft model's (DRAFT_POLICIES) when one is given, the
    EAGLE-3 head's (EAGLE_POLICIES) and the choice among every drafter given when a head is."""
    from met.bench.policies import DRAFT_POLICIES, EAGLE_POLICIES

    choices = POLICIES + OPTIONAL_POLICIES
    if text is None:
        every = "+".join(["mtp", *(["draft"] if draft_model else []), "eagle"]) + "-measured"
        return list(POLICIES) + (list(DRAFT_POLICIES) if draft_model else []) + \
            ([*EAGLE_POLICIES, every] if eagle else [])
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in choices]
    if unknown or not names:
        raise typer.BadParameter(f"{', '.join(unknown) or text!r} not among {', '.join(choices)}",
                                 param_hint="--policies")
    if len(set(names)) != len(names):
        raise typer.BadParameter(f"{text!r} names a policy twice", param_hint="--policies")
    return names


def _command(recipe: str, workload: pol.Workload, names: list[str], table: Path | None, calibration: Path | None,
             slack: float, energy: str, box_override: str | None, settings: RunSettings, lift: bool,
             out_dir: Path, draft_model: str | None = None, draft_table: Path | None = None,
             draft_calibration: Path | None = None, eagle: Path | None = None, eagle_table: Path | None = None,
             eagle_calibration: Path | None = None) -> str:
    """The command line that repeats this run, every option spelled out."""
    args = ["met", "bench", "policies", "--recipe", recipe, "--prompts", str(len(workload.prompts)),
            "--max-tokens", str(workload.max_tokens), "--concurrency", ",".join(map(str, workload.concurrencies)),
            "--repeats", str(workload.repeats), "--policies", ",".join(names)]
    if table is not None:
        args += ["--table", str(table)]
    if calibration is not None:
        args += ["--calibration", str(calibration)]
    if draft_model is not None:
        args += ["--draft-model", draft_model]
    if draft_table is not None:
        args += ["--draft-table", str(draft_table)]
    if draft_calibration is not None:
        args += ["--draft-calibration", str(draft_calibration)]
    for option, value in (("--eagle", eagle), ("--eagle-table", eagle_table), ("--eagle-calibration",
                                                                              eagle_calibration)):
        if value is not None:
            args += [option, str(value)]
    args += ["--slack", f"{slack:g}", "--energy", energy]
    if box_override:
        args += ["--box-class", box_override]
    args += ["--device", settings.device, "--dtype", settings.dtype]
    if lift:
        args.append("--lift-wide-tier")
    return shlex.join([*args, "--out-dir", str(out_dir)])


def fresh_out_dir(now: dt.datetime) -> Path:
    """A folder of its own for this run's results, made now: met-results/policies-20261201T231500Z (-2, -3, ...)."""
    stamp = f"policies-{now:%Y%m%dT%H%M%SZ}"
    for i in itertools.count(1):
        path = RESULTS_ROOT / (stamp if i == 1 else f"{stamp}-{i}")
        try:
            path.mkdir(parents=True)
        except FileExistsError:  # a run in the same second: the next name
            continue
        except OSError:  # unwritable here: _check_out_dir says so in one line, before anything runs
            return path
        return path


def _check_out_dir(out_dir: Path) -> None:
    """Exit 73 before anything runs if the results could not be written there (a file in the way, no permission)."""
    from met.bench.table_files import check_writable

    try:
        check_writable(out_dir / OUT_NAMES[0])  # makes the folder, and a temp file in it as _write will
        taken = [name for name in OUT_NAMES if (out_dir / name).is_dir()]
        if taken:
            raise OSError(f"{out_dir / taken[0]} is a folder")
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise _fail(EX_CANTCREAT, f"error: cannot write the results under {out_dir}: {why}; nothing was run") from None


def _write(out_dir: Path, meta: dict, report: str, doc: dict, rows: list[Row]) -> None:
    """The JSON, the markdown and the PNG (none without matplotlib, with a warning), all staged, then each renamed.

    A set is replaced whole or not at all (but for a failure between the renames): no new JSON
    beside an old plot.
    """
    from met.bench.policies_plot import PlotUnavailable, plot  # matplotlib, if it is there
    from met.bench.table_files import commit, stage

    staged: list[tuple[Path, Path]] = []
    try:
        staged.append((stage(out_dir / OUT_NAMES[0], json.dumps(doc, indent=1) + "\n"), out_dir / OUT_NAMES[0]))
        staged.append((stage(out_dir / OUT_NAMES[1], report), out_dir / OUT_NAMES[1]))
        png = stage(out_dir / OUT_NAMES[2], "")  # an empty temp file beside it, for the plot to fill
        staged.append((png, out_dir / OUT_NAMES[2]))
        try:
            plot(rows, f"tokens/s by concurrency: {meta['recipe']} on {meta['machine']['box_class']}", png)
        except PlotUnavailable as exc:
            typer.echo(f"warning: no {OUT_NAMES[2]}: {exc}", err=True)
            staged.pop()[0].unlink()
        for temp, path in staged:
            commit(temp, path)
    except OSError as exc:
        for temp, _ in staged:
            temp.unlink(missing_ok=True)
        raise _fail(EX_CANTCREAT, f"error: cannot write the results under {out_dir}: {exc.strerror or exc}; "
                    "the report above was not saved") from None
