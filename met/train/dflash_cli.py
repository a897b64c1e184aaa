"""`met model train --drafter dflash`: train a DFlash block drafter against a frozen recipe, write it and its card.

Beside cli.py, which parses the options and calls it: the card's greedy acceptance is decoded by the engine.
"""

import time
from dataclasses import asdict
from pathlib import Path

import torch
from rich.console import Console

from met.model.corpus import load_split
from met.model.dflash import DflashConfig, DflashDrafter, save_drafter
from met.model.recipes import embedded
from met.model.weights import write_card
from met.train.acceptance import dflash_acceptance
from met.train.dflash import DflashTrainParams, train_dflash
from met.train.out_dir import writing


def train_dflash_cmd(target_name: str, out_dir: Path, params: DflashTrainParams, config: dict,
                     console: Console, acceptance_prompts: int = 16) -> None:
    """Train, then write OUT_DIR/<target>.dflash.safetensors and <target>.dflash.card.json (resumes from a checkpoint).

    Raises RecipeError (no such target) or ValueError (bad shapes); the caller turns them into exit statuses.
    A checkpoint, drafter or card that cannot be written exits 73 here (out_dir.writing), naming the file.
    """
    recipe = embedded(target_name)
    target = recipe.load()
    cfg = DflashConfig.for_target(recipe.config, **config)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(params.seed)
    drafter = DflashDrafter(cfg)
    train_split, heldout = load_split(False), load_split(True)
    log = (out_dir / "train.log").open("a")

    def on_step(step: int, stats: dict) -> None:
        if "heldout_accept_at" in stats:
            line = (f"step {step}/{params.steps} loss {stats['loss']:.3f} | held-out teacher-forced accept "
                    f"{stats['heldout_accept_at'][:4]} mean length {stats['heldout_mean_accepted']:.2f} | "
                    f"{stats['wall_s'] / 60:.1f} min")
            log.write(f"{time.strftime('%H:%M:%S')} {line}\n")
            log.flush()
            console.print(line)

    with writing(out_dir):  # its checkpoints
        stats = train_dflash(drafter, target, train_split, heldout, params, out_dir / "dflash_ckpt.pt", on_step,
                             recipe.id)
    path = out_dir / f"{recipe.name}.dflash.safetensors"
    with writing(out_dir):
        digest = save_drafter(drafter, path, recipe.id)
    card = {
        "drafter": "dflash",
        "target": recipe.id,
        "digest": digest,
        "config": asdict(cfg),
        "parameters": sum(p.numel() for p in drafter.parameters()),
        "training": asdict(params) | {"wall_s": round(stats["wall_s"], 1), "torch": torch.__version__,
                                      "threads": torch.get_num_threads()},
        "heldout": {"teacher_forced_accept_at": stats["heldout_accept_at"],
                    "teacher_forced_mean_accepted": round(stats["heldout_mean_accepted"], 4)},
        "acceptance": dflash_acceptance(target, drafter, prompts=acceptance_prompts,
                                        max_tokens=min(128, recipe.config.max_seq_len // 4),
                                        prompt_bytes=min(256, recipe.config.max_seq_len // 2)),
    }
    with writing(out_dir):
        write_card(card, out_dir / f"{recipe.name}.dflash.card.json")
    console.print(f"wrote {path} (digest {digest}) and its card; ship both beside the recipe's weights "
                  f"(met/model/weights/) for met generate --spec dflash")
