"""`met model train --drafter draft`: distils a draft model that loads as an embedded recipe, and its refusals."""

import json
import shutil
from dataclasses import asdict

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import met.model.recipes as recipes
import met.train.draft_model_cli as draft_model_cli
from met.cli import app
from met.model.config import ModelConfig
from met.model.corpus import Split
from met.model.transformer import Transformer
from met.model.weights import save_weights, write_card

TRAIN = ["model", "train", "--drafter", "draft", "--target", "micro4", "--batch", "2", "--seq-len", "32"]


def install(weights_dir, seed: int = 0) -> str:
    """A 4-layer micro model of random weights as the embedded recipe 'micro4'; its recipe id."""
    torch.manual_seed(seed)
    model = Transformer(ModelConfig.from_name("micro").with_(n_layers=4))
    digest = save_weights(model, weights_dir / "micro4.safetensors")
    write_card({"config": asdict(model.cfg), "digest": digest}, weights_dir / "micro4.card.json")
    return f"micro4@{digest}"


@pytest.fixture
def weights_dir(tmp_path, monkeypatch):
    """An embedded 'micro4' in a temporary weights folder, and a small corpus (no stdlib read)."""
    folder = tmp_path / "weights"
    folder.mkdir()
    install(folder)
    monkeypatch.setattr(recipes, "WEIGHTS_DIR", folder)
    split = Split(np.random.default_rng(0).integers(97, 110, 3000).astype(np.uint16), ("x",))
    monkeypatch.setattr(draft_model_cli, "load_split", lambda heldout: split)
    return folder


def _run(*args: str):
    return CliRunner().invoke(app, list(args))


def test_the_draft_and_its_card_load_as_an_embedded_recipe(weights_dir, tmp_path):
    # 4 steps, evaluated at 2 and 4: both files copied into the weights folder make the recipe micro4-draft
    out = tmp_path / "run"
    result = _run(*TRAIN, "--steps", "4", "--eval-every", "2", "--out-dir", str(out))
    assert result.exit_code == 0, result.output
    assert "step 2/4" in result.output and "held-out KL" in result.output  # no terminal: a line per evaluation
    card = json.loads((out / "micro4-draft.card.json").read_text())
    target = recipes.embedded("micro4")
    assert card["distilled_from"] == target.id and "drafter" not in card
    assert card["training"]["steps"] == 4 and card["training"]["threads"] >= 1
    assert set(card["heldout"]) >= {"kl_bits_per_byte", "top1_agreement"}
    assert len((out / "train.log").read_text().splitlines()) == 2 and (out / "draft_ckpt.pt").exists()
    for name in ("micro4-draft.safetensors", "micro4-draft.card.json"):
        shutil.copy(out / name, weights_dir / name)
    draft = recipes.embedded("micro4-draft")  # verifies the digest
    assert (draft.config.n_layers, draft.config.mtp_depth, draft.config.dim) == (2, 0, 32)
    assert draft.card["parameters"] == sum(p.numel() for p in draft.load().parameters())
    info = _run("model", "info", "--model", "micro4-draft")
    assert info.exit_code == 0, info.output
    assert f"distilled from: {target.id}" in info.output and "without the MTP module" not in info.output


def test_a_run_resumes_from_its_checkpoint(weights_dir, tmp_path):
    # 2 steps, then --steps 4 in the same folder: the second run starts at step 3 and its card says 4 steps
    out = tmp_path / "run"
    assert _run(*TRAIN, "--steps", "2", "--eval-every", "2", "--out-dir", str(out)).exit_code == 0
    result = _run(*TRAIN, "--steps", "4", "--eval-every", "1", "--out-dir", str(out))
    assert result.exit_code == 0, result.output
    assert "step 1/4" not in result.output and "step 3/4" in result.output
    assert json.loads((out / "micro4-draft.card.json").read_text())["training"]["steps"] == 4
    assert torch.load(out / "draft_ckpt.pt", weights_only=False)["step"] == 4


def test_a_checkpoint_against_other_target_weights_exits_65(weights_dir, tmp_path):
    # micro4 retrained (new weights, new digest) after a run: its checkpoint is refused, naming both ids
    out = tmp_path / "run"
    assert _run(*TRAIN, "--steps", "2", "--eval-every", "2", "--out-dir", str(out)).exit_code == 0
    old, new = recipes.embedded("micro4").id, install(weights_dir, seed=1)
    result = _run(*TRAIN, "--steps", "4", "--out-dir", str(out))
    assert result.exit_code == 65, result.output
    assert f"was trained against {old}, not {new}" in " ".join(result.output.split())


def test_a_checkpoint_of_other_options_exits_2(weights_dir, tmp_path):
    out = tmp_path / "run"
    assert _run(*TRAIN, "--steps", "2", "--eval-every", "2", "--out-dir", str(out)).exit_code == 0
    result = _run(*TRAIN, "--steps", "4", "--lr", "0.01", "--out-dir", str(out))
    assert result.exit_code == 2, result.output
    assert "was trained with --lr 0.001 (this run: 0.01)" in " ".join(result.output.split())


@pytest.mark.parametrize("args, status, message", [
    (["--preset", "micro"], 2, "--preset is for --drafter mtp; a draft model takes its shape"),
    (["--init-from", "w.safetensors"], 2, "--init-from is for --drafter mtp"),
    (["--target", "nope"], 66, "no embedded recipe 'nope'"),
    (["--seq-len", "129"], 2, "--seq-len 129 is past micro4's context of 128; pass --seq-len 8..128"),
    (["--lr", "0"], 2, "--lr 0.0 must be a finite number above 0"),
    (["--target", "micro-t"], 2, "--target micro-t has 2 layers: a draft of 2 would be no smaller"),
])
def test_bad_options_are_refused_before_out_dir_is_made(weights_dir, tmp_path, args, status, message):
    # each refusal names the option, with its status, and makes no OUT_DIR
    torch.manual_seed(0)
    micro = Transformer(ModelConfig.from_name("micro"))
    digest = save_weights(micro, weights_dir / "micro-t.safetensors")
    write_card({"config": asdict(micro.cfg), "digest": digest}, weights_dir / "micro-t.card.json")
    result = _run(*TRAIN, *args, "--out-dir", str(tmp_path / "run"))
    assert result.exit_code == status, result.output
    assert message in " ".join(result.output.split()) and not (tmp_path / "run").exists()


def test_a_corrupt_checkpoint_exits_65_and_is_kept(weights_dir, tmp_path):
    (tmp_path / "draft_ckpt.pt").write_bytes(b"garbage")
    result = _run(*TRAIN, "--steps", "2", "--out-dir", str(tmp_path))
    assert result.exit_code == 65, result.output
    assert f"{tmp_path / 'draft_ckpt.pt'} is not a readable checkpoint" in result.output
    assert (tmp_path / "draft_ckpt.pt").read_bytes() == b"garbage"


@pytest.mark.parametrize("name", ["micro4-draft.safetensors", "micro4-draft.card.json", "draft_ckpt.tmp"])
def test_weights_card_or_checkpoint_that_cannot_be_written_exit_73(weights_dir, tmp_path, name):
    # a folder where a file goes: one line naming it
    (tmp_path / name).mkdir()
    result = _run(*TRAIN, "--steps", "1", "--eval-every", "1", "--out-dir", str(tmp_path))
    assert result.exit_code == 73, result.output
    assert f"error: cannot write {tmp_path / name}: Is a directory" in result.output


def test_an_out_dir_that_is_a_file_exits_73(weights_dir, tmp_path):
    (tmp_path / "a-file").write_text("")
    result = _run(*TRAIN, "--steps", "1", "--out-dir", str(tmp_path / "a-file"))
    assert result.exit_code == 73 and "it is a file, not a folder" in result.output


def test_help_lists_the_draft_and_its_defaults():
    result = _run("model", "train", "--help")
    text = " ".join(result.output.split())
    assert result.exit_code == 0 and "runs/<target>-draft" in text
    assert "draft: distil a 2-layer draft model" in text and "default 1500, 16, 256, 0.001, 100" in text
