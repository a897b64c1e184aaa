"""`met model train --drafter draft`: distil a small draft model from a frozen recipe, write it and its card.

Beside cli.py, which parses the options and calls it. The weights and card written are an
ordinary embedded recipe's (no "drafter" key): copied into met/model/weights/, the draft loads
as `<target>-draft` wherever a recipe does; its card's "distilled_from" names the target it
was distilled from.
"""

import time
from dataclasses import asdict
from pathlib import Path

import torch
from rich.console import Console

from met.model.corpus import load_split
from met.model.recipes import embedded
from met.model.weights import save_weights, write_card
from met.train.card import corpus_card
from met.train.draft_model import train_draft, truncated
from met.train.out_dir import open_log, progress_bar, writing
from met.train.params import DraftTrainParams


def train_draft_cmd(target_name: str, out_dir: Path, params: DraftTrainParams, console: Console) -> None:
    """Train, then write OUT_DIR/<target>-draft.safetensors and <target>-draft.card.json (resumes from a checkpoint).

    Raises RecipeError (no such target), ValueError (a draft no smaller than its target, a window past
    its context), or a checkpoint's refusal; the caller turns them into exit statuses. OUT_DIR that
    cannot be made, or a checkpoint, weights or card that cannot be written, exits 73 here.
    """
    recipe = embedded(target_name)
    target = recipe.load()
    draft = truncated(target, params.layers)
    name = f"{recipe.name}-draft"
    log = open_log(out_dir)
    train_split, heldout = load_split(False), load_split(True)
    with progress_bar("distil", console) as progress:
        task = progress.add_task("distil", total=params.steps, info="")

        def on_step(step: int, stats: dict) -> None:
            info = f"KL {stats['kl_bits']:.3f} bits agree {stats['agree']:.2f}"
            if "heldout_kl_bits" in stats:
                line = (f"step {step}/{params.steps} KL {stats['kl_bits']:.4f} bits | held-out KL "
                        f"{stats['heldout_kl_bits']:.4f} bits, top-1 agreement {stats['heldout_agree']:.4f}, "
                        f"bpb {stats['heldout_bpb']:.4f} | {stats['wall_s'] / 60:.1f} min")
                log.write(f"{time.strftime('%H:%M:%S')} {line}\n")
                log.flush()
                if not console.is_terminal:
                    console.print(line)
                info += f" | held-out KL {stats['heldout_kl_bits']:.3f} agree {stats['heldout_agree']:.2f}"
            progress.update(task, completed=step, info=info)

        with writing(out_dir):  # its checkpoints
            stats = train_draft(draft, target, train_split, heldout, params, out_dir / "draft_ckpt.pt", on_step,
                                recipe.id)
    log.close()
    path = out_dir / f"{name}.safetensors"
    with writing(out_dir):
        digest = save_weights(draft, path)
    card = {
        "recipe": name,
        "digest": digest,
        "config": asdict(draft.cfg),
        "distilled_from": recipe.id,
        "parameters": draft.num_parameters(),
        "parameters_without_mtp": draft.num_parameters(),  # it has none; `met model info` reads the field
        "corpus": corpus_card(train_split, heldout),
        "training": asdict(params) | {"method": f"its target's first {params.layers} layers, embedding, final norm "
                                                "and head copied, then KL(target || draft) at every position",
                                      "wall_s": round(stats["wall_s"], 1),
                                      "tokens_seen": stats["step"] * params.batch * params.seq_len,
                                      "torch": torch.__version__, "threads": torch.get_num_threads()},
        "heldout": {"method": f"32 random windows of {params.seq_len} bytes of the held-out split "
                              "(draft_model.evaluate), every position, teacher-forced",
                    "kl_bits_per_byte": round(stats["heldout_kl_bits"], 4),
                    "top1_agreement": round(stats["heldout_agree"], 4),
                    "bits_per_byte": round(stats["heldout_bpb"], 4)},
    }
    with writing(out_dir):
        write_card(card, out_dir / f"{name}.card.json")
    console.print(f"wrote {path} (digest {digest}) and its card; copy both into met/model/weights/ to run it as "
                  f"the recipe {name}")
