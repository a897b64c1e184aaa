"""`met generate`: offline generation through the scheduler `met serve` runs, with a fixed drafting policy."""

from __future__ import annotations  # the engine's types are imported where they are used: `met --help` needs none

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from met.choices import DEFAULT_RECIPE, MAX_THREADS, NGRAM_MAX, RUN_DTYPES, SPEC_MODES
from met.engine.prompts import PromptError, PromptsMissing, read_jsonl_prompts, unencodable
from met.exit_codes import EX_DATAERR, EX_NOINPUT
from met.model.errors import RecipeError
from met.path_option import nonempty_model, nonempty_path

if TYPE_CHECKING:  # torch and the engine are imported when the command runs
    import torch

    from met.engine.generate import Output

MAX_BATCH = 256  # as serve's --max-batch: the KV cache of every slot is allocated up front
MAX_TEMPERATURE = 100.0  # past this the distribution is uniform to float precision; 1e308 overflowed


def _fail(message: str, code: int) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def read_prompts(path: Path) -> list[str]:
    """Prompts from a JSONL file: each line a JSON string or an object with a "prompt" string."""
    try:
        return read_jsonl_prompts(path)
    except PromptsMissing as e:
        raise _fail(str(e), EX_NOINPUT)
    except PromptError as e:
        raise _fail(str(e), EX_DATAERR)


def summary(o: Output, text: str) -> dict:
    """The JSON record of one prompt's generation (its counts: o.stats, a SpecStats of this request alone)."""
    return {
        "text": text,
        "tokens": len(o.tokens),
        # the decode steps' tokens (the first came from prefill) over this prompt's own decode time (one that
        # finished early is not charged the batch's later steps); None without a decode step
        "tokens_per_s": round((len(o.tokens) - 1) / o.finished_s, 2) if o.steps and o.finished_s > 0 else None,
        "prefill_s": round(o.prefill_s, 6),
        "steps": o.steps,
        "drafts_proposed": o.proposed,
        "drafts_accepted": o.accepted,
        "acceptance_rate": round(o.accepted / o.proposed, 4) if o.proposed else None,
        # accepted drafts per verify step; the bonus token is NOT counted (add 1 for tokens per step)
        "mean_accepted_length": round(o.accepted / o.steps, 4) if o.steps else 0.0,
        "acceptance_per_position": [round(a / p, 4) for a, p in zip(o.accepted_at, o.proposed_at)],
        "finished_by": o.finished_by,
    } | ({"dflash_widths": {str(k): o.gammas.count(k) for k in sorted(set(o.gammas))},
          "dflash_capped": o.capped} if o.gammas else {})


def generate(
    prompt: Annotated[str | None, typer.Option(help="One prompt.")] = None,
    prompts: Annotated[Path | None, typer.Option(
        parser=nonempty_path, help="JSONL file of prompts (strings or {\"prompt\": ...}).")] = None,
    max_tokens: Annotated[int, typer.Option(min=1, help="Tokens to generate per prompt.")] = 128,
    spec: Annotated[str, typer.Option(help=f"Drafting: {', '.join(SPEC_MODES)}.")] = "off",
    depth: Annotated[int, typer.Option(min=0, max=16, help="Drafts per step (fixed; dflash: the rung's).")] = 3,
    lookup_min_ngram: Annotated[int, typer.Option(
        min=1, max=NGRAM_MAX, help="ngram / prompt-lookup: the shortest match of the text's end that proposes "
        "drafts (a longer one is likelier accepted; where a verified draft costs much, as on a CPU, 3 pays).")] = 1,
    drafter: Annotated[Path | None, typer.Option(
        parser=nonempty_path,
        help="--spec dflash: the DFlash drafter (default: <recipe>.dflash.safetensors beside its weights); "
        "--spec eagle: the EAGLE-3 head's folder (config.json and model.safetensors, as published for vLLM).",
        show_default=False)] = None,
    draft_model: Annotated[str | None, typer.Option(
        parser=nonempty_model, help="Draft model for --spec draft: an embedded recipe name (e.g. met-tiny-py-draft) "
        "or a checkpoint folder with the target's tokenizer.", show_default=False)] = None,
    batch: Annotated[int, typer.Option(min=1, max=MAX_BATCH, help="Prompts run together (width): the scheduler's "
                                                                 "slots, a prompt starting as one frees.")] = 1,
    temperature: Annotated[float, typer.Option(min=0.0, max=MAX_TEMPERATURE, help="0 is greedy.")] = 0.0,
    top_p: Annotated[float, typer.Option(min=0.0, max=1.0, help="Nucleus sampling mass, above 0.")] = 1.0,
    seed: Annotated[int, typer.Option(min=-(1 << 63), max=(1 << 64) - 1,
                                      help="Sampling seed: the same text under every --spec, depth and --batch.")] = 0,
    model: Annotated[str, typer.Option(
        "--model", "--recipe", parser=nonempty_model,
        help="Embedded recipe name, or a Hugging Face checkpoint folder (Llama, Mistral, Qwen2, Qwen3).",
    )] = DEFAULT_RECIPE,
    max_len: Annotated[int, typer.Option(
        min=0, help="Context per sequence (0: the model's, at most 2048).")] = 0,
    dtype: Annotated[str, typer.Option(help=f"{', '.join(RUN_DTYPES)}.")] = "float32",
    device: Annotated[str, typer.Option(help="Torch device.")] = "cpu",
    threads: Annotated[int, typer.Option(min=0, max=MAX_THREADS,
                                         help="torch CPU threads (0: the default, 1 on a CPU).")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per prompt.")] = False,
) -> None:
    """Generate text offline from --prompt or --prompts.

    --spec draft drafts with --draft-model, a smaller model of the same tokenizer with a KV cache of
    its own, --depth drafts a step. --spec eagle drafts with the EAGLE-3 head in the folder --drafter
    names, trained on this model (its target's hidden size and vocabulary), --depth drafts a step.

    Exit statuses: 0 done; 2 bad option (e.g. --spec mtp on a model without an MTP module, --spec
    draft without --draft-model, --spec eagle without --drafter); 65 (EX_DATAERR) a prompts file or
    checkpoint folder that cannot be used (unsupported architecture), a draft model of another
    tokenizer or vocabulary than the model's, or an EAGLE-3 head that does not fit the model (another
    hidden size, vocabulary or layer count; a d2t or t2d that does not fit); 66 (EX_NOINPUT) a recipe,
    folder or file that is not there.
    """
    import torch

    from met.engine import heap
    from met.engine.generate import generate_each
    from met.engine.identity import resolve_run, speculation_drift_warning
    from met.engine.runner import ModelRunner, Sampling
    from met.model.dflash import shipped_path
    from met.model.sources import context_len, draft_model_for, resolve, tokenizer_for

    if (prompt is None) == (prompts is None):
        raise _fail("give exactly one of --prompt or --prompts", 2)
    if drafter is not None and spec not in ("dflash", "eagle"):
        raise _fail(f"--drafter is the drafter of --spec dflash or eagle; --spec {spec} would not use it", 2)
    if spec == "eagle" and drafter is None:
        raise _fail("--spec eagle drafts with an EAGLE-3 head: pass its folder as --drafter", 2)
    if (draft_model is not None) != (spec == "draft"):
        raise _fail("--spec draft drafts with --draft-model: give both or neither", 2)
    if spec not in SPEC_MODES:
        raise _fail(f"--spec {spec!r} is not one of {', '.join(SPEC_MODES)}", 2)
    if top_p == 0:
        raise _fail("--top-p 0 keeps no token; pass a mass in (0, 1]", 2)
    try:
        settings = resolve_run(device, dtype, threads)
    except ValueError as e:
        raise _fail(str(e), 2)
    torch_dtype = getattr(torch, settings.dtype)
    if (warning := speculation_drift_warning(settings.dtype, spec)) is not None:
        typer.echo(warning, err=True)
    if prompt is not None and (bad := unencodable(prompt)) is not None:  # argv bytes that are not UTF-8
        raise _fail(f"--prompt {bad}", 2)
    texts = [prompt] if prompt is not None else read_prompts(prompts)
    try:
        r = resolve(model)
        if spec == "mtp" and r.config.mtp_depth == 0:
            raise _fail(f"{r.name} has no MTP module to draft with; use --spec ngram or --spec prompt-lookup", 2)
        try:
            context = context_len(r, max_len)
        except ValueError as e:
            raise _fail(f"--max-len {e}", 2) from None
        tokenizer = tokenizer_for(r)
        small = draft_model_for(r, draft_model) if draft_model is not None else None
        net = r.load(torch_dtype, device)
        small_net = small.load(torch_dtype, device) if small is not None else None
    except RecipeError as e:
        raise _fail(str(e), e.status)
    block = _block_drafter(drafter or shipped_path(r), r.id, torch_dtype, device) if spec == "dflash" else None
    head = _eagle_head(drafter, net.cfg, torch_dtype, device) if spec == "eagle" else None
    # a fixed policy other than mtp never drafts with the MTP block: skip keeping its catch-up rows
    try:
        runner = ModelRunner(net, max_batch=batch, max_len=context, track_mtp=spec == "mtp", dflash=block,
                             draft_model=small_net, eagle=head)
    except ValueError as e:  # a draft model of a shorter context than the run's
        raise _fail(f"--{'drafter' if spec == 'eagle' else 'draft-model'} {drafter or draft_model}: {e}", 2) from None
    sampling = Sampling(temperature, top_p, seed)
    heap.settle()  # as met serve
    encoded = [tokenizer.encode(t) for t in texts]
    for i, (t, e) in enumerate(zip(texts, encoded), 1):  # every prompt before any runs: no half-done output
        where = "--prompt" if prompts is None else f"{prompts} prompt {i}"
        if not e:
            raise _fail(f"{where}: {t[:40]!r} encodes to no tokens", 2)
        if bad := [i for i in e if i >= net.cfg.vocab_size]:  # a tokenizer.json larger than the model
            raise _fail(f"{where}: token ids {bad[:5]} are outside {r.name}'s vocabulary 0..{net.cfg.vocab_size - 1} "
                        "(its tokenizer.json holds more tokens than config.json's vocab_size)", EX_DATAERR)
        if len(e) + max_tokens > runner.max_len:  # drafts are clamped to the room left, as the serve's
            raise _fail(f"{where}: {len(e)} tokens + --max-tokens {max_tokens} exceeds the context of "
                        f"{runner.max_len}; ask for at most {max(0, runner.max_len - len(e))}", 2)
    ready: dict[int, Output] = {}  # finished out of order: each is printed once every prompt before it is
    shown = 0
    for i, out in generate_each(runner, encoded, max_tokens, spec, depth, sampling, eos_ids=tokenizer.eos_ids,
                                lookup_min=lookup_min_ngram):
        ready[i] = out
        while shown in ready:
            o = ready.pop(shown)
            text = tokenizer.decode(o.tokens)
            typer.echo(json.dumps(summary(o, text)) if as_json else text)
            shown += 1


def _block_drafter(path: Path, target_id: str, dtype: torch.dtype, device: str):
    """The DFlash drafter at path for this model; exit 66 if it is missing, 65 if it is unusable or another model's."""
    from met.model.dflash import DrafterError, load_drafter

    try:
        return load_drafter(path, target_id, dtype, device)
    except DrafterError as e:
        raise _fail(str(e), e.status) from None


def _eagle_head(folder: Path, target, dtype: torch.dtype, device: str):
    """The EAGLE-3 head in folder for this model's config; exit 66 if it is missing, 65 if it does not fit."""
    from met.model.dflash import DrafterError
    from met.model.eagle3 import load_eagle3

    try:
        return load_eagle3(folder, target, dtype, device)
    except DrafterError as e:
        raise _fail(str(e), e.status) from None
