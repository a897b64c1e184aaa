"""A checkpoint folder's config.json as a ModelConfig: the Llama and Qwen2 families, anything else refused by name."""

import json
import re
from dataclasses import dataclass
from pathlib import Path

from met.model.config import ModelConfig
from met.model.recipes import RecipeError

SUPPORTED = ("LlamaForCausalLM", "Qwen2ForCausalLM")


class CheckpointError(RecipeError):
    """A checkpoint folder that is there but cannot be served: unsupported architecture or options, bad files."""


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
    try:
        dim, heads = int(doc["hidden_size"]), int(doc["num_attention_heads"])
        head_dim = int(doc.get("head_dim") or dim // heads)
        llama_bias = arch == "LlamaForCausalLM" and bool(doc.get("attention_bias", False))
        config = ModelConfig(
            vocab_size=int(doc["vocab_size"]), dim=dim, n_layers=int(doc["num_hidden_layers"]), n_heads=heads,
            n_kv_heads=int(doc.get("num_key_value_heads") or heads), ffn_dim=int(doc["intermediate_size"]),
            max_seq_len=int(doc.get("max_position_embeddings", 2048)), rope_theta=_rope_theta(doc),
            norm_eps=float(doc.get("rms_norm_eps", 1e-6)), mtp_depth=0,
            head_size=head_dim if head_dim != dim // heads or dim % heads else 0,
            attention_bias=arch == "Qwen2ForCausalLM" or llama_bias, output_bias=llama_bias,
            tie_word_embeddings=bool(doc.get("tie_word_embeddings", False)),
        )
    except KeyError as exc:
        raise CheckpointError(f"{folder / 'config.json'} has no {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{folder / 'config.json'}: {exc}") from None
    gen = folder / "generation_config.json"
    eos = _ids(_json(gen).get("eos_token_id")) if gen.exists() else ()
    return HfConfig(arch, config, eos or _ids(doc.get("eos_token_id")), _hub_id(doc.get("_name_or_path")))


def _json(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RecipeError(f"{path.parent} has no {path.name}; a checkpoint folder holds config.json, "
                          "*.safetensors and tokenizer.json") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from None
    if not isinstance(doc, dict):
        raise CheckpointError(f"{path} is not a JSON object")
    return doc


def _refuse_options(doc: dict, arch: str) -> None:
    """Options the engine does not compute: refused, never silently ignored."""
    rope = doc.get("rope_parameters") or doc.get("rope_scaling") or {}
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


def _rope_theta(doc: dict) -> float:
    rope = doc.get("rope_parameters")
    if isinstance(rope, dict) and "rope_theta" in rope:
        return float(rope["rope_theta"])
    return float(doc.get("rope_theta", 10000.0))


def _ids(value: object) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, list):
        return tuple(v for v in value if isinstance(v, int) and not isinstance(v, bool))
    return ()


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


def _hub_id(value: object) -> str | None:
    return value if isinstance(value, str) and _HUB_ID.fullmatch(value) and ".." not in value else None
