"""A local Hugging Face checkpoint folder's weights: its safetensors files, their digest, and loading them."""

import hashlib
import json
import re
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

import met.bounded_read as bounded_read
from met.model.config import ModelConfig
from met.model.errors import CheckpointError, RecipeError
from met.model.hf_config import read_hf_config
from met.model.kv_cache import PAD_ROOM
from met.model.transformer import Transformer, rope_table

INDEX = "model.safetensors.index.json"
_IGNORED = re.compile(r".*rotary_emb\.inv_freq$")  # a buffer older checkpoints saved; met recomputes it
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_LATER_RECIPE_DEFAULTS = {"qk_norm": False}  # ModelConfig fields added after folder recipes were first digested


def weight_files(folder: Path) -> list[Path]:
    """The folder's safetensors files, sorted: the shards its index names, else every *.safetensors."""
    index = folder / INDEX
    if index.exists():
        try:
            names = sorted(set(bounded_read.read_json(index, bounded_read.CONFIG_LIMIT)["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError, TypeError) as exc:
            raise CheckpointError(f"cannot read {index}: {exc!r}") from None
        files = [folder / n for n in names]
        if missing := [f.name for f in files if not f.exists()]:
            raise RecipeError(f"{index} names shards that are not in the folder: {', '.join(missing[:5])}")
        return _regular(files)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise RecipeError(f"{folder} holds no *.safetensors weights (met does not read .bin or .pth checkpoints)")
    return _regular(files)


def _regular(files: list[Path]) -> list[Path]:
    """The weight files, each a regular file (a FIFO or a device would hang or never end the digest): CheckpointError."""
    for path in files:
        try:
            bounded_read.check_regular(path)
        except bounded_read.FileRefused as exc:
            raise CheckpointError(str(exc)) from None
        except OSError as exc:
            raise CheckpointError(f"cannot read {path}: {exc.strerror or exc}") from None
    return files


def files_digest(files: list[Path]) -> str:
    """sha256 (16 hex) over each file's name, size and bytes, in order, streamed: what tables key the weights by."""
    h = hashlib.sha256()
    for path in files:
        h.update(f"{path.name}\0{path.stat().st_size}\0".encode())
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]


def recipe_digest(weights_digest: str, config: ModelConfig) -> str:
    """sha256 (16 hex) over the weights' digest and the config met runs them under: what the recipe id names.

    The config is met's reading of config.json (shape, RoPE, norms, tie), so editing a field that
    changes what the weights compute (rope_theta, say) changes the recipe, and a calibration fitted
    on the model before is refused; a field met does not read (transformers_version) changes nothing.
    A field added after folders were first named is left out at its default, so their recipes stand.
    """
    text = json.dumps(config.fields(without=_LATER_RECIPE_DEFAULTS), sort_keys=True)
    return hashlib.sha256(f"{weights_digest}\0{text}".encode()).hexdigest()[:16]


def model_name(folder: Path, hub_id: str | None = None) -> str:
    """What tables and lookup scopes call the folder's model: the hub model's name, else the folder's, file-safe."""
    name = hub_id.rsplit("/", 1)[1] if hub_id else folder.resolve().name
    if not _NAME.fullmatch(name):
        name = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-._")[:100] or "checkpoint"
    return name


def checkpoint_name(folder: Path) -> str:
    """The recipe name of a folder from its config.json alone (no weights read): e.g. for a table's file name."""
    return model_name(folder, read_hf_config(folder.resolve()).hub_id)


def load_hf(folder: Path, cfg: ModelConfig, architecture: str, dtype: torch.dtype = torch.float32,
            device: str = "cpu") -> Transformer:
    """The model with the folder's weights in dtype on device (built on the meta device: no float32 detour).

    cfg is met's reading of the folder's config.json; architecture (its name) is quoted when the tensors do not fit.
    """
    with torch.device("meta"):
        model = Transformer(cfg)
    expected = set(model.state_dict())
    state = _read_tensors(weight_files(folder), dtype, device)
    if cfg.tie_word_embeddings:
        _tie(state, folder)
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        parts = ([f"missing {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}"] if missing else []) + \
                ([f"unexpected {', '.join(unexpected[:4])}"] if unexpected else [])
        raise CheckpointError(f"{folder}: the tensors do not match a {architecture} "
                              f"of this config.json ({'; '.join(parts)})")
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as exc:
        raise CheckpointError(f"{folder}: {' '.join(str(exc).split())[:400]}") from None
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    cos, sin = rope_table(cfg, cfg.max_seq_len + PAD_ROOM)  # buffers are not in the files: compute them here
    model.rope_cos, model.rope_sin = cos.to(device), sin.to(device)
    return model.eval()


def _tie(state: dict[str, torch.Tensor], folder: Path) -> None:
    """Tied weights: the head is the embedding matrix; a file holding the two different is refused.

    transformers 4 tied such a file (the head became the embedding) and transformers 5 does not
    (each keeps its own): there is no one answer to match, so neither is guessed.
    """
    embed, head = state.get("model.embed_tokens.weight"), state.get("lm_head.weight")
    if embed is not None and head is not None and not torch.equal(embed, head):
        raise CheckpointError(f"{folder}: config.json says tie_word_embeddings true, but the files hold an "
                              "lm_head.weight that differs from model.embed_tokens.weight; set tie_word_embeddings "
                              "to false to use both, or remove lm_head.weight to use the embedding as the head")
    if embed is None and head is not None:
        state["model.embed_tokens.weight"] = embed = head  # only the head was saved: it is the embedding too
    if embed is not None:
        state["lm_head.weight"] = embed


def _read_tensors(files: list[Path], dtype: torch.dtype, device: str) -> dict[str, torch.Tensor]:
    state, where = {}, {}
    for path in files:
        try:
            with safe_open(str(path), framework="pt", device=str(device)) as f:
                for key in f.keys():
                    if key in where:  # which copy would win is the files' order, not the checkpoint's intent
                        raise CheckpointError(f"{path.parent}: {key} is in both {where[key].name} and {path.name}; "
                                              "a checkpoint holds each tensor once (move the other file away)")
                    if not _IGNORED.fullmatch(key):
                        state[key], where[key] = f.get_tensor(key).to(dtype), path
        except (OSError, ValueError, SafetensorError) as exc:
            raise CheckpointError(f"cannot read {path}: {exc}") from None
    return state
