"""The KV cache: allocated up front for a maximum batch and length, with per-slot lengths and rollback."""

from dataclasses import dataclass, field

import torch

# Rows written past a sequence's valid length (padding in a ragged batch) land in this many
# spare positions at the end of the cache, never on another row's valid entries.
PAD_ROOM = 24


@dataclass
class KVCache:
    """Keys and values of every layer (plus the MTP block) for max_batch sequence slots."""

    # Head-major storage: a slot's keys of one head are contiguous, so attention reads them as they lie
    # (at width 16 and 400 cached tokens, 2.5x faster attention on CPU than a [..., len, heads, dim] layout).
    # Keys and values share one tensor, heads first then values, so a step writes both in one kernel.
    kv: torch.Tensor  # [layers, max_batch, 2 * n_kv_heads, max_len + PAD_ROOM, head_dim]
    max_len: int  # longest valid sequence a slot may hold
    lengths: list[int] = field(default_factory=list)  # tokens cached per slot (main model)
    mtp_lengths: list[int] = field(default_factory=list)  # tokens cached per slot (MTP block)
    slot_ids: torch.Tensor = field(init=False)  # [max_batch] 0, 1, ...: a step's slot tensor as a view
    slot_rows: list[torch.Tensor] = field(init=False)  # slot_ids[s : s + 1] for each slot s: one row's, made once
    position_ids: torch.Tensor = field(init=False)  # [positions] 0, 1, ...: one row's positions as a view
    _causal: torch.Tensor | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.slot_ids = torch.arange(self.kv.shape[1], device=self.kv.device)
        self.slot_rows = [self.slot_ids[s : s + 1] for s in range(self.kv.shape[1])]
        self.position_ids = torch.arange(self.kv.shape[3], device=self.kv.device)

    def causal(self) -> torch.Tensor:
        """[positions, positions] True where position j <= i: one row's mask for tokens at i is a view of row i
        (built on first use, kept: 1.1 MB at 1,024 positions)."""
        if self._causal is None:
            n = self.positions
            self._causal = torch.ones(n, n, dtype=torch.bool, device=self.kv.device).tril()
        return self._causal

    @classmethod
    def allocate(cls, n_layers: int, max_batch: int, max_len: int, n_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> "KVCache":
        """A zeroed cache for max_batch slots of up to max_len tokens each."""
        shape = (n_layers, max_batch, 2 * n_kv_heads, max_len + PAD_ROOM, head_dim)
        return cls(kv=torch.zeros(shape, dtype=dtype, device=device), max_len=max_len,
                   lengths=[0] * max_batch, mtp_lengths=[0] * max_batch)

    @property
    def k(self) -> torch.Tensor:
        """Keys [layers, max_batch, n_kv_heads, max_len + PAD_ROOM, head_dim] (a view), each head's features in
        RoPE pair order (met.model.transformer.rope_pair_order), as the cached path writes them."""
        return self.kv[:, :, : self.kv.shape[2] // 2]

    @property
    def v(self) -> torch.Tensor:
        """Values [layers, max_batch, n_kv_heads, max_len + PAD_ROOM, head_dim] (a view)."""
        return self.kv[:, :, self.kv.shape[2] // 2 :]

    @property
    def max_batch(self) -> int:
        return self.kv.shape[1]

    @property
    def positions(self) -> int:
        """Positions a slot can address: max_len plus the PAD_ROOM spares."""
        return self.kv.shape[3]

    def room(self, slot: int) -> int:
        """Positions still free in a slot."""
        return self.max_len - self.lengths[slot]

    def reset(self, slot: int) -> None:
        """Free a slot: its old entries are masked out by length and overwritten by the next sequence."""
        self.lengths[slot] = 0
        self.mtp_lengths[slot] = 0

    def move(self, src: int, dst: int) -> None:
        """Move slot src's sequence into the free slot dst (its cached entries copied), freeing src."""
        if self.lengths[dst]:
            raise ValueError(f"slot {dst} holds a sequence; a move needs a free slot")
        n = self.lengths[src]  # the MTP block's entries lie within: mtp_lengths <= lengths
        self.kv[:, dst, :, :n] = self.kv[:, src, :, :n]
        self.lengths[dst], self.mtp_lengths[dst] = n, self.mtp_lengths[src]
        self.reset(src)

    def rollback(self, slot: int, length: int) -> None:
        """Drop every cached position at or beyond length (rejected drafts), main model and MTP."""
        if not 0 <= length <= self.lengths[slot]:
            raise ValueError(f"rollback of slot {slot} to {length}, but it holds {self.lengths[slot]}")
        self.lengths[slot] = length
        self.mtp_lengths[slot] = min(self.mtp_lengths[slot], length)

    def write(self, layer: int, rows: torch.Tensor, pos: torch.Tensor, kv: torch.Tensor) -> None:
        """Store kv ([B, T, 2 * n_kv_heads, head_dim]: keys then values) at slot rows and positions pos ([B, T]).

        Positions past the end (padding rows of a ragged batch) must already be clamped into PAD_ROOM.
        """
        self.kv[layer].transpose(1, 2).index_put_((rows, pos), kv)

    def read(self, layer: int, slots: torch.Tensor, upto: int, first: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [B, n_kv_heads, upto, head_dim] of slots.

        first: the first slot when slots are consecutive (first, first + 1, ...): the reads are views.
        None: a gather, of the first upto positions only.
        """
        if first is not None:
            kv = self.kv[layer, first : first + slots.shape[0], :, :upto]
        else:
            kv = self.kv[layer, slots, :, :upto]
        h = kv.shape[1] // 2
        return kv[:, :h], kv[:, h:]
