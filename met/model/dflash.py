"""The DFlash-style block drafter: from the target's last hidden state and last token, a block of drafts in one pass.

The block is [context, token, MASK x block]: the context row is a projection of the target's
hidden state at the position that predicted `token` (so it has read the whole prefix), the token
row is the target's embedding of `token`, and each MASK row is one learned embedding plus its
position. A couple of transformer layers attend bidirectionally over the whole block, then the
target's own head (frozen, shared) turns MASK row j into the logits of the j-th token after
`token`. Every block position is computed whatever gamma a step verifies, so a draft costs one
forward of block + 2 rows however many of its drafts are used.
"""

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn

import met.bounded_read as bounded_read
from met.exit_codes import EX_DATAERR, EX_NOINPUT
from met.model.config import ModelConfig
from met.model.transformer import RMSNorm, Transformer
from met.model.weights import file_digest


@dataclass(frozen=True, slots=True)
class DflashConfig:
    """Shape of a block drafter; dim and vocab_size are its target's (it shares the embeddings and head)."""

    dim: int
    vocab_size: int
    block: int = 16  # drafts per pass (gamma at most this); the DFlash rung's MAX_GAMMA
    n_layers: int = 2
    n_heads: int = 4
    ffn_dim: int = 512  # SwiGLU hidden width
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        if not 1 <= self.block <= 16:
            raise ValueError(f"block must be in 1..=16, got {self.block}")
        if self.dim % self.n_heads:
            raise ValueError(f"dim {self.dim} is not a multiple of n_heads {self.n_heads}")
        for name in ("dim", "vocab_size", "n_layers", "ffn_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    @classmethod
    def for_target(cls, target: ModelConfig, **changes) -> "DflashConfig":
        """A drafter for a target: its width and vocabulary, the norm epsilon it uses."""
        return cls(**({"dim": target.dim, "vocab_size": target.vocab_size, "norm_eps": target.norm_eps} | changes))


class _Layer(nn.Module):
    """Pre-norm attention with no mask (every block row sees every other), then a SwiGLU MLP."""

    def __init__(self, cfg: DflashConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim, bias=False)
        self.out = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.mlp_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.w13 = nn.Linear(cfg.dim, 2 * cfg.ffn_dim, bias=False)
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(B, T, 3, self.n_heads, D // self.n_heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))  # bidirectional
        x = x + self.out(a.transpose(1, 2).reshape(B, T, D))
        gate, up = self.w13(self.mlp_norm(x)).chunk(2, -1)
        return x + self.w2(F.silu(gate) * up)


class DflashDrafter(nn.Module):
    """Block drafter: (target hidden [B, dim], last token [B]) -> logits of the next `block` tokens [B, block, V]."""

    def __init__(self, cfg: DflashConfig):
        super().__init__()
        self.cfg = cfg
        self.hnorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.h_proj = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.mask = nn.Parameter(torch.zeros(cfg.dim))  # the embedding every position to fill starts from
        self.pos = nn.Parameter(torch.randn(cfg.block + 2, cfg.dim) * 0.02)  # rows: context, token, MASK 1..block
        self.layers = nn.ModuleList(_Layer(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)

    @property
    def block(self) -> int:
        """Drafts one pass proposes."""
        return self.cfg.block

    def forward(self, target: Transformer, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Draft logits [B, block, V]: row j is the (j+1)-th token after `tokens`, given the target's `hidden`.

        hidden: [B, dim] the target's last-layer hidden state (before its final norm) at the position
        that predicted tokens ([B]); the target's embeddings and head are used, never trained here.
        """
        B = tokens.shape[0]
        ctx = self.h_proj(self.hnorm(hidden))[:, None]  # [B, 1, dim]
        tok = target.model.embed_tokens(tokens)[:, None]  # [B, 1, dim]
        masks = self.mask.expand(B, self.cfg.block, -1)  # [B, block, dim]
        x = torch.cat([ctx, tok, masks], 1) + self.pos  # [B, block + 2, dim]
        for layer in self.layers:
            x = layer(x)
        return target.lm_head(self.norm(x[:, 2:]))


def save_drafter(drafter: DflashDrafter, path: Path, target_id: str) -> str:
    """Write the drafter's float32 weights with its config and target in the metadata, atomically; its digest."""
    state = {k: v.detach().to(torch.float32).contiguous() for k, v in drafter.state_dict().items()}
    tmp = path.with_name(path.name + ".tmp")
    save_file(state, str(tmp), metadata={"format": "pt", "dflash_config": json.dumps(asdict(drafter.cfg)),
                                         "target": target_id})
    tmp.replace(path)
    return file_digest(path)


class DrafterError(Exception):
    """A DFlash drafter that cannot be used; `status` is the exit status every command reports it with."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status  # EX_NOINPUT: there is none; EX_DATAERR: unreadable, not a drafter, another model's


def load_drafter(path: Path, target_id: str, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu") -> DflashDrafter:
    """The drafter at path for the target target_id (name@digest); DrafterError saying what is wrong otherwise.

    Status EX_NOINPUT when there is none (the message says how to train one), EX_DATAERR when the file
    cannot be read as safetensors, is not a drafter, or was trained against another target.
    """
    train = f"met model train --drafter dflash --target {target_id.split('@')[0]}"
    if not path.exists():
        raise DrafterError(EX_NOINPUT, f"no DFlash drafter at {path}; train one with: {train}")
    try:
        bounded_read.check_regular(path)  # a FIFO or a device: refused, never mapped
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            state = {k: f.get_tensor(k) for k in f.keys()}
    except bounded_read.FileRefused as exc:
        raise DrafterError(EX_DATAERR, str(exc)) from None
    except (SafetensorError, OSError) as exc:
        raise DrafterError(EX_DATAERR, f"{path} cannot be read as a safetensors file ({exc})") from None
    if "dflash_config" not in meta:
        raise DrafterError(EX_DATAERR, f"{path} is not a DFlash drafter (no dflash_config in its metadata)")
    if meta.get("target") != target_id:
        raise DrafterError(EX_DATAERR, f"{path} was trained against {meta.get('target')}, not {target_id}; "
                           f"train one for this model with: {train}")
    try:
        drafter = DflashDrafter(DflashConfig(**json.loads(meta["dflash_config"])))
        drafter.load_state_dict(state, strict=True)
    except (ValueError, TypeError, RuntimeError) as exc:  # a bad config, or weights that do not fit it
        raise DrafterError(EX_DATAERR, f"{path} holds a damaged DFlash drafter: {exc}") from None
    return drafter.to(device=device, dtype=dtype).eval()


def shipped_path(recipe) -> Path:
    """Where a recipe's DFlash drafter ships: beside its weights (a checkpoint folder: inside it)."""
    folder = recipe.weights if recipe.source == "hf" else recipe.weights.parent
    return folder / f"{recipe.name}.dflash.safetensors"
