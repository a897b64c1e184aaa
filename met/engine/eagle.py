"""An EAGLE-3 head drafting in the target runner's slots: its one-layer KV cache, the target rows it has yet to see.

The head's row at position i reads the target's hidden states at i (its three layers, fused by the
head's `fc`) and the token at i+1, and predicts the token at i+2, as the MTP block does. So each
slot keeps the target rows the head's cache has not taken (a prompt's, then the rows a verify
accepted, each with the token after it, the last one the target's pending token); a draft step first
runs them in one pass (the catch-up, grouped as the MTP block's are: met.speculative.catchup), whose
last row gives the first draft, then one pass per further draft fed the head's own output and the
draft before it. Those draft rows were computed from the head's hidden, not the target's, so none of
them is kept: after a verify the cache goes back to the committed rows, and the accepted rows, now
with the target's features, wait for the next catch-up. The prompt is not run here either: a
sequence the head never drafts for costs it only its features' rows.
"""

import torch

from met.model.eagle3 import Eagle3Head
from met.model.kv_cache import KVCache
from met.model.transformer import CacheContext, Transformer
from met.speculative.catchup import catchup_groups, check_verified


class EagleDrafter:
    """An EAGLE-3 head drafting for its target, in the target runner's slots."""

    def __init__(self, head: Eagle3Head, target: Transformer, max_batch: int, max_len: int):
        cfg = head.cfg
        if cfg.target_dim != target.cfg.dim or cfg.vocab_size != target.cfg.vocab_size:
            raise ValueError(f"the EAGLE-3 head reads a target of hidden size {cfg.target_dim} and {cfg.vocab_size} "
                             f"tokens; this model's are {target.cfg.dim} and {target.cfg.vocab_size}")
        if cfg.max_seq_len < max_len or max(cfg.layers) > target.cfg.n_layers:
            raise ValueError(f"the EAGLE-3 head covers {cfg.max_seq_len} positions and target layers "
                             f"{list(cfg.layers)}; this run needs {max_len} and this model has {target.cfg.n_layers}")
        self.head = head.eval()
        self.embed = head.embedding(target)
        self.taps = cfg.layers  # the target layers Transformer.hidden must hand over
        p = head.lm_head.weight
        self.device = p.device
        self.cache = KVCache.allocate(1, max_batch, max_len, cfg.n_kv_heads, cfg.head_dim, p.dtype, p.device)
        self.behind: dict[int, list[torch.Tensor]] = {}  # target feature rows [n * target_dim] not in this cache
        self.behind_tok: dict[int, list[int]] = {}  # the token after each of those rows (the last: the pending one)
        self.fed: dict[int, int] = {}  # drafts fed since the last verify (their rows lie past the committed ones)

    def start(self, slot: int, features: torch.Tensor, tokens: list[int]) -> None:
        """A new sequence in slot: its prompt's feature rows [n, n_taps * target_dim] and the token after each."""
        self.cache.reset(slot)
        self.behind[slot], self.behind_tok[slot], self.fed[slot] = list(features), list(tokens), 0

    def release(self, slot: int) -> None:
        for state in (self.behind, self.behind_tok, self.fed):
            state.pop(slot, None)
        self.cache.reset(slot)

    def move(self, src: int, dst: int) -> None:
        self.cache.move(src, dst)
        for state in (self.behind, self.behind_tok, self.fed):
            state[dst] = state.pop(src)

    def behind_rows(self, slot: int) -> int:
        """Rows the slot's next draft step runs before its first draft (its catch-up)."""
        return len(self.behind_tok[slot])

    def verified(self, slot: int, features: torch.Tensor, emitted: list[int]) -> None:
        """The target verified this slot: the feature rows [a + 1, ...] of its accepted positions, what they emitted."""
        self.fed[slot] = 0  # the draft rows past the committed ones are overwritten by the next catch-up
        self.behind[slot].extend(features)
        self.behind_tok[slot].extend(emitted)

    def catch_up(self, slots: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Run each slot's waiting rows into the cache: (first draft's logits [B, vocab], the head's output [B, dim])."""
        rows = [len(self.behind_tok[s]) for s in slots]
        check_verified(slots, rows)
        last: list[torch.Tensor] = [None] * len(slots)  # type: ignore[list-item]
        for group in catchup_groups(rows):
            g_slots = [slots[b] for b in group]
            R = max(rows[b] for b in group)
            taps = torch.zeros(len(group), R, self.head.fc.in_features, dtype=self.head.fc.weight.dtype,
                               device=self.device)  # [G, R, n_taps * target_dim], right-padded
            tokens = torch.zeros(len(group), R, dtype=torch.long)  # [G, R]
            for i, b in enumerate(group):
                taps[i, : rows[b]] = torch.stack(self.behind[slots[b]])
                tokens[i, : rows[b]] = torch.tensor(self.behind_tok[slots[b]])
            ctx = CacheContext.consecutive(self.cache, g_slots, [self.cache.lengths[s] for s in g_slots], R)
            out = self.head(self.head.fuse(taps), self.embed(tokens.to(self.device)), ctx.pos, ctx)  # [G, R, dim]
            ends = out[torch.arange(len(group)), torch.tensor([rows[b] for b in group]) - 1]  # [G, dim]
            for i, b in enumerate(group):
                last[b] = ends[i]
        for s, n in zip(slots, rows):
            self.cache.lengths[s] += n
            self.behind[s], self.behind_tok[s], self.fed[s] = [], [], 0
        out = torch.stack(last)
        return self.head.logits(out), out

    def step(self, slots: list[int], hidden: torch.Tensor, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed each slot the head's last output [B, dim] and its latest draft: (logits [B, vocab], output [B, dim])."""
        ctx = CacheContext.consecutive(self.cache, slots, [self.cache.lengths[s] + self.fed[s] for s in slots], 1)
        out = self.head(hidden[:, None], self.embed(torch.tensor(tokens, device=self.device)[:, None]), ctx.pos, ctx)
        for s in slots:
            self.fed[s] += 1
        return self.head.logits(out[:, 0]), out[:, 0]
