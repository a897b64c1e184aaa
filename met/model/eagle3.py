"""EAGLE-3 draft heads in their published layout: one decoder layer over the target's fused hidden states.

A head drafts for a target it was trained on. Its input at position i is the target's hidden states
entering three of its layers (low, middle, high) at i, concatenated and projected by `fc` to the
head's width, and the embedding of token i+1. Its one layer (`midlayer`) normalises the two
(`input_layernorm` the embedding, `hidden_norm` the hidden), attends over their concatenation
(q, k and v projections of width 2 x hidden) with a KV cache of its own, adds the hidden as the
residual and runs a SwiGLU MLP; `norm` then `lm_head` give logits over the draft vocabulary, a
subset of the target's: draft id d is target id d + d2t[d]. A further draft feeds the layer's own
output (before `norm`) back as the hidden with the embedding of the draft before it, since no target
hidden exists for a token the target has not run.

The layout is the one vLLM's and SGLang's llama_eagle3 models load (SafeAILab's EAGLE-3 heads,
SpecForge's): config.json of a LlamaForCausalLMEagle3 with `draft_vocab_size` and often
`target_hidden_size`; tensors `fc.weight` [hidden, 3 x target_hidden], `midlayer.*`, `norm.weight`,
`lm_head.weight` [draft_vocab, hidden], `d2t` [draft_vocab] (int), `t2d` [vocab] (bool), and
optionally `embed_tokens.weight` (else the target's embedding is used). The layers are vLLM's
indexing: id j is the hidden state entering target layer j (the residual stream after layers
0..j-1), by default (2, n // 2, n - 3) of an n-layer target, or the config's
`eagle_aux_hidden_state_layer_ids`.
"""

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError, safe_open
from torch import nn

import met.bounded_read as bounded_read
from met.exit_codes import EX_DATAERR, EX_NOINPUT
from met.model.config import ModelConfig
from met.model.dflash import DrafterError
from met.model.errors import RecipeError
from met.model.kv_cache import PAD_ROOM
from met.model.transformer import MLP, CacheContext, RMSNorm, apply_rope, rope_table

ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")  # the names published heads' configs give


@dataclass(frozen=True, slots=True)
class Eagle3Config:
    """Shape of an EAGLE-3 head and what it needs of its target."""

    dim: int  # hidden_size: the head's width
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    vocab_size: int  # the target's vocabulary (t2d's length)
    draft_vocab_size: int  # the head's own logits (lm_head's rows)
    target_dim: int  # the target's hidden size (fc reads len(layers) of these side by side)
    layers: tuple[int, ...]  # target layers whose entering hidden states fc fuses, ascending (vLLM's ids)
    max_seq_len: int  # positions the head's RoPE table covers: the target's context
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    norm_before_residual: bool = False  # some heads add the normed hidden as the residual, not the raw one

    def __post_init__(self) -> None:
        for name in ("dim", "n_heads", "n_kv_heads", "head_dim", "ffn_dim", "vocab_size", "draft_vocab_size",
                     "target_dim", "max_seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.head_dim % 2 or self.n_heads % self.n_kv_heads:
            raise ValueError(f"head_dim {self.head_dim} must be even and n_heads {self.n_heads} a multiple of "
                             f"n_kv_heads {self.n_kv_heads}")
        if self.draft_vocab_size > self.vocab_size:
            raise ValueError(f"draft_vocab_size {self.draft_vocab_size} exceeds the vocabulary of {self.vocab_size}")
        if not self.layers or list(self.layers) != sorted(self.layers):
            raise ValueError(f"layers must be ascending and not empty, got {self.layers}")


class _Attention(nn.Module):
    """Attention whose q, k and v read [embedding, hidden] side by side (2 x dim), with RoPE as HF Llama's."""

    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(2 * cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, cos, sin, ctx: CacheContext | None) -> torch.Tensor:
        """x [B, T, 2 * dim] -> [B, T, dim]; ctx set: through the head's cache (layer 0), else causal over x."""
        B, T, _ = x.shape
        q = apply_rope(self.q_proj(x).view(B, T, self.n_heads, self.head_dim), cos, sin)
        k = apply_rope(self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim), cos, sin)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim)
        gqa = self.n_heads != self.n_kv_heads
        if ctx is not None:
            ctx.cache.write(0, ctx.rows, ctx.write_pos, torch.cat([k, v], 2))
            keys, values = ctx.cache.read(0, ctx.slots, ctx.upto, ctx.first)
            out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=ctx.mask, enable_gqa=gqa)
        else:
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 is_causal=True, enable_gqa=gqa)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))


class _Midlayer(nn.Module):
    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)  # on the token embedding
        self.hidden_norm = RMSNorm(cfg.dim, cfg.norm_eps)  # on the fused (or the head's own) hidden
        self.self_attn = _Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = MLP(cfg)  # the decoder's SwiGLU: it reads dim and ffn_dim, which the head's config has too


class Eagle3Head(nn.Module):
    """An EAGLE-3 head: (hidden [B, T, dim], embeddings of the next tokens [B, T, dim]) -> its output [B, T, dim]."""

    def __init__(self, cfg: Eagle3Config, own_embedding: bool = True):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.dim) if own_embedding else None  # None: the target's
        self.fc = nn.Linear(len(cfg.layers) * cfg.target_dim, cfg.dim, bias=False)
        self.midlayer = _Midlayer(cfg)
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.dim, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))  # draft id -> target - draft
        self.register_buffer("t2d", torch.ones(cfg.vocab_size, dtype=torch.bool))  # target ids the head can propose
        self.set_tables()

    def set_tables(self) -> None:
        """The RoPE tables and the draft -> target id map, recomputed from cfg and d2t (after loading weights)."""
        cos, sin = rope_table(self.cfg, self.cfg.max_seq_len + PAD_ROOM)  # reads head_dim and rope_theta only
        device = self.d2t.device
        self.register_buffer("rope_cos", cos.to(device), persistent=False)  # [max_len + PAD_ROOM, head_dim]
        self.register_buffer("rope_sin", sin.to(device), persistent=False)
        targets = torch.arange(self.cfg.draft_vocab_size, device=device) + self.d2t
        self.register_buffer("targets", targets, persistent=False)  # [draft_vocab] target id of each draft id
        # an identity map over the whole vocabulary needs no scatter into the target's (meta: not loaded yet)
        self.identity = (self.cfg.draft_vocab_size == self.cfg.vocab_size and not self.d2t.is_meta
                         and bool((self.d2t == 0).all()))

    def embedding(self, target: nn.Module) -> nn.Embedding:
        """The token embedding the head reads: its own, else the target's."""
        return self.embed_tokens if self.embed_tokens is not None else target.model.embed_tokens

    def fuse(self, taps: torch.Tensor) -> torch.Tensor:
        """The head's hidden [..., dim] from the target's hidden states at cfg.layers ([..., n * target_dim])."""
        return self.fc(taps)

    def forward(self, hidden: torch.Tensor, embeds: torch.Tensor, pos: torch.Tensor,
                ctx: CacheContext | None = None) -> torch.Tensor:
        """The layer's output [B, T, dim] (before `norm`) at positions pos [B, T]: the next pass's hidden."""
        m = self.midlayer
        dtype = self.lm_head.weight.dtype
        cos, sin = self.rope_cos[pos][:, :, None].to(dtype), self.rope_sin[pos][:, :, None].to(dtype)
        h = m.hidden_norm(hidden)
        residual = h if self.cfg.norm_before_residual else hidden
        x = residual + m.self_attn(torch.cat([m.input_layernorm(embeds), h], -1), cos, sin, ctx)
        return x + m.mlp(m.post_attention_layernorm(x))

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Logits over the TARGET vocabulary [..., vocab] from outputs [..., dim]: -inf where the head cannot draft.

        Over the target's ids, so greedy picks, confidences (log-softmax), sampled q and seeded picks are
        the target vocabulary's as the verify reads them; a token outside the draft vocabulary gets q = 0.
        """
        draft = self.lm_head(self.norm(out))  # [..., draft_vocab]
        if self.identity:
            return draft
        full = draft.new_full((*draft.shape[:-1], self.cfg.vocab_size), float("-inf"))
        full[..., self.targets] = draft
        return full


def _ids(doc: dict, n_layers: int) -> tuple[int, ...]:
    """The target layers of a head's config (vLLM's eagle_aux_hidden_state_layer_ids), else vLLM's default."""
    eagle = doc.get("eagle_config") if isinstance(doc.get("eagle_config"), dict) else {}
    ids = doc.get("eagle_aux_hidden_state_layer_ids") or eagle.get("eagle_aux_hidden_state_layer_ids")
    # the target hands them over in layer order (vLLM concatenates them as its layers pass)
    return tuple(sorted(ids or (2, n_layers // 2, n_layers - 3)))


def read_eagle3_config(folder: Path, target: ModelConfig) -> tuple[Eagle3Config, dict]:
    """The head config of folder/config.json for the target; DrafterError (EX_DATAERR) saying what does not fit."""
    from met.model.hf_config import _count, _json, _positive, _refuse_options, _rope_theta

    path = folder / "config.json"
    if not path.exists():
        raise DrafterError(EX_NOINPUT, f"{folder} holds no config.json; an EAGLE-3 head folder has config.json and "
                           "model.safetensors")
    try:
        doc = _json(path)
        archs = doc.get("architectures") or []
        if not any(a in ARCHITECTURES for a in archs):
            raise DrafterError(EX_DATAERR, f"{path}: architectures {archs} is not an EAGLE-3 head "
                               f"(met loads {', '.join(ARCHITECTURES)})")
        _refuse_options(doc)
        if (n := _count(doc, path, "num_hidden_layers", 1)) != 1:
            raise DrafterError(EX_DATAERR, f"{path}: num_hidden_layers {n}; met runs EAGLE-3 heads of one layer")
        dim, heads = _count(doc, path, "hidden_size"), _count(doc, path, "num_attention_heads")
        vocab = _count(doc, path, "vocab_size")
        cfg = Eagle3Config(
            dim=dim, n_heads=heads, n_kv_heads=_count(doc, path, "num_key_value_heads", heads),
            head_dim=_count(doc, path, "head_dim", dim // heads), ffn_dim=_count(doc, path, "intermediate_size"),
            vocab_size=vocab, draft_vocab_size=_count(doc, path, "draft_vocab_size", vocab),
            target_dim=_count(doc, path, "target_hidden_size", dim), layers=_ids(doc, target.n_layers),
            max_seq_len=target.max_seq_len, norm_eps=_positive(doc, path, "rms_norm_eps", 1e-5),
            rope_theta=_rope_theta(doc, path), norm_before_residual=bool(doc.get("norm_before_residual", False)))
    except RecipeError as exc:
        raise DrafterError(EX_DATAERR, str(exc)) from None
    except (TypeError, ValueError) as exc:
        raise DrafterError(EX_DATAERR, f"{path}: {exc}") from None
    if cfg.target_dim != target.dim:
        raise DrafterError(EX_DATAERR, f"{folder} is a head for a target of hidden size {cfg.target_dim}; this model's "
                           f"is {target.dim}")
    if cfg.vocab_size != target.vocab_size:
        raise DrafterError(EX_DATAERR, f"{folder} is a head for a vocabulary of {cfg.vocab_size} tokens; this model's "
                           f"has {target.vocab_size}")
    if bad := [i for i in cfg.layers if not 0 <= i <= target.n_layers]:
        raise DrafterError(EX_DATAERR, f"{folder} reads target layers {list(cfg.layers)}, but this model's are "
                           f"0..{target.n_layers} ({bad[0]} is not); set eagle_aux_hidden_state_layer_ids in its "
                           "config.json")
    return cfg, doc


def load_eagle3(folder: Path, target: ModelConfig, dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu") -> Eagle3Head:
    """The EAGLE-3 head in folder for a target of this config; DrafterError (EX_NOINPUT, EX_DATAERR) otherwise."""
    from met.model.hf_checkpoint import weight_files

    if not folder.exists():
        raise DrafterError(EX_NOINPUT, f"no EAGLE-3 head at {folder}; pass the folder of one (config.json and "
                           "model.safetensors)")
    if not folder.is_dir():
        raise DrafterError(EX_DATAERR, f"{folder} is not a folder; an EAGLE-3 head is a folder with config.json and "
                           "model.safetensors")
    cfg, _ = read_eagle3_config(folder, target)
    if not any(folder.glob("*.safetensors")):
        raise DrafterError(EX_NOINPUT, f"{folder} holds no *.safetensors weights (met does not read .bin or .pth "
                           "files: convert them to safetensors first)")
    try:
        state = _read(weight_files(folder), dtype, device)
    except RecipeError as exc:
        raise DrafterError(EX_DATAERR, f"{folder}: {exc}") from None
    if "embed_tokens.weight" not in state and cfg.dim != target.dim:
        raise DrafterError(EX_DATAERR, f"{folder} has no embed_tokens.weight, and the target's embedding is "
                           f"{target.dim} wide, not the head's {cfg.dim}")
    with torch.device("meta"):
        head = Eagle3Head(cfg, own_embedding="embed_tokens.weight" in state)
    expected = set(head.state_dict())
    if missing := sorted(expected - set(state)):
        raise DrafterError(EX_DATAERR, f"{folder}: not an EAGLE-3 head's tensors (missing {', '.join(missing[:4])})")
    if unexpected := sorted(set(state) - expected):
        raise DrafterError(EX_DATAERR, f"{folder}: tensors met does not know in an EAGLE-3 head: "
                           f"{', '.join(unexpected[:4])}")
    _check_maps(folder, cfg, state["d2t"], state["t2d"])
    try:
        head.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as exc:  # shapes that do not fit config.json
        raise DrafterError(EX_DATAERR, f"{folder}: {' '.join(str(exc).split())[:400]}") from None
    head.set_tables()
    return head.eval()


def _check_maps(folder: Path, cfg: Eagle3Config, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
    """d2t maps every draft id to a distinct target id, and t2d marks exactly those: else DrafterError."""
    if d2t.shape != (cfg.draft_vocab_size,) or d2t.is_floating_point() or t2d.shape != (cfg.vocab_size,):
        raise DrafterError(EX_DATAERR, f"{folder}: d2t {list(d2t.shape)} ({d2t.dtype}) and t2d {list(t2d.shape)} do "
                           f"not fit draft_vocab_size {cfg.draft_vocab_size} and vocab_size {cfg.vocab_size}")
    targets = torch.arange(cfg.draft_vocab_size, device=d2t.device) + d2t
    if int(targets.min()) < 0 or int(targets.max()) >= cfg.vocab_size or len(targets.unique()) != len(targets):
        raise DrafterError(EX_DATAERR, f"{folder}: d2t maps draft ids outside the vocabulary of {cfg.vocab_size} or "
                           "two onto one target id")
    mask = t2d.bool()
    if int(mask.sum()) != cfg.draft_vocab_size or not bool(mask[targets].all()):
        raise DrafterError(EX_DATAERR, f"{folder}: t2d does not mark exactly the target ids d2t maps to")


def _read(files: list[Path], dtype: torch.dtype, device: str | torch.device) -> dict[str, torch.Tensor]:
    """Every tensor of the files: floating ones in dtype, d2t and t2d as they are (integers, booleans)."""
    state = {}
    for path in files:
        try:
            bounded_read.check_regular(path)
            with safe_open(str(path), framework="pt", device=str(device)) as f:
                for key in f.keys():
                    t = f.get_tensor(key)
                    state[key] = t.to(dtype) if t.is_floating_point() else t
        except (bounded_read.FileRefused, OSError, SafetensorError) as exc:
            raise DrafterError(EX_DATAERR, f"cannot read {path}: {exc}") from None
    return state
