"""Training the embedded recipe: next-token loss plus recursive MTP losses, with checkpoints."""

import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from met.model.corpus import Split
from met.model.transformer import Transformer
from met.train import checkpoint
from met.train.params import TrainParams

LN2 = math.log(2.0)


def lr_at(step: int, p: TrainParams) -> float:
    """Linear warm-up, then cosine decay to lr * min_lr_ratio."""
    if step < p.warmup:
        return p.lr * (step + 1) / p.warmup
    frac = (step - p.warmup) / max(1, p.steps - p.warmup)
    return p.lr * (p.min_lr_ratio + (1 - p.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def sample_batch(tokens: np.ndarray, batch: int, seq_len: int, rng: np.random.Generator) -> torch.Tensor:
    """batch random windows of seq_len + 2 tokens (room for the MTP targets)."""
    starts = rng.integers(0, len(tokens) - seq_len - 2, size=batch)
    return torch.from_numpy(np.stack([tokens[s : s + seq_len + 2] for s in starts]).astype(np.int64))


def losses(model: Transformer, x: torch.Tensor, mtp_depths: int) -> tuple[torch.Tensor, list[torch.Tensor], dict]:
    """Main next-token loss and one loss per MTP depth on windows x ([B, T + 2]).

    MTP depth 1 at position i reads (main hidden at i, token i+1) and predicts token i+2.
    Depth j > 1 at i reads (depth j-1's hidden at i-1, token i+1), attends to depth 1's keys
    before i: the same inputs the runner gives a recursive draft. Also returns, for depth 1,
    how often its argmax equals the main model's argmax one position later (teacher-forced
    first-draft acceptance).
    """
    T = x.shape[1] - 2
    h = model.hidden(x[:, : T + 1])  # [B, T+1, dim]
    logits = model.logits(h)
    main = F.cross_entropy(logits.flatten(0, 1), x[:, 1 : T + 2].flatten())
    out, extra = [], {}
    nxt, target = x[:, 1 : T + 1], x[:, 2 : T + 2]
    h_in, prior = h[:, :T], None
    for depth in range(1, mtp_depths + 1):
        mh, kv = model.mtp_hidden(h_in, nxt, prior=prior)
        mlog = model.mtp_logits(mh)
        skip = depth - 1  # positions whose shifted input does not exist
        out.append(F.cross_entropy(mlog[:, skip:].flatten(0, 1), target[:, skip:].flatten()))
        if depth == 1:
            prior = kv
            with torch.no_grad():
                extra["accept1"] = (mlog.argmax(-1) == logits[:, 1:].argmax(-1)).float().mean().item()
        h_in = F.pad(mh[:, :-1], (0, 0, 1, 0))
    return main, out, extra


@torch.no_grad()
def evaluate(model: Transformer, heldout: Split, windows: int = 32, seq_len: int = 256) -> dict:
    """Held-out bits per byte and teacher-forced first-draft acceptance on fixed windows."""
    model.eval()
    x = sample_batch(heldout.tokens, windows, seq_len, np.random.default_rng(1234))
    main, mtp, extra = losses(model, x, 1)
    model.train()
    return {"heldout_bpb": main.item() / LN2, "heldout_mtp1_bpb": mtp[0].item() / LN2,
            "heldout_accept1_tf": extra["accept1"]}


def train(model: Transformer, train_split: Split, heldout: Split, params: TrainParams, ckpt: Path | None,
          on_step: Callable[[int, dict], None] = lambda step, stats: None) -> dict:
    """Train in place, resuming from and saving to ckpt; returns the final stats.

    Raises checkpoint.UnusableCheckpoint for a ckpt it cannot resume, PastSteps for one past params.steps,
    ChangedParams for one trained with other params (beyond steps and the evaluation interval).
    """
    torch.manual_seed(params.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=params.lr, betas=(0.9, 0.95), weight_decay=params.weight_decay)
    rng = np.random.default_rng(params.seed)
    step, elapsed, stats = checkpoint.resume(ckpt, "model", model, opt, rng, params=params)
    if step > params.steps:
        raise checkpoint.PastSteps(ckpt, step, params.steps)
    if params.seq_len + 2 > model.cfg.max_seq_len:
        raise ValueError(f"seq_len {params.seq_len} + 2 exceeds the model's max_seq_len {model.cfg.max_seq_len}")
    depths = min(len(params.mtp_weights), model.cfg.mtp_depth)
    model.train()
    t0 = time.perf_counter() - elapsed
    while step < params.steps:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, params)
        x = sample_batch(train_split.tokens, params.batch, params.seq_len, rng)
        main, mtp, extra = losses(model, x, depths)
        loss = main + sum(w * l for w, l in zip(params.mtp_weights, mtp))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        stats = {"step": step, "loss": main.item(), "bpb": main.item() / LN2, "accept1_tf": extra["accept1"],
                 "mtp": [l.item() / LN2 for l in mtp], "wall_s": time.perf_counter() - t0,
                 "tokens": step * params.batch * (params.seq_len + 1)}
        if step % params.eval_every == 0 or step == params.steps:
            stats |= evaluate(model, heldout, seq_len=params.seq_len)
        if ckpt is not None and (step % params.checkpoint_every == 0 or step == params.steps):
            checkpoint.save(ckpt, "model", model, opt, rng, None, step, stats, params, model.cfg)
        on_step(step, stats)
    if "heldout_bpb" not in stats:  # resumed from a checkpoint that kept no final evaluation
        stats = {"step": step, "wall_s": elapsed, "tokens": step * params.batch * (params.seq_len + 1)} | stats
        stats |= evaluate(model, heldout, seq_len=params.seq_len)
    return stats
