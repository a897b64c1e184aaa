"""A checkpoint folder's config.json as a ModelConfig: the Llama and Qwen2 families, anything else refused by name."""

import math
import re
from dataclasses import dataclass
from pathlib import Path

import met.bounded_read as bounded_read
from met.model.config import ModelConfig
from met.model.errors import CheckpointError, RecipeError

SUPPORTED = ("LlamaForCausalLM", "Qwen2ForCausalLM")


@dataclass(frozen=True, slots=True)
class HfConfig:
    """What met takes from config.json (and generation_config.json)."""

    architecture: str  # one of SUPPORTED
    config: ModelConfig
    eos_ids: tuple[int, ...]  # generation ends at any of these (generation_config.json's, else config.json's)
    hub_id: str | None  # `_name_or_path` when it names a hub model (org/name), else None


def read_hf_config(folder: Path) -> HfConfig:
    """The folder's config; CheckpointError naming what is not supported, with its value."""
    doc = _json(folder / "config.json")
    archs = doc.get("architectures") or []
    arch = archs[0] if len(archs) == 1 else None
    if arch not in SUPPORTED:
        shown = ", ".join(map(str, archs)) if archs else f"model_type {doc.get('model_type')!r}"
        raise CheckpointError(f"architecture {shown} is not supported (met loads {', '.join(SUPPORTED)})")
    _refuse_options(doc, arch)
    path = folder / "config.json"
    dim, heads = _count(doc, path, "hidden_size"), _count(doc, path, "num_attention_heads")
    if dim < heads and doc.get("head_dim") is None:
        raise CheckpointError(f"{path}: hidden_size {dim} is smaller than num_attention_heads {heads} "
                              "(and no head_dim is given)")
    head_dim = _count(doc, path, "head_dim", dim // heads)
    llama_bias = arch == "LlamaForCausalLM" and bool(doc.get("attention_bias", False))
    try:
        config = ModelConfig(
            vocab_size=_count(doc, path, "vocab_size"), dim=dim, n_layers=_count(doc, path, "num_hidden_layers"),
            n_heads=heads, n_kv_heads=_count(doc, path, "num_key_value_heads", heads),
            ffn_dim=_count(doc, path, "intermediate_size"),
            max_seq_len=_count(doc, path, "max_position_embeddings", 2048), rope_theta=_rope_theta(doc, path),
            norm_eps=_positive(doc, path, "rms_norm_eps", 1e-6), mtp_depth=0,
            head_size=head_dim if head_dim != dim // heads or dim % heads else 0,
            attention_bias=arch == "Qwen2ForCausalLM" or llama_bias, output_bias=llama_bias,
            tie_word_embeddings=bool(doc.get("tie_word_embeddings", False)),
        )
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    gen, eos, eos_path = folder / "generation_config.json", (), path
    if gen.exists():  # generation_config.json's ids win; config.json's stand when it names none
        eos, eos_path = _ids(_json(gen).get("eos_token_id"), gen), gen
    if not eos:
        eos, eos_path = _ids(doc.get("eos_token_id"), path), path
    if bad := [i for i in eos if not 0 <= i < config.vocab_size]:
        raise CheckpointError(f"{eos_path}: eos_token_id {bad[0]} is outside the vocabulary "
                              f"(0..{config.vocab_size - 1} by config.json's vocab_size); fix the id or the vocab_size")
    return HfConfig(arch, config, eos, _hub_id(doc.get("_name_or_path")))


def _count(doc: dict, path: Path, key: str, default: int | None = None) -> int:
    """doc[key] as a positive integer (default when absent or null); CheckpointError naming the field otherwise."""
    value = doc.get(key)
    if value is None:
        if default is None:
            raise CheckpointError(f"{path} has no {key!r}")
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CheckpointError(f"{path}: {key} must be a positive integer, got {value!r}")
    return value


def _positive(doc: dict, path: Path, key: str, default: float, where: str = "") -> float:
    """doc[key] as a finite number above 0 (default when absent or null); CheckpointError naming the field otherwise."""
    value = doc.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise CheckpointError(f"{path}: {where}{key} must be a finite number above 0, got {value!r}")
    return float(value)


def _json(path: Path) -> dict:
    try:
        doc = bounded_read.read_json(path, bounded_read.CONFIG_LIMIT)  # a FIFO or /dev/zero is refused unread
    except FileNotFoundError:
        raise RecipeError(f"{path.parent} has no {path.name}; a checkpoint folder holds config.json, "
                          "*.safetensors and tokenizer.json") from None
    except bounded_read.FileRefused as exc:
        raise CheckpointError(str(exc)) from None
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from None
    if not isinstance(doc, dict):
        raise CheckpointError(f"{path} is not a JSON object")
    return doc


def _refuse_options(doc: dict, arch: str) -> None:
    """Options the engine does not compute: refused, never silently ignored."""
    _, rope = _rope(doc)
    kind = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else rope
    if kind not in ("default", None):
        raise CheckpointError(f"rope scaling type {kind!r} is not supported (met computes the default RoPE only)")
    if doc.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"hidden_act {doc['hidden_act']!r} is not supported (met computes SwiGLU with silu)")
    if doc.get("mlp_bias"):
        raise CheckpointError("mlp_bias true is not supported (met's MLP projections have no bias)")
    if arch == "Qwen2ForCausalLM" and doc.get("use_sliding_window"):
        raise CheckpointError("use_sliding_window true is not supported (met attends over the whole context)")
    if float(doc.get("partial_rotary_factor", 1.0)) != 1.0:
        raise CheckpointError(f"partial_rotary_factor {doc['partial_rotary_factor']} is not supported")


def _rope(doc: dict) -> tuple[str, object]:
    """(key, value) of the RoPE settings transformers reads: the legacy rope_scaling wins over rope_parameters."""
    for key in ("rope_scaling", "rope_parameters"):
        if doc.get(key):
            return key, doc[key]
    return "rope_parameters", {}


def _rope_theta(doc: dict, path: Path) -> float:
    key, rope = _rope(doc)
    if isinstance(rope, dict) and "rope_theta" in rope:
        return _positive(rope, path, "rope_theta", 10000.0, where=f"{key}.")
    return _positive(doc, path, "rope_theta", 10000.0)


def _ids(value: object, path: Path) -> tuple[int, ...]:
    """eos_token_id as a tuple of ids (a null is none); CheckpointError for anything but an id or a list of them."""
    if value is None:
        return ()
    ids = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in ids):
        raise CheckpointError(f"{path}: eos_token_id must be a token id or a list of them, got {value!r}")
    return tuple(ids)


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


def _hub_id(value: object) -> str | None:
    return value if isinstance(value, str) and _HUB_ID.fullmatch(value) and ".." not in value else None
