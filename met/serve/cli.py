"""`met serve` and `met top`: the server and its live dashboard."""

from __future__ import annotations  # the serve's types are imported where they are used: `met --help` needs none

import ipaddress
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from met.bench.table_warnings import MAX_AGE_DAYS, table_warnings
from met.bench.tables_cli import measured_ago
from met.choices import DEFAULT_RECIPE, LOG_LEVELS, MAX_THREADS, NGRAM_MAX, SERVE_SPECS
from met.exit_codes import EX_DATAERR, EX_NOINPUT, EX_UNAVAILABLE
from met.model.errors import RecipeError
from met.path_option import nonempty_model, nonempty_path

if TYPE_CHECKING:  # torch, the engine, fastapi and uvicorn are imported when the command runs
    from met.engine.identity import RunSettings
    from met.serve.app import Service
    from met.serve.auth import KeyRing
    from met.speculative.spec_cost import SpecCostState

COST_MODELS = ("static", "measured")
ENERGY = ("auto", "nvml", "rapl", "none")


def _fail(code: int, *lines: str) -> typer.Exit:
    for line in lines:
        typer.echo(line, err=True)
    return typer.Exit(code)


def serve(
    model: Annotated[str, typer.Option(
        parser=nonempty_model,
        help="Embedded recipe name, or a Hugging Face checkpoint folder (Llama, Mistral, Qwen2, Qwen3) to serve.")] = DEFAULT_RECIPE,
    spec: Annotated[str | None, typer.Option(
        help=f"Drafting: {' | '.join(SERVE_SPECS)} (default: mtp if the model has an MTP module, else "
             "prompt-lookup; with --draft-model and --spec-cost-model measured, mtp+draft on a model with an MTP "
             "module, else draft). A `+`-joined spec (mtp, draft, eagle, in that order) is the measured planner "
             "choosing every step among those drafters, each from its own default table.", show_default=False)] = None,
    spec_cost_model: Annotated[str, typer.Option(
        help="static: the MTP gate, ladder and adaptive rung; measured: plan depth from the cost table "
             "(--spec mtp, draft, eagle or a `+`-joined choice of them), and copy from each request's history "
             "instead where the calibration's "
             "prompt-lookup bins say a copy pays more.")] = "static",
    spec_cost_table: Annotated[Path | None, typer.Option(
        parser=nonempty_path, help="Cost table (default: tables/<box_class>/<recipe>.toml; with --spec draft, "
        "<recipe>.draft-<draft model>.toml there; with --spec eagle, <recipe>.eagle-<head folder>.toml).",
        show_default=False)] = None,
    calibration: Annotated[Path | None, typer.Option(
        parser=nonempty_path, help="Drafter calibration (default: beside the table, <recipe>.calibration.toml).",
        show_default=False)] = None,
    spec_cost_slack: Annotated[float, typer.Option(
        min=0.0, max=0.99, help="Tokens/s the planner may give up for tokens/J (0.1: within 10% of the best).")] = 0.1,
    energy: Annotated[str, typer.Option(
        help="Energy source this serve plans with (as met bench spec-cost --energy): auto | nvml | rapl | none.",
    )] = "auto",
    box_class: Annotated[str | None, typer.Option(
        "--box-class", help="Box class of this serve (default: derived from the hardware).", show_default=False,
    )] = None,
    max_batch: Annotated[int, typer.Option(min=1, max=256, help="Sequences decoded together (KV slots).")] = 16,
    table_max_age: Annotated[int, typer.Option(
        min=0, help="Days after which the cost table is warned about at boot as old (0: never).")] = MAX_AGE_DAYS,
    max_len: Annotated[int, typer.Option(min=0, help="Context per sequence (0: the model's, at most 2048).")] = 0,
    lift_wide_tier: Annotated[bool, typer.Option(
        help="Let widths 9..=16 verify two drafts (the adaptive rung's lift); default pools clamp them to one. "
             "Not with --spec dflash, whose pools hold the DFlash rung's widths.",
    )] = False,
    lookup_depth: Annotated[int, typer.Option(
        min=1, max=16, help="Most drafts per step for ngram / prompt-lookup; the verify pools clamp it as MTP's: "
        "4 at widths 1..=8, 1 at 9..=16 (2 with --lift-wide-tier), shown as clamp:pool in the snapshot's why.")] = 4,
    lookup_min_ngram: Annotated[int, typer.Option(
        min=1, max=NGRAM_MAX, help="ngram / prompt-lookup: the shortest match of the text's end that proposes "
        "drafts (a longer one is likelier accepted; where a verified draft costs much, as on a CPU, 3 pays).")] = 1,
    drafter: Annotated[Path | None, typer.Option(
        parser=nonempty_path,
        help="DFlash drafter for --spec dflash (default: <recipe>.dflash.safetensors beside its weights); for "
        "--spec eagle (and a choice naming eagle), the EAGLE-3 head's folder.", show_default=False)] = None,
    draft_model: Annotated[str | None, typer.Option(
        parser=nonempty_model, help="Draft model for --spec draft (and a choice naming draft): an embedded recipe "
        "name (e.g. "
        "met-tiny-py-draft) "
        "or a checkpoint folder with the model's tokenizer and vocabulary.", show_default=False)] = None,
    draft_depth: Annotated[int | None, typer.Option(
        min=1, max=16, help="--spec draft, eagle and the choices naming them: the drafter's most drafts per step "
        "(default: 4, what the verify "
        "pools hold at widths 1..=8), the ladder's at widths 1..=8 and the planner's deepest; the pools clamp it as "
        "MTP's.", show_default=False)] = None,
    device: Annotated[str | None, typer.Option(
        help="Torch device (default: cuda if available, else cpu).", show_default=False)] = None,
    dtype: Annotated[str | None, typer.Option(
        help="Model dtype (default: bfloat16 on cuda, float32 on cpu).", show_default=False)] = None,
    threads: Annotated[int, typer.Option(min=0, max=MAX_THREADS,
                                         help="torch CPU threads (0: the default, as the bench: 1 on a CPU).")] = 0,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on.")] = 8000,
    api_key: Annotated[list[str] | None, typer.Option(
        "--api-key", help="A key clients must send (Bearer); tenant \"default\". Repeatable.", show_default=False,
    )] = None,
    api_keys_file: Annotated[Path | None, typer.Option(
        parser=nonempty_path,
        help="File of `KEY TENANT` lines: each key's requests share lookups only within its tenant.",
        show_default=False)] = None,
    open_metrics: Annotated[bool, typer.Option(
        "--open-metrics", help="With keys configured, let clients on loopback (a local scraper) read /metrics and "
        "/v1/snapshot without a key; every other client still needs one.")] = False,
    tui_: Annotated[bool, typer.Option("--tui", help="Show the live dashboard in this terminal.")] = False,
    log_level: Annotated[str, typer.Option(help=f"uvicorn log level: {' | '.join(LOG_LEVELS)}.")] = "info",
) -> None:
    """Serve an OpenAI-compatible API (/v1/completions, /v1/chat/completions, /v1/models, /tokenize, /health, ...).

    A request without a temperature samples at temperature 1.0 (OpenAI's default), so its text varies
    from run to run; send "temperature": 0 for greedy text (the same with speculation as without).
    At boot a measured table gets one warning line each if it is narrower than --max-batch, a --quick
    table, or older than --table-max-age days.

    --spec draft drafts with --draft-model, a smaller model of the same tokenizer with a KV cache of
    its own, in the MTP module's place: the gate, ladder and rung, or the measured planner from the
    draft model's own table and calibration, choose its depth. --spec eagle does the same with the
    EAGLE-3 head in --drafter FOLDER (measured: from <recipe>.eagle-<folder>.toml, which met bench
    spec-cost --eagle FOLDER writes). A `+`-joined spec (mtp+draft, mtp+eagle, draft+eagle,
    mtp+draft+eagle) holds every drafter it names and plans each step with the one whose own table
    and calibration expect the most; each drafter's table is read from its default path.

    Exit statuses: 0 drained and stopped (SIGTERM or Ctrl-C); 2 bad option (e.g. --spec draft without
    --draft-model or the reverse, or a draft model of a shorter context than the serve's); 65
    (EX_DATAERR) the cost table or calibration is missing or invalid, or the keys file is, or the
    checkpoint folder cannot be served (unsupported architecture), or the DFlash drafter is not this
    model's, or the draft model has another tokenizer or vocabulary than the model's; 66 (EX_NOINPUT)
    the recipe's weights, the folder's files (the draft model's too), the keys file or the DFlash
    drafter are missing; 69 (EX_UNAVAILABLE) the --energy source does not work here, or it cannot
    listen on --host:--port (in use, not this machine's address, or does not resolve; checked before
    the model loads); 78 (EX_CONFIG) the table or calibration was measured under another key (each
    mismatch listed: a table or calibration of another draft model or EAGLE-3 head names the plan
    digest and the drafter). The draft model's tokenizer, vocabulary and context are checked before the port
    and before any model loads.
    """
    import torch

    from met.bench.measured_boot import BootError, MeasuredBoot, boot_measured, default_calibration, default_table
    from met.engine import heap
    from met.engine.identity import box_class as derive_box_class, eagle_head, resolve_run, speculation_drift_warning
    from met.engine.policy import CHOICE, CHOICES, CHOOSABLE, DRAFT_DEPTH, PLANNED_SPECS, PolicyConfig, choice_drafters
    from met.model.chat_template import template_for
    from met.model.dflash import DrafterError, load_drafter, shipped_path
    from met.model.eagle3 import load_eagle3
    from met.model.sources import context_len, draft_model_for, resolve, tokenizer_for
    from met.serve import server, tui
    from met.serve.app import Service, create_app
    from met.speculative.spec_capacity import DEFAULT_POOLS, VerifyPools

    if spec is not None and spec not in SERVE_SPECS:
        raise typer.BadParameter(f"{spec!r} is not one of {', '.join(SERVE_SPECS)}", param_hint="--spec")
    if spec_cost_model not in COST_MODELS:
        raise typer.BadParameter(f"{spec_cost_model!r} is not one of {', '.join(COST_MODELS)}",
                                 param_hint="--spec-cost-model")
    if spec_cost_model == "measured" and spec not in (*PLANNED_SPECS, None):
        raise typer.BadParameter(f"the measured planner plans MTP, draft-model or EAGLE-3 depth; --spec {spec} has no "
                                 "calibrated drafter (use --spec mtp, draft, eagle, a choice of them such as "
                                 "mtp+draft or --spec-cost-model static)", param_hint="--spec-cost-model")
    drafters = choice_drafters(spec) if spec in CHOICES else (spec,) if spec in CHOOSABLE else ()
    if spec in CHOICES and spec_cost_model != "measured":
        raise typer.BadParameter(f"--spec {spec} chooses by the drafters' measured tables; pass --spec-cost-model "
                                 "measured", param_hint="--spec")
    if (draft_model is not None) != ("draft" in drafters) and not (spec is None and spec_cost_model == "measured"):
        raise typer.BadParameter("--spec draft (and a choice naming draft, e.g. mtp+draft) drafts with --draft-model: "
                                 "give both or neither", param_hint="--draft-model")
    if draft_depth is not None and not {"draft", "eagle"} & set(drafters) and draft_model is None:
        raise typer.BadParameter("the drafter's depth, for --spec draft, mtp+draft and eagle only (and the other "
                                 "choices naming draft or eagle); this serve would not use it",
                                 param_hint="--draft-depth")
    if drafter is not None and spec != "dflash" and "eagle" not in drafters:
        raise typer.BadParameter(f"the DFlash drafter of --spec dflash or the EAGLE-3 head of --spec eagle; --spec "
                                 f"{spec or 'mtp'} would not use it", param_hint="--drafter")
    if "eagle" in drafters and drafter is None:
        raise typer.BadParameter(f"--spec {spec} drafts with an EAGLE-3 head: pass its folder", param_hint="--drafter")
    if spec in CHOICES and (spec_cost_table is not None or calibration is not None):
        raise typer.BadParameter(f"--spec {spec} reads each drafter's table and calibration from its default path "
                                 "(tables/<box_class>/<recipe>.toml, <recipe>.draft-<draft model>.toml, "
                                 "<recipe>.eagle-<head folder>.toml)", param_hint="--spec-cost-table")
    if lift_wide_tier and spec == "dflash":
        raise typer.BadParameter("it lifts the MTP verify pools; --spec dflash sizes its pools from the DFlash rung "
                                 "(its gamma at every width, up to the drafter's block)", param_hint="--lift-wide-tier")
    if energy not in ENERGY:
        raise typer.BadParameter(f"{energy!r} is not one of {', '.join(ENERGY)}", param_hint="--energy")
    if log_level.lower() not in LOG_LEVELS:
        raise typer.BadParameter(f"{log_level!r} is not one of {', '.join(LOG_LEVELS)}",
                                 param_hint="--log-level")
    keys = _keys(api_key or [], api_keys_file, open_metrics)
    try:
        settings = resolve_run(device, dtype, threads)
        box = derive_box_class(settings.device, box_class)
    except (RuntimeError, ValueError) as exc:
        raise typer.BadParameter(str(exc)) from None
    try:
        recipe = resolve(model)
        tokenizer = tokenizer_for(recipe)
        chat = template_for(recipe)  # None: the folder has none, and chat completions say so
        small = draft_model_for(recipe, draft_model) if draft_model is not None else None  # its tokenizer checked
    except RecipeError as exc:
        raise _fail(exc.status, f"error: {exc}") from None
    try:
        context = context_len(recipe, max_len)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--max-len") from None
    if small is not None and small.config.max_seq_len < context:  # its cache holds as many tokens as the target's
        raise typer.BadParameter(f"{small.name}'s context of {small.config.max_seq_len} tokens is shorter than the "
                                 f"serve's {context}; pass --max-len {small.config.max_seq_len} or less",
                                 param_hint="--draft-model")
    if spec is None and small is not None:  # measured, a draft model: beside the MTP module if there is one
        spec = CHOICE if recipe.config.mtp_depth else "draft"
    if spec is None:
        spec = "mtp" if recipe.config.mtp_depth or spec_cost_model == "measured" else "prompt-lookup"
    drafters = choice_drafters(spec) if spec in CHOICES else (spec,) if spec in CHOOSABLE else ()
    if spec in CHOICES and "mtp" in drafters and not recipe.config.mtp_depth:
        rest = spec.removeprefix("mtp+")
        raise typer.BadParameter(f"{recipe.name} has no MTP module to choose beside the other drafters; use --spec "
                                 f"{rest}", param_hint="--spec")
    if spec == "mtp" and not recipe.config.mtp_depth:
        hint = "use --spec ngram or prompt-lookup" + (" with --spec-cost-model static" if spec_cost_model != "static"
                                                      else "")
        raise typer.BadParameter(f"{recipe.name} has no MTP module to draft with; {hint}", param_hint="--spec")
    head_id = None
    if "eagle" in drafters and spec_cost_model == "measured":  # its table is keyed by its files: read before the port
        try:
            head_id = eagle_head(drafter, recipe.config)
        except DrafterError as exc:
            raise _fail(exc.status, f"error: {exc}") from None
    states: dict[str, SpecCostState] = {}
    tables: list[Path] = []
    if spec_cost_model == "measured":
        own = {"draft": small, "eagle": head_id}
        try:
            for name in drafters:  # each drafter's own table and calibration, at its default path in a choice
                path = default_table(box, recipe.name, small.name if name == "draft" else None,
                                     head_id.name if name == "eagle" else None)
                if len(drafters) == 1 and spec_cost_table is not None:  # a choice refused these options above
                    path = spec_cost_table
                cal = calibration if len(drafters) == 1 and calibration is not None else default_calibration(path)
                states[name] = boot_measured(recipe, settings, MeasuredBoot(path, cal, spec_cost_slack, energy,
                                                                            box_class), draft=own.get(name))
                tables.append(path)
        except BootError as exc:
            raise _fail(exc.code, *exc.lines) from None
    cost_state = states[drafters[0]] if len(drafters) == 1 and states else None
    try:
        server.check_bind(host, port)  # a port in use fails now, not after the model loads
    except server.BindError as exc:
        raise _fail(EX_UNAVAILABLE, f"error: {exc}") from None
    try:
        net = recipe.load(getattr(torch, settings.dtype), settings.device)
        small_net = small.load(getattr(torch, settings.dtype), settings.device) if small is not None else None
    except RecipeError as exc:
        raise _fail(exc.status, f"error: {exc}") from None
    block = head = None
    try:
        if spec == "dflash":
            block = load_drafter(drafter or shipped_path(recipe), recipe.id, getattr(torch, settings.dtype),
                                 settings.device)
        if "eagle" in drafters:
            head = load_eagle3(drafter, recipe.config, getattr(torch, settings.dtype), settings.device)
    except DrafterError as exc:
        raise _fail(exc.status, f"error: {exc}") from None
    pools = VerifyPools(DEFAULT_POOLS.tiers, lift_wide_tier=lift_wide_tier)
    names = (recipe.name, recipe.id) + ((model,) if model not in (recipe.name, recipe.id) else ())
    config = PolicyConfig(spec, lookup_depth, lookup_min_ngram, pools, draft_depth or DRAFT_DEPTH)
    service = Service.build(net, recipe.id, names, config, max_batch, context, cost_state, keys, tokenizer, block,
                            chat, small_net, head, cost_states=states if len(drafters) > 1 else None)
    heap.settle()  # boot's objects out of the collector's full passes for the life of the serve
    _banner(service, recipe.id, host, port, settings, box, tables, keys,
            (small.id, config.draft_depth) if small is not None else None,
            (drafter.name, config.draft_depth) if head is not None else None)
    if (warning := speculation_drift_warning(settings.dtype, spec)) is not None:
        typer.echo(f"  {warning}", err=True)
    for state, path in zip(states.values(), tables):
        for line in table_warnings(state.table, path, max_batch, table_max_age):
            typer.echo(f"  {line}", err=True)  # narrower than --max-batch, a --quick table, an old one
    app = create_app(service)
    try:
        if tui_:
            with tui.live_local(service.scheduler.cell):
                code = server.run(app, host, port, "warning")
        else:
            code = server.run(app, host, port, log_level)
    except server.BindError as exc:  # taken while the model loaded
        raise _fail(EX_UNAVAILABLE, f"error: {exc}") from None
    raise typer.Exit(code)


def _keys(api_keys: list[str], keys_file: Path | None, open_metrics: bool = False) -> KeyRing:
    from met.serve.auth import DEFAULT_TENANT, KeyRing, KeysFileError, key_problem, read_keys_file

    keys = {}
    if keys_file is not None:
        if not keys_file.exists():
            raise _fail(EX_NOINPUT, f"error: --api-keys-file {keys_file}: no such file")
        try:
            keys = read_keys_file(keys_file)
        except KeysFileError as exc:
            raise _fail(EX_DATAERR, f"error: --api-keys-file {exc}") from None
    for key in api_keys:
        if not key.strip():
            raise typer.BadParameter("an API key must not be empty", param_hint="--api-key")
        if (why := key_problem(key)) is not None:  # it could never be sent: refused now, not at every request
            raise typer.BadParameter(f"the key {why}", param_hint="--api-key")
        if key in keys:  # as a key given twice in the file: which tenant it speaks for must not be a guess
            raise typer.BadParameter(f"a key given here is also in --api-keys-file (tenant {keys[key]!r}); give "
                                     "each key once", param_hint="--api-key")
        keys[key] = DEFAULT_TENANT
    return KeyRing(keys, open_metrics)


def _banner(service: Service, recipe_id: str, host: str, port: int, settings: RunSettings, box: str,
            tables: list[Path], keys: KeyRing, draft: tuple[str, int] | None = None,
            eagle: tuple[str, int] | None = None) -> None:
    """The boot lines: what is served, how, from which tables (each measured planner's, in its order); draft, eagle:
    the draft model's id or the EAGLE-3 head's folder name, and its most drafts."""
    from met.speculative.spec_cost.plan import unknown

    sched = service.scheduler
    typer.echo(f"met serve: {recipe_id} on {settings.device} ({settings.dtype}, {settings.threads} threads), "
               f"box class {box}; spec {sched.policy.name}, {sched.runner.cache.max_batch} slots of "
               f"{sched.max_len} tokens", err=True)
    if draft is not None:
        typer.echo(f"  drafting with the draft model {draft[0]}, up to {draft[1]} drafts a step", err=True)
    if eagle is not None:
        typer.echo(f"  drafting with the EAGLE-3 head {eagle[0]}, up to {eagle[1]} drafts a step", err=True)
    planners = getattr(sched.policy, "planners", [sched.policy]) if tables else []
    if len(planners) > 1:
        typer.echo(f"  choosing every step among {', '.join(p.drafter for p in planners)} by their own tables", err=True)
    for planner, table in zip(planners, tables):
        state = planner.state
        key = state.table.key
        widths = sorted({1, sched.runner.cache.max_batch})
        plans = "; ".join(f"width {n}: {state.plan(unknown(n), kmax=planner.kmax(n)).why}" for n in widths)
        when = measured_ago(state.table.meta)
        others = " and from the tenant's other requests" if planner.copies.shared_ngram else ""
        copies = (f"weighing copies from each history{others} (the calibration's prompt-lookup bins; up to "
                  f"{planner.copy_kmax(1)} deep at width 1)" if state.calibration.lookup
                  else f"{_WHOSE[planner.drafter]} drafts only (the calibration has no "
                  "prompt-lookup bins)")
        named = f"{planner.drafter} " if len(planners) > 1 else ""
        typer.echo(f"  planning {named}from {table} ({when + ', ' if when else ''}energy_source "
                   f"{key.energy_source}, slack {state.slack:g}), {copies}; with position priors, {plans}", err=True)
    tenants = sorted(set(keys.keys.values()))
    typer.echo(f"  auth: {'none (open)' if keys.open else f'{len(keys.keys)} keys, tenants ' + ', '.join(tenants)}",
               err=True)
    if keys.open and not _loopback(host):
        typer.echo(f"  warning: listening on {host} without an API key; pass --api-key or --api-keys-file", err=True)


_WHOSE = {"mtp": "MTP", "draft": "draft-model", "eagle": "EAGLE-3"}  # whose drafts a planner weighs


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def top(
    url: Annotated[str, typer.Option(help="Base URL of a running met serve.")] = "http://127.0.0.1:8000",
    api_key: Annotated[str | None, typer.Option(help="API key, if the server wants one.", show_default=False)] = None,
    interval: Annotated[float, typer.Option(min=0.1, max=3600.0, help="Seconds between polls.")] = 1.0,
    once: Annotated[bool, typer.Option("--once", help="Print one frame and exit.")] = False,
) -> None:
    """Show a running server's live snapshot (GET /v1/snapshot).

    Exit statuses: 0 stopped (Ctrl-C once it polls; 130 while it starts) or --once drawn; 2 bad option;
    69 (EX_UNAVAILABLE) the URL cannot be reached, is invalid, or answers no met snapshot.
    """
    import httpx
    from rich.console import Console

    from met.serve import tui
    from met.interrupt import raise_on_sigint

    raise_on_sigint()  # Ctrl-C stops the dashboard: exit 0

    try:
        if once:
            Console().print(tui.render(tui.fetch(url, api_key), url))
        else:
            tui.watch(url, api_key, interval)
    except tui.NotASnapshot as exc:
        raise _fail(EX_UNAVAILABLE, f"error: {exc}") from None
    except httpx.HTTPStatusError as exc:
        hint = "; pass --api-key" if exc.response.status_code == 401 else ""
        raise _fail(EX_UNAVAILABLE, f"error: {url} answered {exc.response.status_code}{hint}") from None
    except httpx.HTTPError as exc:
        raise _fail(EX_UNAVAILABLE, f"error: cannot reach {url}: {exc}") from None
    except KeyboardInterrupt:
        pass
    raise typer.Exit(0)
