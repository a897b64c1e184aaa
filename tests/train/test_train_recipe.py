"""Training end to end: a few steps of the micro preset through `met model train`."""

import json

import torch
from typer.testing import CliRunner

from met.cli import app
from met.model.config import ModelConfig
from met.model.weights import file_digest, load_model
from met.train.recipe import TrainParams, lr_at


def test_tiny_training_run_writes_weights_and_card(tmp_path):
    # 12 steps of the micro preset: weights load back, digest and card agree, loss is finite
    result = CliRunner().invoke(app, ["model", "train", "--preset", "micro", "--steps", "12", "--batch", "4",
                                      "--seq-len", "32", "--eval-every", "6", "--out-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    card = json.loads((tmp_path / "micro.card.json").read_text())
    weights = tmp_path / "micro.safetensors"
    assert card["digest"] == file_digest(weights)
    assert card["training"]["steps"] == 12 and card["parameters"] > 0
    assert 0 < card["heldout"]["bits_per_byte"] < 12
    model = load_model(ModelConfig(**card["config"]), weights)
    assert torch.isfinite(model(torch.tensor([[1, 2, 3]]))).all()
    # resuming a finished run does no more steps and writes the same weights
    again = CliRunner().invoke(app, ["model", "train", "--preset", "micro", "--steps", "12", "--batch", "4",
                                     "--seq-len", "32", "--eval-every", "6", "--out-dir", str(tmp_path)])
    assert again.exit_code == 0 and file_digest(weights) == card["digest"]


def test_learning_rate_warms_up_then_decays():
    # linear warm-up to the peak, cosine down to min_lr_ratio of it
    p = TrainParams(steps=1000, warmup=100, lr=1e-3, min_lr_ratio=0.1)
    assert lr_at(0, p) == 1e-3 / 100
    assert abs(lr_at(99, p) - 1e-3) < 1e-12
    assert abs(lr_at(1000, p) - 1e-4) < 1e-12
    assert lr_at(300, p) > lr_at(600, p)
