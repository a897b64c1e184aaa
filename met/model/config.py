"""Model configuration: a Llama-architecture transformer with an MTP drafter, plus named presets."""

from dataclasses import dataclass, replace


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

    def __post_init__(self) -> None:
        if self.dim % self.n_heads:
            raise ValueError(f"dim {self.dim} is not a multiple of n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        if (self.dim // self.n_heads) % 2:
            raise ValueError("head_dim must be even for rotary embeddings")
        for name in ("vocab_size", "dim", "n_layers", "ffn_dim", "max_seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not 0 <= self.mtp_depth <= 16:
            raise ValueError(f"mtp_depth must be in 0..=16, got {self.mtp_depth}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

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
