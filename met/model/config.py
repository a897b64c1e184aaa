"""Model configuration: a Llama-architecture transformer with an MTP drafter, plus named presets."""

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Shape of a byte-level Llama-style decoder and its DeepSeek-V3-style MTP module."""

    vocab_size: int = 258  # 256 bytes + BOS + EOS
    dim: int = 192
    n_layers: int = 6
    n_heads: int = 6
    n_kv_heads: int = 6  # < n_heads means grouped-query attention
    ffn_dim: int = 512  # SwiGLU hidden width
    max_seq_len: int = 1024  # longest sequence the KV cache and RoPE table serve
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    mtp_depth: int = 4  # recursive MTP drafts the module is trained and used for
    # Checkpoint-folder models (Llama, Mistral, Qwen2, Qwen3); the defaults are the embedded recipe's layout, and
    # a field at its default is left out of `identity()`, so plan digests of old configs do not move.
    head_size: int = 0  # width of one attention head; 0: dim // n_heads (HF's head_dim may differ)
    attention_bias: bool = False  # q, k and v projections carry biases (Qwen2; Llama's attention_bias)
    output_bias: bool = False  # o_proj carries a bias (Llama's attention_bias)
    tie_word_embeddings: bool = False  # lm_head is embed_tokens' matrix (Qwen2 small sizes)
    qk_norm: bool = False  # each head's q and k RMS-normed (own weights, norm_eps) before RoPE (Qwen3)

    def __post_init__(self) -> None:
        for name in ("n_heads", "n_kv_heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not (0 < self.rope_theta < math.inf and 0 < self.norm_eps < math.inf):
            raise ValueError(f"rope_theta and norm_eps must be finite and above 0, got {self.rope_theta}, "
                             f"{self.norm_eps}")
        if not self.head_size and self.dim % self.n_heads:
            raise ValueError(f"dim {self.dim} is not a multiple of n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        if self.head_size < 0:
            raise ValueError(f"head_size must be >= 0 (0: dim // n_heads), got {self.head_size}")
        if self.head_dim % 2:
            raise ValueError("head_dim must be even for rotary embeddings")
        for name in ("vocab_size", "dim", "n_layers", "ffn_dim", "max_seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not 0 <= self.mtp_depth <= 16:
            raise ValueError(f"mtp_depth must be in 0..=16, got {self.mtp_depth}")

    @property
    def head_dim(self) -> int:
        return self.head_size or self.dim // self.n_heads

    def identity(self) -> dict:
        """The fields that say what this model computes: all of them, less the later ones left at their default."""
        return self.fields(without=_LATER_DEFAULTS)

    def fields(self, without: Mapping[str, object] = MappingProxyType({})) -> dict:
        """Every field by name, less each field of `without` that holds the value given there."""
        return {name: value for name, value in asdict(self).items() if name not in without or without[name] != value}

    @classmethod
    def from_name(cls, name: str) -> "ModelConfig":
        """The named preset; a KeyError lists the known names."""
        try:
            return PRESETS[name]
        except KeyError:
            raise KeyError(f"unknown model preset {name!r}; known: {', '.join(sorted(PRESETS))}") from None

    def with_(self, **changes) -> "ModelConfig":
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)


PRESETS: dict[str, ModelConfig] = {
    "met-tiny-py": ModelConfig(),
    # For tests: trains in seconds, same code paths (GQA on purpose).
    "micro": ModelConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=128, mtp_depth=4),
}

# Fields added after tables were first measured, with their defaults (see ModelConfig.identity).
_LATER_DEFAULTS = {"head_size": 0, "attention_bias": False, "output_bias": False, "tie_word_embeddings": False,
                   "qk_norm": False}
