"""A draft model: a smaller model of the target's tokenizer proposing its drafts, with a KV cache of its own.

The draft model sees the same token sequence as the target, position for position, but runs behind
it: each slot keeps the tokens its cache has not taken yet (a prompt, the tokens a verify emitted),
the last of them the target's pending token. A draft step first runs those tokens in one pass (the
catch-up, grouped as the MTP block's are: met.speculative.catchup), whose last row's logits give the
first draft, then one pass per further draft, each fed the draft before it. The verify decides what
of that stays: a cached position holds the committed token only where the drafts fed so far equal
what the verify emitted, so the cache is rolled back to the longest such prefix and the rest of the
emitted tokens wait for the next catch-up. The prompt is not prefilled here: a sequence the draft
model never drafts for costs it nothing.
"""

import torch

from met.model.kv_cache import KVCache
from met.model.transformer import CacheContext, Transformer
from met.speculative.catchup import catchup_groups, check_verified


class DraftModel:
    """A model drafting for another of the same tokenizer, in the target runner's slots."""

    def __init__(self, model: Transformer, max_batch: int, max_len: int):
        cfg = model.cfg
        if cfg.max_seq_len < max_len:
            raise ValueError(f"the draft model's context of {cfg.max_seq_len} tokens is shorter than the target's "
                             f"{max_len}; run the target with a context of at most {cfg.max_seq_len}")
        self.model = model.eval()
        model.fuse()
        p = next(model.parameters())
        self.device = p.device
        self.cache = KVCache.allocate(cfg.n_layers, max_batch, max_len, cfg.n_kv_heads, cfg.head_dim, p.dtype,
                                      p.device)
        self.behind: dict[int, list[int]] = {}  # tokens of the sequence not in this cache, the last the pending one
        self.fed: dict[int, list[int]] = {}  # drafts fed into this cache since the last verify, in order

    def start(self, slot: int, tokens: list[int]) -> None:
        """A new sequence in slot: its prompt and first token, none of them cached yet."""
        self.cache.reset(slot)
        self.behind[slot], self.fed[slot] = list(tokens), []

    def release(self, slot: int) -> None:
        self.behind.pop(slot, None)
        self.fed.pop(slot, None)
        self.cache.reset(slot)

    def move(self, src: int, dst: int) -> None:
        self.cache.move(src, dst)
        self.behind[dst], self.fed[dst] = self.behind.pop(src), self.fed.pop(src)

    def behind_rows(self, slot: int) -> int:
        """Tokens the slot's next draft step runs before its first draft (its catch-up)."""
        return len(self.behind[slot])

    def verified(self, slot: int, emitted: list[int]) -> None:
        """The target verified this slot and emitted `emitted` (accepted drafts, then its own token)."""
        fed = self.fed[slot]
        if not fed:  # nothing fed past the pending token: every emitted token is new to this cache
            self.behind[slot].extend(emitted)
            return
        # the cache keeps each fed draft the verify committed, the pending token (emitted's last) excepted: its
        # pass gives the next step's first draft (a verify of other tokens than those fed may emit a fed one there)
        keep, most = 0, min(len(fed), len(emitted) - 1)
        while keep < most and fed[keep] == emitted[keep]:
            keep += 1
        self.cache.rollback(slot, self.cache.lengths[slot] - len(fed) + keep)
        self.behind[slot], self.fed[slot] = emitted[keep:], []

    def catch_up(self, slots: list[int]) -> torch.Tensor:
        """Run each slot's waiting tokens into the cache; the logits [B, V] after each one's last (its first draft's)."""
        rows = [len(self.behind[s]) for s in slots]
        check_verified(slots, rows)
        last: list[torch.Tensor] = [None] * len(slots)  # type: ignore[list-item]
        for group in catchup_groups(rows):
            g_slots = [slots[b] for b in group]
            R = max(rows[b] for b in group)
            tokens = torch.zeros(len(group), R, dtype=torch.long)  # [G, R], right-padded
            for i, b in enumerate(group):
                tokens[i, : rows[b]] = torch.tensor(self.behind[slots[b]])
            ctx = CacheContext.consecutive(self.cache, g_slots, [self.cache.lengths[s] for s in g_slots], R)
            # each row's last token: one row's is the pass's last (an int: views), several rows' by index
            ends = R - 1 if len(group) == 1 else torch.tensor([rows[b] for b in group], device=self.device) - 1
            h = self.model.hidden(tokens.to(self.device), ctx, last=ends)  # [G, 1, dim]: each row's last token's
            for i, b in enumerate(group):
                last[b] = h[i, 0]
        for s, n in zip(slots, rows):
            self.cache.lengths[s] += n
            self.behind[s], self.fed[s] = [], []
        return self.model.logits_cached(torch.stack(last))

    def step(self, slots: list[int], tokens: list[int]) -> torch.Tensor:
        """Feed each slot its latest draft; the logits [B, V] of the draft after it."""
        ctx = CacheContext.consecutive(self.cache, slots, [self.cache.lengths[s] for s in slots], 1)
        h = self.model.hidden(torch.tensor(tokens)[:, None].to(self.device), ctx)  # [B, 1, dim]
        for s, t in zip(slots, tokens):
            self.cache.lengths[s] += 1
            self.fed[s].append(t)
        return self.model.logits_cached(h[:, 0])
