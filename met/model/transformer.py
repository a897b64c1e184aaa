"""The Llama-architecture transformer (weights of HF Llama, Mistral, Qwen2 and Qwen3 ForCausalLM) and its MTP module."""

from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F
from torch import nn

from met.model import packed
from met.model.config import ModelConfig
from met.model.kv_cache import PAD_ROOM, KVCache
from met.model.packed import PackedWeight

# The version of the packed, cached inference path (fuse, _layer_cached, the cache layout) on each kind of
# device. It is part of every plan digest: bump it when that path's kernels or layouts change there, so that
# cost tables measured on the old path are refused rather than trusted. 2: head-major cache, norms folded into
# [in, out] weights; 3: keys and values in one cache tensor, RoPE in place; 4 (CPU only): float32 products of
# enough rows by oneDNN (met.model.packed); 5 (an Intel CPU's): oneDNN for large weights alone; 4 (a GPU's; 6
# and 7 a CPU's, by kernel rule): an MTP pass looks up its token's half of the input projection
# (Transformer._eh_token), a width-1 step writes its keys and values and reads RoPE by slices
# (CacheContext.row), an MTP catch-up pass computes its last row's output alone; 5 (a GPU's; 8 and 9 a CPU's):
# a draft model's width-1 passes take CacheContext.row and its catch-up computes its last row's output alone; 6
# (a GPU's; 10 and 11 a CPU's): q and k features in RoPE pair order, RoPE one complex multiplication in place;
# 7 (a GPU's; 12 and 13 a CPU's): the head and the hidden half of the MTP input projection in one product
# (Transformer._head_eh), so that a verify or draft pass's logits come with the next MTP pass's input rows.
# On a CPU the version is the kernel rule's (packed.RULE.path_version).
CACHED_PATH_VERSION = 7


def cached_path_version(device: str | torch.device) -> int:
    """The cached path's version on this device (on a CPU, its kernel rule's)."""
    return packed.RULE.path_version if torch.device(device).type == "cpu" else CACHED_PATH_VERSION


@dataclass
class CacheContext:
    """Where one cached forward reads and writes: built once per step, shared by every layer."""

    cache: KVCache
    slots: torch.Tensor  # [B] cache slot of each row
    pos: torch.Tensor  # [B, T] absolute position of each token (padding clamped into PAD_ROOM)
    upto: int  # keys read per slot: max(pos) + 1
    first: int | None  # the first slot when slots are consecutive (reads are views); None: reads gather
    mask: torch.Tensor | None  # [B, 1, T, upto] True where a query may attend; None: every query attends to all
    rows: torch.Tensor  # [B, T] slot of each token, for cache writes
    write_pos: torch.Tensor  # [B, T] where each token's k, v are written: pos
    # One row whose tokens sit at start, start + 1, ... (CacheContext.row): its cache writes and RoPE lookups
    # are slices, not index kernels. None: they index by pos.
    start: int | None = None

    @classmethod
    def build(cls, cache: KVCache, slots: list[int], pos: torch.Tensor) -> "CacheContext":
        """Context for rows in slots whose tokens sit at positions pos ([B, T])."""
        device = cache.kv.device
        # Padding rows of a ragged batch may sit past the cache's end (an MTP catch-up pads every row to
        # the longest one's rows, far beyond PAD_ROOM for a row deep in its context): clamp them into
        # PAD_ROOM for the rope lookup, the mask and the writes alike. Real rows never reach PAD_ROOM.
        pos = pos.clamp(max=cache.positions - 1)
        last = int(pos.max())
        upto = last + 1
        # One token per row, every row at the same position: each attends to all upto keys, no mask.
        full_rows = pos.shape[1] == 1 and (pos.shape[0] == 1 or bool((pos == last).all()))
        mask = None
        if not full_rows:  # causal over each row's own positions
            mask = (torch.arange(upto, device=device)[None, None, :] <= pos[:, :, None])[:, None]
        first = slots[0] if slots == list(range(slots[0], slots[0] + len(slots))) else None
        slot_t = torch.tensor(slots, device=device)
        return cls(cache, slot_t, pos, upto, first, mask, slot_t[:, None].expand_as(pos), pos)

    @classmethod
    def row(cls, cache: KVCache, slot: int, start: int, T: int) -> "CacheContext":
        """Context for one row of T tokens at positions start..start + T - 1 of slot (a width-1 step or draft pass).

        Built from Python ints, where build() reduces and compares its position tensor; each layer's write is
        then a copy into a slice and the RoPE rows are slices of the tables, not index kernels.
        """
        if not 0 <= start <= start + T <= cache.positions - PAD_ROOM:
            raise ValueError(f"positions {start}..{start + T - 1} lie outside the cache's {cache.max_len}")
        return _RowContext(cache, slot, start, T)

    @classmethod
    def consecutive(cls, cache: KVCache, slots: list[int], starts: list[int], T: int) -> "CacheContext":
        """Context for T tokens in each slot, slot b's at starts[b], starts[b] + 1, ...: one slot's is row()'s (slices),
        several slots' build()'s (a padding row's positions past the cache's end clamped into PAD_ROOM)."""
        if len(slots) == 1:
            return cls.row(cache, slots[0], starts[0], T)
        return cls.build(cache, slots, (torch.tensor(starts)[:, None] + torch.arange(T)).to(cache.kv.device))

    def write(self, layer: int, kv: torch.Tensor) -> None:
        """Store this step's keys and values kv ([B, T, 2 * n_kv_heads, head_dim]) of a layer at their positions."""
        if self.start is None:
            self.cache.write(layer, self.rows, self.write_pos, kv)
        else:
            self.cache.kv[layer, self.first, :, self.start : self.start + kv.shape[1]] = kv[0].transpose(0, 1)


class _RowContext(CacheContext):
    """CacheContext.row's context. Its positions, write indexes and mask are views of tensors the cache holds,
    made when first read: the slice path reads none of them but a verify's mask, and each view is a few
    microseconds of a draft pass's few hundred."""

    def __init__(self, cache: KVCache, slot: int, start: int, T: int):
        self.cache, self.first, self.start, self.upto = cache, slot, start, start + T
        self.slots = cache.slot_rows[slot]

    @cached_property
    def pos(self) -> torch.Tensor:
        return self.cache.position_ids[self.start : self.upto][None]

    @cached_property
    def mask(self) -> torch.Tensor | None:
        if self.upto - self.start == 1:
            return None
        return self.cache.causal()[self.start : self.upto, : self.upto][None, None]

    @cached_property
    def rows(self) -> torch.Tensor:
        return self.slots[:, None].expand(1, self.upto - self.start)

    @cached_property
    def write_pos(self) -> torch.Tensor:
        return self.pos


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rope_table(cfg: ModelConfig, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables [length, head_dim] in HF Llama's layout (frequencies repeated, rotate_half)."""
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim))
    freqs = torch.outer(torch.arange(length, dtype=torch.float64), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().float(), emb.sin().float()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x ([B, T, H, D]) by cos/sin ([B, T, 1, D])."""
    return x * cos + _rotate_half(x) * sin


def _rotate(src: torch.Tensor, rotation: torch.Tensor, out: torch.Tensor) -> None:
    """RoPE on src ([B, T, heads, head_dim], features in rope_pair_order) into out (src itself allowed): each pair
    (a, b) as a + ib times rotation ([B, T, 1, head_dim / 2] complex), one kernel in float32 and float64.

    Pair j of a head is rotate_half's (j, j + head_dim / 2): a cos - b sin, a sin + b cos, as apply_rope.
    """
    if src.dtype in (torch.float32, torch.float64):
        pairs = torch.view_as_complex(src.unflatten(-1, (-1, 2)))
        if src is out:  # mul_ takes half the time of mul(out=) at a step's sizes
            pairs.mul_(rotation)
        else:
            torch.mul(pairs, rotation, out=torch.view_as_complex(out.unflatten(-1, (-1, 2))))
    else:  # half precision: rotated in float32, stored back in place
        out.copy_(torch.view_as_real(torch.view_as_complex(src.float().unflatten(-1, (-1, 2))) * rotation).flatten(-2))


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=cfg.output_bias)
        # Qwen3: each head's q and k vector RMS-normed over head_dim before RoPE, one weight for q, one for k
        self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps) if cfg.qk_norm else None

    def forward(self, x, cos, sin, layer: int, ctx: CacheContext | None = None, prior=None):
        """Attention over x ([B, T, dim]).

        ctx set: write this step's keys into the cache, then attend over the slot's cached keys.
        ctx None: causal self-attention over x (training). prior=(k, v) from a first MTP pass:
        recursive MTP training, where position i attends to prior keys before i and to itself.
        Returns (output, (k, v)) with k, v: [B, T, n_kv_heads, head_dim] after RoPE.
        """
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim)
        gqa = self.n_heads != self.n_kv_heads
        if ctx is not None:
            ctx.cache.write(layer, ctx.rows, ctx.write_pos, torch.cat([k, v], 2))
            keys, values = ctx.cache.read(layer, ctx.slots, ctx.upto, ctx.first)
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2), keys, values, attn_mask=ctx.mask, enable_gqa=gqa
            )
        elif prior is not None:
            pk, pv = prior
            before = torch.ones(T, T, dtype=torch.bool, device=x.device).tril(-1)
            itself = torch.eye(T, dtype=torch.bool, device=x.device)
            mask = torch.cat([before, itself], dim=1)  # [T, 2T]
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2), torch.cat([pk, k], 1).transpose(1, 2), torch.cat([pv, v], 1).transpose(1, 2),
                attn_mask=mask, enable_gqa=gqa,
            )
        else:
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=gqa
            )
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1)), (k, v)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.up_proj = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.down_proj = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int):
        super().__init__()
        self.index = index  # this layer's slot in the KV cache
        self.input_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, ctx=None, prior=None):
        a, kv = self.self_attn(self.input_layernorm(x), cos, sin, self.index, ctx, prior)
        x = x + a
        return x + self.mlp(self.post_attention_layernorm(x)), kv


class _Body(nn.Module):
    """HF's `model.` prefix: embeddings, decoder layers, final norm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)


class MTP(nn.Module):
    """DeepSeek-V3-style multi-token prediction: (hidden at i, embedding of token i+1) -> token i+2."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.hnorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.enorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.eh_proj = nn.Linear(2 * cfg.dim, cfg.dim, bias=False)
        self.block = DecoderLayer(cfg, cfg.n_layers)  # cached after the main layers
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)


@dataclass
class _Fused:
    """Inference weights of one layer packed for fewer, larger kernels (built by Transformer.fuse).

    Each RMSNorm's weight (times sqrt(dim)) is folded into the rows of the projection it feeds, so the
    cached path normalises with `_unit_rms` alone. Weights are stored [in, out] (`_pack`), each called as `w(x)` for `x @ w`.
    """

    wqkv: PackedWeight  # [dim, (H + 2 * Hkv) * head_dim]: q, k, v projections side by side, input norm folded in
    w13: PackedWeight  # [dim, 2 * ffn]: gate and up projections side by side, post-attention norm folded in
    wo: PackedWeight  # [H * head_dim, dim]
    w2: PackedWeight  # [ffn, dim]
    # [H + Hkv, head_dim]: q_norm's weight on each q head, k_norm's on each k head, times sqrt(head_dim) (the factor
    # `_unit_rms` leaves out); None: no q/k norm (Llama, Qwen2)
    qk_scale: torch.Tensor | None = None


def _pack(weight: torch.Tensor, norm: RMSNorm | None = None, bias: torch.Tensor | None = None) -> PackedWeight:
    """An nn.Linear weight [out, in] as [in, out] for `x @ w`, with the norm's scale (times sqrt(in)) folded in.

    x @ w with w contiguous [in, out] reads the weight as it lies; on CPU with cold caches it takes
    about half the time of F.linear at width 1 and two thirds at width 5 (the verify shapes).
    """
    return PackedWeight.of(_fold(weight, norm).detach().t(), bias)


def _fold(weight: torch.Tensor, norm: RMSNorm | None) -> torch.Tensor:
    """An nn.Linear weight [out, in] with the norm's scale times sqrt(in) folded into its columns (None: as is)."""
    return weight if norm is None else weight * (norm.weight * weight.shape[1] ** 0.5)


def _unit_rms(x: torch.Tensor, floor: torch.Tensor) -> torch.Tensor:
    """x / sqrt(|x|^2 + eps * dim): RMSNorm without its weight and its sqrt(dim), in three kernels.

    Equal to x * rsqrt(mean(x^2) + eps) / sqrt(dim) (floor = sqrt(eps * dim)); the two missing factors
    live in the next projection's weight (`_pack`). CPU's rms_norm takes about 2.5x as long.
    """
    return x / torch.hypot(torch.linalg.vector_norm(x, dim=-1, keepdim=True), floor)


def rope_pair_order(head_dim: int) -> torch.Tensor:
    """Within a head, the features of each RoPE pair side by side: 0, half, 1, half + 1, ... (rotate_half's pairs).

    The cached path keeps q and k in this order, so RoPE is one complex multiplication in place; the
    attention scores, q . k, do not change when both are permuted alike.
    """
    half = head_dim // 2
    return torch.stack([torch.arange(half), torch.arange(half) + half], 1).flatten()


def _fuse_layer(layer: "DecoderLayer") -> _Fused:
    a, m = layer.self_attn, layer.mlp
    hd = a.head_dim
    order = rope_pair_order(hd)
    # q and k rows in pair order, head by head; v's as they are
    rows = torch.cat([(h * hd + order) for h in range(a.n_heads + a.n_kv_heads)]
                     + [torch.arange((a.n_heads + a.n_kv_heads) * hd, (a.n_heads + 2 * a.n_kv_heads) * hd)])
    qkv_bias = torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias])[rows] if a.q_proj.bias is not None else None
    qk_scale = None
    if a.q_norm is not None:
        qk_scale = torch.cat([a.q_norm.weight.expand(a.n_heads, -1), a.k_norm.weight.expand(a.n_kv_heads, -1)])
        qk_scale = (qk_scale * hd ** 0.5)[:, order].detach()
    return _Fused(
        _pack(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])[rows], layer.input_layernorm, qkv_bias),
        _pack(torch.cat([m.gate_proj.weight, m.up_proj.weight]), layer.post_attention_layernorm),
        _pack(a.o_proj.weight, bias=a.o_proj.bias), _pack(m.down_proj.weight), qk_scale,
    )


class Transformer(nn.Module):
    """Llama-architecture decoder; HF LlamaForCausalLM's state-dict names (Qwen2: biases, Qwen3: q/k norms), `mtp.*`."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = _Body(cfg)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.mtp = MTP(cfg) if cfg.mtp_depth > 0 else None
        cos, sin = rope_table(cfg, cfg.max_seq_len + PAD_ROOM)
        self.register_buffer("rope_cos", cos, persistent=False)  # [max_len + PAD_ROOM, head_dim]
        self.register_buffer("rope_sin", sin, persistent=False)

    def fuse(self) -> None:
        """Pack weights for the cached inference path; call again after changing weights or dtype."""
        with torch.no_grad():
            self._fused = [_fuse_layer(layer) for layer in self.model.layers]
            self._fused_mtp = _fuse_layer(self.mtp.block) if self.mtp is not None else None
            self._head = _pack(self.lm_head.weight, self.model.norm)  # final norm folded into the head
            if self.mtp is not None:
                m, d = self.mtp, self.cfg.dim
                self._mtp_head = _pack(self.lm_head.weight, m.norm)
                eh = _fold(m.eh_proj.weight[:, :d], m.hnorm)  # the hidden state's half of the input projection
                self._eh = _pack(eh)
                # The head and that half read the same unit-normed rows: one product gives a step's logits and
                # the MTP block's input rows (logits_cached(..., mtp_input=True)), a draft pass's likewise.
                self._head_eh = _pack(torch.cat([_fold(self.lm_head.weight, self.model.norm), eh]))
                self._mtp_head_eh = _pack(torch.cat([_fold(self.lm_head.weight, m.norm), eh]))
                # The embedding's half depends on the token alone: each token's normed embedding times it, once,
                # so a draft pass looks its row up instead of embedding, norming and multiplying.
                e = self.model.embed_tokens.weight
                self._eh_token = _unit_rms(e, self._rms_floor_of(e)) @ _fold(m.eh_proj.weight[:, d:], m.enorm).t()
        p = self.lm_head.weight
        self._rms_floor = self._rms_floor_of(p)
        self._qk_floor = torch.tensor((self.cfg.norm_eps * self.cfg.head_dim) ** 0.5, dtype=p.dtype, device=p.device)
        half = self.cfg.head_dim // 2
        # e^(i * position * frequency) [positions, half] for the pairs of rope_pair_order, built once: float64 weights
        # rotate in complex128, every other dtype in complex64 (torch has no bfloat16 complex)
        real = torch.float64 if p.dtype == torch.float64 else torch.float32
        self._rope_rotation = torch.complex(self.rope_cos[:, :half].to(real), self.rope_sin[:, :half].to(real))

    def _rms_floor_of(self, like: torch.Tensor) -> torch.Tensor:
        """`_unit_rms`'s floor sqrt(eps * dim) in like's dtype and device."""
        return torch.tensor((self.cfg.norm_eps * self.cfg.dim) ** 0.5, dtype=like.dtype, device=like.device)

    def _layer_cached(self, f: _Fused, x: torch.Tensor, rotation: torch.Tensor, ctx: CacheContext, index: int,
                      last: torch.Tensor | int | None = None) -> torch.Tensor:
        """One decoder layer over cached context with packed weights: same maths as DecoderLayer.

        rotation: _rope_cached's. last ([B], each row's index among its T tokens; an int: the same index in every
        row): every token's keys and values are cached, but only that token's output is computed (attention,
        output projection, MLP), returned as [B, 1, dim].
        """
        cfg = self.cfg
        B, T, _ = x.shape
        H, Hkv, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        qkv = f.wqkv(_unit_rms(x, self._rms_floor)).view(B, T, H + 2 * Hkv, hd)
        qk = qkv[:, :, : H + Hkv]
        # Qwen3 normalises each q and k head first (into a new tensor: the RoPE below writes over qk)
        src = qk if f.qk_scale is None else _unit_rms(qk, self._qk_floor) * f.qk_scale
        _rotate(src, rotation, qk)  # RoPE on q and k at once, in place
        ctx.write(index, qkv[:, :, H:])  # roped keys, then values
        q, mask = qkv[:, :, :H], None
        if isinstance(last, int):  # the same token of every row: views
            q, x = q[:, last : last + 1], x[:, last : last + 1]
            # the last of one row's consecutive tokens (CacheContext.row) attends to every key read: no mask
            if not (ctx.start is not None and last == T - 1) and ctx.mask is not None:
                mask = ctx.mask[:, :, last : last + 1]
            T = 1
        elif last is not None:
            rows = torch.arange(B, device=x.device)
            q, x = q[rows, last][:, None], x[rows, last][:, None]
            mask = ctx.mask[rows, :, last][:, :, None] if ctx.mask is not None else None  # [B, 1, 1, upto]
            T = 1
        else:
            mask = ctx.mask
        keys, values = ctx.cache.read(index, ctx.slots, ctx.upto, ctx.first)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask, enable_gqa=H != Hkv)
        x = x + f.wo(a.transpose(1, 2).reshape(B, T, H * hd))
        gate, up = f.w13(_unit_rms(x, self._rms_floor)).chunk(2, -1)
        return x + f.w2(F.silu(gate) * up)

    def _rope_cached(self, ctx: CacheContext) -> torch.Tensor:
        """The rotation of each token's RoPE pairs, [B, T, 1, head_dim / 2] complex (fuse's table at ctx's positions)."""
        if ctx.start is not None:  # one row at consecutive positions: a slice of the table
            return self._rope_rotation[ctx.start : ctx.upto][None, :, None]
        return self._rope_rotation[ctx.pos][:, :, None]

    def _rope(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = self.lm_head.weight.dtype
        return self.rope_cos[pos][:, :, None].to(dtype), self.rope_sin[pos][:, :, None].to(dtype)  # [B, T, 1, D]

    def _positions(self, tokens: torch.Tensor, ctx: CacheContext | None) -> torch.Tensor:
        if ctx is not None:
            return ctx.pos
        return torch.arange(tokens.shape[1], device=tokens.device).expand(tokens.shape[0], -1)

    def hidden(self, tokens: torch.Tensor, ctx: CacheContext | None = None, taps: tuple[int, ...] = (),
               last: torch.Tensor | int | None = None):
        """Last-layer hidden states [B, T, dim] (before the final norm) of tokens [B, T].

        taps (an EAGLE-3 head's target layers, ascending): return (hidden, the hidden states entering
        each of those layers side by side [B, T, len(taps) * dim]); n_layers is the last layer's output.
        last (the cached path only, as in _layer_cached): every token is cached, but the last layer computes
        one token's output per row, [B, 1, dim] (a draft model's catch-up needs its last row's alone).
        """
        x = self.model.embed_tokens(tokens)
        if taps:
            if last is not None:
                raise ValueError("last and taps together: an EAGLE-3 head's features need every row")
            return self._hidden_taps(x, ctx, taps)
        if ctx is not None and getattr(self, "_fused", None) is not None:
            rotation = self._rope_cached(ctx)
            final = len(self._fused) - 1
            for i, f in enumerate(self._fused):
                x = self._layer_cached(f, x, rotation, ctx, i, last if i == final else None)
            return x
        if last is not None:
            raise ValueError("last needs the cached path (a context and fused weights)")
        cos, sin = self._rope(self._positions(tokens, ctx))
        for layer in self.model.layers:
            x, _ = layer(x, cos, sin, ctx)
        return x

    def _hidden_taps(self, x: torch.Tensor, ctx: CacheContext | None, taps: tuple[int, ...]):
        """hidden() keeping the residual stream entering each layer of taps (its own loop: the plain one is untouched)."""
        fused = ctx is not None and getattr(self, "_fused", None) is not None
        if fused:
            rotation = self._rope_cached(ctx)
        else:
            cos, sin = self._rope(self._positions(x[..., 0], ctx))
        kept = []
        for i in range(self.cfg.n_layers):
            kept += [x] * taps.count(i)
            if fused:
                x = self._layer_cached(self._fused[i], x, rotation, ctx, i)
            else:
                x, _ = self.model.layers[i](x, cos, sin, ctx)
        kept += [x] * taps.count(self.cfg.n_layers)
        return x, torch.cat(kept, -1)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Next-token logits [..., vocab] from main-model hidden states."""
        return self.lm_head(self.model.norm(hidden))

    def logits_cached(self, hidden: torch.Tensor, mtp_input: bool = False):
        """logits() with the packed head of fuse(): the inference path.

        mtp_input: also the MTP block's input rows of these hidden states (mtp_input()), from the same product:
        returns (logits [..., V], rows [..., dim]).
        """
        return self._head_product(hidden, self._head_eh if mtp_input else self._head, mtp_input)

    def _head_product(self, hidden: torch.Tensor, head: PackedWeight, split: bool):
        """head of the unit-normed hidden states; split: cut into (logits, MTP input rows) at the vocabulary."""
        out = head(_unit_rms(hidden, self._rms_floor))
        return (out[..., : self.cfg.vocab_size], out[..., self.cfg.vocab_size :]) if split else out

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, vocab] of a causal pass without cache (training, reference checks)."""
        return self.logits(self.hidden(tokens))

    def mtp_hidden(self, hidden: torch.Tensor, next_tokens: torch.Tensor, ctx: CacheContext | None = None,
                   pos: torch.Tensor | None = None, prior=None, last: torch.Tensor | int | None = None):
        """One MTP pass: hidden [B, T, dim] at positions i and tokens i+1 [B, T] -> (MTP hidden, its (k, v)).

        last (the cached path only; [B], each row's index among its T, or one int for all): a catch-up pass,
        which caches every row's keys and values but needs the MTP hidden of one row alone: that row's,
        [B, 1, dim].
        """
        if ctx is not None and pos is None and getattr(self, "_fused_mtp", None) is not None:
            return self.mtp_hidden_from(self.mtp_input(hidden), next_tokens, ctx, last), None
        if last is not None:
            raise ValueError("last needs the cached path (a context and fused weights)")
        if pos is None:
            pos = self._positions(next_tokens, ctx)
        m = self.mtp
        e = self.model.embed_tokens(next_tokens)
        x = m.eh_proj(torch.cat([m.hnorm(hidden), m.enorm(e)], dim=-1))
        cos, sin = self._rope(pos)
        return m.block(x, cos, sin, ctx, prior)

    def mtp_input(self, hidden: torch.Tensor) -> torch.Tensor:
        """The hidden states' half of the MTP block's input projection, [..., dim] (the cached path's catch-up rows)."""
        return self._eh(_unit_rms(hidden, self._rms_floor))

    def mtp_hidden_from(self, rows: torch.Tensor, next_tokens: torch.Tensor, ctx: CacheContext,
                        last: torch.Tensor | int | None = None) -> torch.Tensor:
        """mtp_hidden() on the cached path from mtp_input()'s rows [B, T, dim] (as logits_cached(..., mtp_input=True)
        and mtp_logits_cached(..., mtp_input=True) give them): the MTP hidden alone."""
        x = self._eh_token[next_tokens].add_(rows)
        return self._layer_cached(self._fused_mtp, x, self._rope_cached(ctx), ctx, self.cfg.n_layers, last)

    def mtp_logits(self, mtp_hidden: torch.Tensor) -> torch.Tensor:
        """Draft logits [..., vocab] from MTP hidden states (the head is shared with the main model)."""
        return self.lm_head(self.mtp.norm(mtp_hidden))

    def mtp_logits_cached(self, mtp_hidden: torch.Tensor, mtp_input: bool = False):
        """mtp_logits() with the packed head of fuse(): the inference path.

        mtp_input: also the next MTP pass's input rows of these MTP hidden states, from the same product (a
        recursive draft feeds the block its own output): returns (logits [..., V], rows [..., dim]).
        """
        return self._head_product(mtp_hidden, self._mtp_head_eh if mtp_input else self._mtp_head, mtp_input)

    def num_parameters(self, include_mtp: bool = True) -> int:
        """Parameter count, with or without the MTP module."""
        return sum(p.numel() for n, p in self.named_parameters() if include_mtp or not n.startswith("mtp."))
