"""Training a DFlash block drafter against a frozen target: distil the target's next-token distributions per block row.

A window of corpus tokens goes through the frozen target once; blocks are then cut at random
anchors t: the drafter reads (the target's hidden state at t-1, token t) and its row j is trained
towards the target's own distribution of token t+1+j given the true prefix (soft cross-entropy,
row j weighted by decay**j, since a late draft only counts when every earlier one was accepted).
"""

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from met.model.corpus import Split
from met.model.dflash import DflashDrafter
from met.model.transformer import Transformer
from met.train import checkpoint
from met.train.params import DflashTrainParams
from met.train.recipe import LN2, lr_at, sample_batch


def block_losses(drafter: DflashDrafter, target: Transformer, x: torch.Tensor, anchors: int,
                 decay: float, gen: torch.Generator) -> tuple[torch.Tensor, dict]:
    """Weighted soft cross-entropy over `anchors` blocks per window of x ([B, T]), and teacher-forced acceptance.

    accept_at[j]: share of blocks whose rows 0..j all equal the target's argmax (draft j+1 accepted,
    teacher-forced); mean_accepted: the expected accepted length of a full block (bonus not counted).
    """
    B, T = x.shape
    block = drafter.block
    if T < block + 2:
        raise ValueError(f"windows of {T} tokens are shorter than a block of {block} + 2")
    with torch.no_grad():
        h = target.hidden(x)  # [B, T, dim]
        p = torch.softmax(target.logits(h).float(), -1)  # [B, T, V]
    t = torch.randint(1, T - block + 1, (B, anchors), generator=gen)  # anchor token positions
    rows = torch.arange(B)[:, None].expand(B, anchors)
    hidden, tokens = h[rows, t - 1].flatten(0, 1), x[rows, t].flatten()  # [N, dim], [N]
    span = t[..., None] + torch.arange(block)  # [B, anchors, block]: rows of p that predict tokens t+1..t+block
    want = p[rows[..., None], span].flatten(0, 1)  # [N, block, V]
    logits = drafter(target, hidden, tokens).float()  # [N, block, V]
    ce = -(want * torch.log_softmax(logits, -1)).sum(-1)  # [N, block]
    w = decay ** torch.arange(block, dtype=torch.float32)
    loss = (ce * w).sum(-1).mean() / w.sum()
    with torch.no_grad():
        chain = (logits.argmax(-1) == want.argmax(-1)).float().cumprod(-1)  # [N, block]
        stats = {"accept_at": chain.mean(0).tolist(), "mean_accepted": chain.sum(-1).mean().item(),
                 "ce_first": ce[:, 0].mean().item() / LN2}
    return loss, stats


@torch.no_grad()
def evaluate(drafter: DflashDrafter, target: Transformer, heldout: Split, params: DflashTrainParams) -> dict:
    """Held-out teacher-forced acceptance per block row on fixed windows and anchors."""
    drafter.eval()
    x = sample_batch(heldout.tokens, 16, params.seq_len, np.random.default_rng(1234))[:, : params.seq_len]
    _, stats = block_losses(drafter, target, x, params.anchors, params.decay, torch.Generator().manual_seed(1234))
    drafter.train()
    return {"heldout_accept_at": [round(a, 4) for a in stats["accept_at"]],
            "heldout_mean_accepted": stats["mean_accepted"], "heldout_first_bits": stats["ce_first"]}


def train_dflash(drafter: DflashDrafter, target: Transformer, train_split: Split, heldout: Split,
                 params: DflashTrainParams, ckpt: Path | None,
                 on_step: Callable[[int, dict], None] = lambda step, stats: None, target_id: str | None = None) -> dict:
    """Train the drafter in place against the frozen target, resuming from and saving to ckpt; the final stats.

    target_id (the target recipe's id) is kept in ckpt: a checkpoint of another target's weights is not resumed.
    """
    target.eval().requires_grad_(False)
    if params.seq_len > target.cfg.max_seq_len:
        raise ValueError(f"seq_len {params.seq_len} exceeds the target's max_seq_len {target.cfg.max_seq_len}")
    torch.manual_seed(params.seed)
    opt = torch.optim.AdamW(drafter.parameters(), lr=params.lr, betas=(0.9, 0.95), weight_decay=params.weight_decay)
    rng, gen = np.random.default_rng(params.seed), torch.Generator().manual_seed(params.seed)
    step, elapsed, stats = checkpoint.resume(ckpt, "drafter", drafter, opt, rng, gen, params, target_id)
    if step > params.steps:
        raise checkpoint.PastSteps(ckpt, step, params.steps)
    drafter.train()
    t0 = time.perf_counter() - elapsed
    while step < params.steps:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, params)
        x = sample_batch(train_split.tokens, params.batch, params.seq_len, rng)[:, : params.seq_len]
        loss, extra = block_losses(drafter, target, x, params.anchors, params.decay, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        step += 1
        stats = {"step": step, "loss": loss.item(), "accept1_tf": extra["accept_at"][0],
                 "mean_accepted_tf": extra["mean_accepted"], "wall_s": time.perf_counter() - t0}
        if step % params.eval_every == 0 or step == params.steps:
            stats |= evaluate(drafter, target, heldout, params)
            if ckpt is not None:
                checkpoint.save(ckpt, "drafter", drafter, opt, rng, gen, step, stats, params, drafter.cfg, target_id)
        on_step(step, stats)
    if "heldout_accept_at" not in stats:  # resumed from a finished run's checkpoint
        stats = {"step": step, "wall_s": elapsed} | stats | evaluate(drafter, target, heldout, params)
    drafter.eval()
    return stats
