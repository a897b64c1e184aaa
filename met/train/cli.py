"""`met model train`: train a recipe (met.train.recipe) and card it with its drafter's acceptance, decoded by the engine.

--drafter dflash trains a DFlash block drafter against a frozen recipe (dflash_cli.py), --drafter
draft distils a small draft model from one (draft_model_cli.py); this module parses their options.

met.train sits above met.engine, whose scheduler decodes the card's acceptance; met.model imports
nothing of either, so met/cli.py wires this command into the model sub-app
(met.model.cli.model_app) beside `met model info`.
"""

from __future__ import annotations  # the trainers' types are imported where they are used: `met --help` needs none

import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from met.choices import MAX_THREADS
from met.exit_codes import EX_DATAERR, EX_NOINPUT
from met.model.cli import fail
from met.model.config import ModelConfig
from met.path_option import nonempty_path
from met.train.out_dir import open_log, progress_bar, writing
from met.train.params import DflashTrainParams, DraftTrainParams, TrainParams

if TYPE_CHECKING:  # torch, rich and the trainers are imported when the command runs
    from rich.console import Console

    from met.model.transformer import Transformer

    from met.train.checkpoint import ChangedParams, PastSteps, UnusableCheckpoint

_D = TrainParams()
_DF = DflashTrainParams()
_DM = DraftTrainParams()
DRAFTERS = ("mtp", "dflash", "draft")


def train_cmd(
    out_dir: Annotated[Path | None, typer.Option(
        parser=nonempty_path,
        help="Folder for checkpoints, weights and the card (default: runs/met-tiny-py; dflash: runs/<target>-dflash; "
             "draft: runs/<target>-draft).",
        show_default=False)] = None,
    preset: Annotated[str | None, typer.Option(
        help="Model config preset [default: met-tiny-py] (not with --drafter dflash or draft).",
        show_default=False)] = None,
    steps: Annotated[int | None, typer.Option(min=1, help=f"Optimizer steps [default: {_D.steps}].",
                                              show_default=False)] = None,
    batch: Annotated[int | None, typer.Option(min=1, help=f"Sequences per step [default: {_D.batch}].",
                                              show_default=False)] = None,
    seq_len: Annotated[int | None, typer.Option(
        min=8, help="Tokens per training sequence [default: the preset's context less the 2 MTP targets, 1022 "
                    "for met-tiny-py]; no position past it is trained, and a model trained on short windows falls "
                    "apart past them. A drafter's default is its own (see --drafter).", show_default=False)] = None,
    lr: Annotated[float | None, typer.Option(help=f"Peak learning rate, above 0 [default: {_D.lr}].",
                                             show_default=False)] = None,
    threads: Annotated[int, typer.Option(
        min=0, max=MAX_THREADS, help="torch CPU threads (0: torch's default).")] = 0,
    eval_every: Annotated[int | None, typer.Option(
        min=1, help=f"Steps between held-out evaluations [default: {_D.eval_every}].", show_default=False)] = None,
    seed: Annotated[int, typer.Option(help="Seed of the data sampler and initialisation.")] = 0,
    init_from: Annotated[Path | None, typer.Option(
        parser=nonempty_path, help="Start from these weights (a .safetensors file of the same preset, e.g. the "
                                   "embedded ones) instead of a fresh initialisation; a new schedule of --steps.",
        show_default=False)] = None,
    drafter: Annotated[str, typer.Option(
        help="mtp: train the model with its MTP module; dflash: train a DFlash block drafter against the frozen "
             "--target (then --steps, --batch, --seq-len, --lr, --eval-every are the drafter's, default "
             f"{_DF.steps}, {_DF.batch}, {_DF.seq_len}, {_DF.lr}, {_DF.eval_every}); draft: distil a "
             f"{_DM.layers}-layer draft model, the plain recipe <target>-draft, from the frozen --target (then "
             f"they are the draft's, default {_DM.steps}, {_DM.batch}, {_DM.seq_len}, {_DM.lr}, "
             f"{_DM.eval_every}).")] = "mtp",
    target: Annotated[str | None, typer.Option(
        help="--drafter dflash or draft: the embedded recipe to draft for [default: met-tiny-py].",
        show_default=False)] = None,
) -> None:
    """Train the recipe on this interpreter's stdlib source (resumes from OUT_DIR/ckpt.pt), or a drafter for it.

    --drafter draft starts a model of --target's first layers (no MTP module) and distils the
    target's next-byte distributions into it; OUT_DIR/<target>-draft.safetensors and its card,
    copied into met/model/weights/, make the embedded recipe <target>-draft.

    A checkpoint already past --steps is refused, not resumed (the card would claim fewer steps
    than the weights took): pass --steps at or above its step, or another --out-dir. So is one
    trained with another --batch, --seq-len, --lr or --seed (the card would claim options its
    first steps did not use); --steps and --eval-every may change.

    --init-from continues training earlier weights under a schedule of its own (warm-up, then
    cosine decay over --steps); the card names the weights it started from and their card's
    training, and a checkpoint started from other weights is refused like one with another --lr
    (--drafter mtp only).

    Exit statuses: 0 weights and card written; 2 bad option value or an option of another
    --drafter (or a checkpoint in OUT_DIR already past --steps, or trained with other options);
    65 (EX_DATAERR) OUT_DIR's checkpoint is unreadable or another preset's, --init-from is not a
    weights file of the preset, or a drafter's or draft model's checkpoint was trained against
    other target weights (remove it or pass another --out-dir); 66 (EX_NOINPUT) --target names no
    embedded recipe, or --init-from no file;
    73 (EX_CANTCREAT) OUT_DIR cannot be created or written.
    """
    import torch
    from rich.console import Console

    from met.model.corpus import load_split
    from met.model.transformer import Transformer
    from met.model.weights import file_digest, save_weights, write_card
    from met.train.acceptance import mtp_acceptance
    from met.train.card import corpus_card
    from met.train.checkpoint import ChangedParams, PastSteps, UnusableCheckpoint
    from met.train.recipe import train

    console = Console(stderr=True, soft_wrap=True)  # a line to a log or pipe stays one line (no wrap at 80 columns)
    if drafter not in DRAFTERS:
        raise fail(f"--drafter {drafter!r} is not one of {', '.join(DRAFTERS)}", 2)
    if lr is not None and not (math.isfinite(lr) and lr > 0):
        raise fail(f"--lr {lr} must be a finite number above 0 (e.g. {_D.lr})", 2)
    if drafter == "dflash":
        if preset is not None:  # the drafter's shape comes from its target: a preset would be silently ignored
            raise fail("--preset is for --drafter mtp; a DFlash drafter takes its shape from --target", 2)
        target = target or "met-tiny-py"
        _apply_threads(threads)
        _train_dflash(target, out_dir or Path(f"runs/{target}-dflash"), steps, batch, seq_len, lr, eval_every, seed,
                      console)
        return
    if drafter == "draft":
        if preset is not None or init_from is not None:  # its shape and its start come from its target
            raise fail(f"--{'preset' if preset is not None else 'init-from'} is for --drafter mtp; a draft model "
                       "takes its shape and its first weights from --target", 2)
        target = target or "met-tiny-py"
        _apply_threads(threads)
        _train_draft(target, out_dir or Path(f"runs/{target}-draft"), steps, batch, seq_len, lr, eval_every, seed,
                     console)
        return
    if target is not None:  # it would be silently ignored
        raise fail("--target is for --drafter dflash and draft (the recipe a drafter is trained against); --drafter "
                   "mtp trains --preset", 2)
    if init_from is not None and not init_from.is_file():
        raise fail(f"--init-from {init_from}: no such file", EX_NOINPUT)
    preset = preset or "met-tiny-py"
    out_dir = out_dir or Path("runs/met-tiny-py")
    try:
        cfg = ModelConfig.from_name(preset)
    except KeyError as e:
        raise fail(e.args[0], 2) from None
    every = _or(eval_every, _D.eval_every)
    start, start_card = None, None
    if init_from is not None:
        start, start_card = _starting_weights(cfg, init_from)
    params = TrainParams(steps=_or(steps, _D.steps), batch=_or(batch, _D.batch), seq_len=_or(seq_len, cfg.max_seq_len - 2),
                         lr=_or(lr, _D.lr), eval_every=every, checkpoint_every=every, seed=seed,
                         init_from=file_digest(init_from) if init_from is not None else "")
    if params.seq_len + 2 > cfg.max_seq_len:
        raise fail(f"--seq-len {params.seq_len} leaves no room for the 2 MTP targets in preset {preset}'s "
                   f"context of {cfg.max_seq_len}; pass --seq-len {cfg.max_seq_len - 2} or less", 2)
    if params.seq_len + 2 < cfg.max_seq_len:
        console.print(f"note: windows of {params.seq_len} tokens train no position past {params.seq_len + 1} of preset "
                      f"{preset}'s context of {cfg.max_seq_len}; the model will be poor past it (--seq-len "
                      f"{cfg.max_seq_len - 2} trains them all)")
    _apply_threads(threads)
    log = open_log(out_dir)
    train_split, heldout = load_split(False), load_split(True)
    torch.manual_seed(seed)
    model = start if start is not None else Transformer(cfg)  # a checkpoint in OUT_DIR, if any, replaces its weights
    with progress_bar("train", console) as progress:
        task = progress.add_task("train", total=params.steps, info="")

        def on_step(step: int, stats: dict) -> None:
            info = f"bpb {stats['bpb']:.3f} acc1 {stats['accept1_tf']:.2f}"
            if "heldout_bpb" in stats:
                info += f" | held-out bpb {stats['heldout_bpb']:.3f} acc1 {stats['heldout_accept1_tf']:.2f}"
                log.write(f"{time.strftime('%H:%M:%S')} step {step} {stats}\n")
                log.flush()
                if not console.is_terminal:
                    console.print(f"step {step}/{params.steps} {info}")
            progress.update(task, completed=step, info=info)

        try:
            with writing(out_dir):  # its checkpoints
                stats = train(model, train_split, heldout, params, out_dir / "ckpt.pt", on_step)
        except (UnusableCheckpoint, PastSteps, ChangedParams) as e:
            raise _checkpoint_refused(e) from None
    log.close()
    with writing(out_dir):
        digest = save_weights(model, out_dir / f"{preset}.safetensors")
    card = {
        "recipe": preset,
        "digest": digest,
        "config": asdict(cfg),
        "parameters": model.num_parameters(),
        "parameters_without_mtp": model.num_parameters(include_mtp=False),
        "corpus": corpus_card(train_split, heldout),
        "training": asdict(params) | {"wall_s": round(stats["wall_s"], 1), "tokens_seen": stats["tokens"],
                                      "torch": torch.__version__, "threads": torch.get_num_threads()}
                    | ({"started_from": {"path": str(init_from), "digest": params.init_from,
                                         "training": (start_card or {}).get("training")}} if init_from else {}),
        "heldout": {"method": f"32 random windows of {params.seq_len} bytes of the held-out split (train.evaluate; "
                              "the whole split: python3 benchmarks/studies/heldout_quality.py)",
                    "bits_per_byte": round(stats["heldout_bpb"], 4),
                    "mtp1_bits_per_byte": round(stats["heldout_mtp1_bpb"], 4),
                    "teacher_forced_first_draft_acceptance": round(stats["heldout_accept1_tf"], 4)},
    }
    if cfg.mtp_depth:
        card["acceptance"] = mtp_acceptance(model.eval(), prompts=16, max_tokens=min(128, cfg.max_seq_len // 4),
                                            depth=min(4, cfg.mtp_depth),
                                            prompt_bytes=min(256, cfg.max_seq_len // 2))
    with writing(out_dir):
        write_card(card, out_dir / f"{preset}.card.json")
    console.print(f"wrote {out_dir / (preset + '.safetensors')} (digest {digest}) and its card")


def _train_dflash(target: str, out_dir: Path, steps: int | None, batch: int | None, seq_len: int | None,
                  lr: float | None, eval_every: int | None, seed: int, console: Console) -> None:
    from met.model.dflash import DflashConfig
    from met.model.recipes import RecipeError, embedded
    from met.train.dflash_cli import train_dflash_cmd

    try:
        recipe = embedded(target, verify=False)  # an unknown target is refused before OUT_DIR is made
        params = DflashTrainParams(steps=_or(steps, _DF.steps), batch=_or(batch, _DF.batch),
                                   seq_len=_or(seq_len, _DF.seq_len), lr=_or(lr, _DF.lr),
                                   eval_every=_or(eval_every, _DF.eval_every), seed=seed)
    except RecipeError as e:  # its status: 66 missing, 65 a damaged card
        raise fail(str(e), e.status) from None
    except ValueError as e:
        raise fail(str(e), 2) from None
    # a window holds a block's context and token rows and its drafts, within the target's context
    shortest, longest = DflashConfig.for_target(recipe.config).block + 2, recipe.config.max_seq_len
    if not shortest <= params.seq_len <= longest:
        raise fail(f"--seq-len {params.seq_len} does not fit a drafter for {target}: a window holds its block "
                   f"and 2 rows ({shortest} tokens) within the target's context of {longest}; pass --seq-len "
                   f"{shortest}..{longest}", 2)
    open_log(out_dir).close()
    _refusing(lambda: train_dflash_cmd(target, out_dir, params, {}, console))


def _train_draft(target: str, out_dir: Path, steps: int | None, batch: int | None, seq_len: int | None,
                 lr: float | None, eval_every: int | None, seed: int, console: Console) -> None:
    from met.model.recipes import RecipeError, embedded
    from met.train.draft_model_cli import train_draft_cmd

    try:
        recipe = embedded(target, verify=False)  # an unknown target is refused before OUT_DIR is made
        params = DraftTrainParams(steps=_or(steps, _DM.steps), batch=_or(batch, _DM.batch),
                                  seq_len=_or(seq_len, _DM.seq_len), lr=_or(lr, _DM.lr),
                                  eval_every=_or(eval_every, _DM.eval_every), seed=seed)
    except RecipeError as e:  # its status: 66 missing, 65 a damaged card
        raise fail(str(e), e.status) from None
    except ValueError as e:
        raise fail(str(e), 2) from None
    if params.seq_len > recipe.config.max_seq_len:
        raise fail(f"--seq-len {params.seq_len} is past {target}'s context of {recipe.config.max_seq_len}; pass "
                   f"--seq-len 8..{recipe.config.max_seq_len}", 2)
    if recipe.config.n_layers <= params.layers:
        raise fail(f"--target {target} has {recipe.config.n_layers} layers: a draft of {params.layers} would be no "
                   "smaller; distil one from a deeper recipe", 2)
    _refusing(lambda: train_draft_cmd(target, out_dir, params, console))


def _refusing(train) -> None:
    """Run a drafter's training, its refusals turned into exit statuses: a recipe's own (66, 65), a checkpoint's
    that cannot be resumed, 2 for a value the trainer rejects."""
    from met.model.recipes import RecipeError
    from met.train.checkpoint import ChangedParams, PastSteps, UnusableCheckpoint

    try:
        train()
    except RecipeError as e:
        raise fail(str(e), e.status) from None
    except (UnusableCheckpoint, PastSteps, ChangedParams) as e:
        raise _checkpoint_refused(e) from None
    except ValueError as e:
        raise fail(str(e), 2) from None


def _starting_weights(cfg: ModelConfig, path: Path) -> tuple[Transformer, dict | None]:
    """The weights --init-from names, as a model of cfg, and the card beside them (None if there is none)."""
    from met.model.weights import load_model, read_card

    try:
        model = load_model(cfg, path)
    except Exception as e:  # a file that is not safetensors, or a state dict of another shape
        raise fail(f"--init-from {path}: not weights of this preset ({str(e).splitlines()[0][:200]})", EX_DATAERR) \
            from None
    card_path = path.with_name(path.name.removesuffix(".safetensors") + ".card.json")
    try:
        card = read_card(card_path) if card_path.is_file() else None
    except (OSError, ValueError):
        card = None
    return model, card


def _or(value: int | float | None, default: int | float) -> int | float:
    """The option's value when given (0 included: typer's bounds refuse it first), else the default."""
    return default if value is None else value


def _apply_threads(threads: int) -> None:
    import torch

    if threads:
        torch.set_num_threads(threads)


def _checkpoint_refused(e: UnusableCheckpoint | PastSteps | ChangedParams) -> typer.Exit:
    """An unusable checkpoint is bad input data (65); one already past --steps or of other options a bad option (2)."""
    from met.train.checkpoint import ChangedParams, PastSteps, shown

    if isinstance(e, ChangedParams):
        options = shown(e.changes, lambda field: f"--{field.replace('_', '-')}")
        return fail(f"{e.ckpt} was trained with {options}; pass the same to resume it (--steps and --eval-every may "
                    "change), or another --out-dir to start afresh", 2)
    if isinstance(e, PastSteps):
        return fail(f"{e.ckpt} is already at step {e.step}, past --steps {e.steps}; pass --steps {e.step} or more "
                    "to resume it, or another --out-dir to start afresh", 2)
    return fail(f"{e}; remove it to train from step 0, or pass another --out-dir", EX_DATAERR)
