"""Distilling a small draft model from a frozen recipe: its first layers copied, then trained towards its distributions.

The draft is an ordinary Transformer (no MTP module) of the target's width, heads, vocabulary and
context, with fewer layers, so the engine can run it as any recipe. It starts as the truncated
target (embedding, first decoder layers, final norm and head copied), which already predicts
bytes far better than a fresh model, then learns KL(target || draft) at every position of a
window: the draft's argmax, not the corpus's next byte, is what a verifier accepts, so it is
trained towards the target's whole next-byte distribution. An optional cross-entropy on the
corpus (ce_weight) sits beside it.
"""

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from met.model.config import ModelConfig
from met.model.corpus import Split
from met.model.transformer import Transformer
from met.train import checkpoint
from met.train.params import DraftTrainParams
from met.train.recipe import LN2, lr_at, sample_batch


def draft_config(target: ModelConfig, layers: int) -> ModelConfig:
    """The draft's shape: the target's, with `layers` decoder layers and no MTP module."""
    if not 1 <= layers < target.n_layers:
        raise ValueError(f"a draft of {layers} layers is no smaller than its target of {target.n_layers}; "
                         f"keep 1..{target.n_layers - 1}")
    return target.with_(n_layers=layers, mtp_depth=0)


def truncated(target: Transformer, layers: int) -> Transformer:
    """A new draft model holding copies of the target's embedding, first `layers` layers, final norm and head."""
    draft = Transformer(draft_config(target.cfg, layers))
    own = target.state_dict()
    # the draft's names are a subset of the target's (layer i keeps its name): load_state_dict copies each tensor
    draft.load_state_dict({name: own[name] for name in draft.state_dict()}, strict=True)
    return draft


def distill_losses(draft: Transformer, target: Transformer, x: torch.Tensor,
                   ce_weight: float = 0.0) -> tuple[torch.Tensor, dict]:
    """The training loss on windows x ([B, T + 1]: T positions and the byte after the last), and its parts.

    kl: KL(target || draft) of the next-byte distributions, nats per position, over all T positions;
    agree: share of positions where the draft's argmax is the target's (teacher-forced top-1 agreement);
    ce: the draft's cross-entropy on the corpus's next bytes, nats.
    """
    inputs, nxt = x[:, :-1], x[:, 1:]  # [B, T], [B, T]
    with torch.no_grad():
        want = torch.log_softmax(target(inputs).float(), -1)  # [B, T, V]
    logits = draft(inputs).float()  # [B, T, V]
    have = torch.log_softmax(logits, -1)
    kl = (want.exp() * (want - have)).sum(-1).mean()
    ce = F.cross_entropy(logits.flatten(0, 1), nxt.flatten())
    loss = kl + ce_weight * ce if ce_weight else kl
    with torch.no_grad():
        agree = (logits.argmax(-1) == want.argmax(-1)).float().mean().item()
    return loss, {"kl": kl.item(), "agree": agree, "ce": ce.item()}


@torch.no_grad()
def evaluate(draft: Transformer, target: Transformer, heldout: Split, params: DraftTrainParams,
             windows: int = 32) -> dict:
    """Held-out KL (bits per byte), top-1 agreement and the draft's bits per byte on fixed windows."""
    draft.eval()
    x = sample_batch(heldout.tokens, windows, params.seq_len, np.random.default_rng(1234))[:, : params.seq_len + 1]
    _, stats = distill_losses(draft, target, x)
    draft.train()
    return {"heldout_kl_bits": stats["kl"] / LN2, "heldout_agree": stats["agree"], "heldout_bpb": stats["ce"] / LN2}


def train_draft(draft: Transformer, target: Transformer, train_split: Split, heldout: Split,
                params: DraftTrainParams, ckpt: Path | None,
                on_step: Callable[[int, dict], None] = lambda step, stats: None, target_id: str | None = None) -> dict:
    """Train the draft in place against the frozen target, resuming from and saving to ckpt; the final stats.

    A checkpoint is saved at each evaluation (every params.eval_every steps, and the last); target_id
    (the target recipe's id) is kept in it, so a checkpoint of other target weights is not resumed.
    """
    target.eval().requires_grad_(False)
    if params.seq_len > target.cfg.max_seq_len:
        raise ValueError(f"seq_len {params.seq_len} exceeds the target's max_seq_len {target.cfg.max_seq_len}")
    opt = torch.optim.AdamW(draft.parameters(), lr=params.lr, betas=(0.9, 0.95), weight_decay=params.weight_decay)
    rng = np.random.default_rng(params.seed)
    step, elapsed, stats = checkpoint.resume(ckpt, "draft", draft, opt, rng, None, params, target_id)
    if step > params.steps:
        raise checkpoint.PastSteps(ckpt, step, params.steps)
    draft.train()
    t0 = time.perf_counter() - elapsed
    while step < params.steps:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, params)
        x = sample_batch(train_split.tokens, params.batch, params.seq_len, rng)[:, : params.seq_len + 1]
        loss, extra = distill_losses(draft, target, x, params.ce_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        step += 1
        stats = {"step": step, "kl_bits": extra["kl"] / LN2, "agree": extra["agree"], "bpb": extra["ce"] / LN2,
                 "wall_s": time.perf_counter() - t0}
        if step % params.eval_every == 0 or step == params.steps:
            stats |= evaluate(draft, target, heldout, params)
            if ckpt is not None:
                checkpoint.save(ckpt, "draft", draft, opt, rng, None, step, stats, params, draft.cfg, target_id)
        on_step(step, stats)
    if "heldout_kl_bits" not in stats:  # resumed from a finished run's checkpoint
        stats = {"step": step, "wall_s": elapsed} | stats | evaluate(draft, target, heldout, params)
    draft.eval()
    return stats
