"""A checkpoint folder's config.json as a ModelConfig: the Llama, Mistral, Qwen2 and Qwen3 (dense) families.

Anything else is refused by name, and so is an option the engine does not compute: a sliding window
is accepted only where it cannot apply, being no smaller than the context met serves.
"""

import math
import re
from dataclasses import dataclass
from pathlib import Path

import met.bounded_read as bounded_read
from met.model.config import ModelConfig
from met.model.errors import CheckpointError, RecipeError

SUPPORTED = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
_FULL, _SLIDING = "full_attention", "sliding_attention"  # the layer_types Qwen2 and Qwen3 configs name


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
    _refuse_options(doc)
    path = folder / "config.json"
    dim, heads = _count(doc, path, "hidden_size"), _count(doc, path, "num_attention_heads")
    if dim < heads and doc.get("head_dim") is None and arch != "Qwen3ForCausalLM":
        raise CheckpointError(f"{path}: hidden_size {dim} is smaller than num_attention_heads {heads} "
                              "(and no head_dim is given)")
    head_dim = _count(doc, path, "head_dim", 128 if arch == "Qwen3ForCausalLM" else dim // heads)  # Qwen3Config's
    # attention_bias: q, k, v and o biases (Mistral has none whatever the field says; Qwen2 q, k and v always)
    llama_bias = arch in ("LlamaForCausalLM", "Qwen3ForCausalLM") and bool(doc.get("attention_bias", False))
    try:
        config = ModelConfig(
            vocab_size=_count(doc, path, "vocab_size"), dim=dim, n_layers=_count(doc, path, "num_hidden_layers"),
            n_heads=heads, n_kv_heads=_count(doc, path, "num_key_value_heads", heads),
            ffn_dim=_count(doc, path, "intermediate_size"),
            max_seq_len=_count(doc, path, "max_position_embeddings", 2048), rope_theta=_rope_theta(doc, path),
            norm_eps=_positive(doc, path, "rms_norm_eps", 1e-6), mtp_depth=0,
            head_size=head_dim if head_dim != dim // heads or dim % heads else 0,
            attention_bias=arch == "Qwen2ForCausalLM" or llama_bias, output_bias=llama_bias,
            tie_word_embeddings=bool(doc.get("tie_word_embeddings", False)), qk_norm=arch == "Qwen3ForCausalLM",
        )
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    _refuse_window(doc, arch, path, config)
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


def _refuse_options(doc: dict) -> None:
    """Options the engine does not compute: refused, never silently ignored."""
    _, rope = _rope(doc)
    kind = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else rope
    if kind not in ("default", None):
        raise CheckpointError(f"rope scaling type {kind!r} is not supported (met computes the default RoPE only)")
    if doc.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"hidden_act {doc['hidden_act']!r} is not supported (met computes SwiGLU with silu)")
    if doc.get("mlp_bias"):
        raise CheckpointError("mlp_bias true is not supported (met's MLP projections have no bias)")
    if float(doc.get("partial_rotary_factor", 1.0)) != 1.0:
        raise CheckpointError(f"partial_rotary_factor {doc['partial_rotary_factor']} is not supported")


def _refuse_window(doc: dict, arch: str, path: Path, config: ModelConfig) -> None:
    """A sliding window that would apply within the context met serves: refused, naming the field.

    A query attends to the sliding_window keys up to itself, so a window no smaller than the context
    (max_position_embeddings) masks nothing, and the model computes what full attention computes.
    """
    if arch == "MistralForCausalLM":  # every layer slides, by 4096 keys where config.json names no window
        if doc.get("sliding_window", 4096) is None:
            return
        where = "" if "sliding_window" in doc else " (MistralConfig's default)"
    elif arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        if (where := _qwen_sliding(doc, path, config.n_layers)) is None:
            return
    else:
        return
    window = _count(doc, path, "sliding_window", 4096)
    if window < config.max_seq_len:
        raise CheckpointError(
            f"{path}: sliding_window {window}{where} is smaller than the context met serves (max_position_embeddings "
            f"{config.max_seq_len}); met attends over the whole context, so past {window} tokens it would compute "
            f"another model; set max_position_embeddings to {window} or less to serve a context within the window")


def _qwen_sliding(doc: dict, path: Path, n_layers: int) -> str | None:
    """Which layers slide, as Qwen2Config and Qwen3Config set them, in words; None: no layer slides.

    The window applies only under use_sliding_window true, to the layers layer_types names
    sliding_attention, or where layer_types is absent to every layer from max_window_layers on.
    """
    on = bool(doc.get("use_sliding_window", False)) and doc.get("sliding_window", 4096) is not None
    kinds = doc.get("layer_types")
    if kinds is None:
        first = doc.get("max_window_layers", 28)
        if not on:
            return None
        if isinstance(first, bool) or not isinstance(first, int) or first < 0:
            raise CheckpointError(f"{path}: max_window_layers must be a whole number >= 0, got {first!r}")
        return f" (use_sliding_window true: layers {first}.. by max_window_layers)" if first < n_layers else None
    if not isinstance(kinds, list) or len(kinds) != n_layers:
        raise CheckpointError(f"{path}: layer_types must list one kind per layer ({n_layers}), got {kinds!r}")
    if bad := sorted({str(k) for k in kinds} - {_FULL, _SLIDING}):
        raise CheckpointError(f"{path}: layer_types {bad[0]!r} is not supported (met computes {_FULL}, and "
                              f"{_SLIDING} where its window cannot apply)")
    if not (layers := [i for i, k in enumerate(kinds) if k == _SLIDING]):
        return None
    if not on:  # transformers cannot build these layers' mask either
        raise CheckpointError(f"{path}: layer_types names {_SLIDING} layers, but with use_sliding_window not true "
                              "(or sliding_window null) no window is set; fix layer_types or the window")
    shown = ", ".join(map(str, layers[:4])) + (" ..." if len(layers) > 4 else "")
    return f" (use_sliding_window true: layers {shown} by layer_types)"


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
