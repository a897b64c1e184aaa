"""Weights on disk: safetensors files, their digests, and the model card beside them."""

import hashlib
import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

import met.bounded_read as bounded_read
from met.model.config import ModelConfig
from met.model.transformer import Transformer


def file_digest(path: Path) -> str:
    """sha256 of a file's bytes, hex, first 16 characters (what recipes and tables key on)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def save_weights(model: Transformer, path: Path) -> str:
    """Write the model's float32 weights atomically; returns the file's digest."""
    state = {k: v.detach().to(torch.float32).contiguous() for k, v in model.state_dict().items()}
    tmp = path.with_name(path.name + ".tmp")
    save_file(state, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, path)
    return file_digest(path)


def load_model(cfg: ModelConfig, path: Path, dtype: torch.dtype = torch.float32) -> Transformer:
    """A model of cfg with weights from a safetensors file (strict: every tensor must match)."""
    model = Transformer(cfg)
    model.load_state_dict(load_file(str(path)), strict=True)
    return model.to(dtype).eval()


def write_card(card: dict, path: Path) -> None:
    """Write a model card (JSON) atomically."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(card, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def read_card(path: Path) -> dict:
    """Read a model card: a JSON object; ValueError naming the file when it is not one (OSError when unreadable)."""
    card = bounded_read.read_json(path, bounded_read.CONFIG_LIMIT)  # FileRefused (a ValueError) naming the file
    if not isinstance(card, dict):
        raise ValueError(f"{path} is not a JSON object (it holds a {type(card).__name__})")
    return card
