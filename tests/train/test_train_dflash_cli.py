"""`met model train --drafter dflash`: trains against the frozen recipe and writes the drafter and its card."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import met.train.acceptance as acceptance
import met.train.dflash_cli as dflash_cli
from met.cli import app
from met.model.corpus import Split
from met.model.dflash import load_drafter


@pytest.fixture
def micro_recipe(micro_embedded, monkeypatch):
    """An embedded micro recipe, a small corpus and two held-out prompts (no stdlib read)."""
    split = Split(np.random.default_rng(0).integers(97, 110, 3000).astype(np.uint16), ("x",))
    monkeypatch.setattr(dflash_cli, "load_split", lambda heldout: split)
    monkeypatch.setattr(acceptance, "heldout_prompts", lambda count, prompt_bytes: ["def f(x):\n    return x\n"] * 2)
    return micro_embedded[1]


def test_train_dflash_writes_a_drafter_for_its_target_and_a_card(micro_recipe, tmp_path):
    # 3 steps: the drafter loads for the target's id; the card has its key, config and acceptance per position
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["model", "train", "--drafter", "dflash", "--target", "micro-t", "--steps", "3",
                                      "--batch", "2", "--seq-len", "64", "--eval-every", "3", "--out-dir", str(out)])
    assert result.exit_code == 0, result.output
    drafter = load_drafter(out / "micro-t.dflash.safetensors", micro_recipe.id)
    card = json.loads((out / "micro-t.dflash.card.json").read_text())
    assert card["target"] == micro_recipe.id and card["config"]["block"] == drafter.block == 16
    assert len(card["heldout"]["teacher_forced_accept_at"]) == 16
    assert set(card["acceptance"]["per_position"]) <= {str(j) for j in range(1, 17)}
    assert (out / "dflash_ckpt.pt").exists()


def test_train_refuses_an_unknown_drafter_and_target(micro_recipe):
    # --drafter must be mtp or dflash; an unknown target recipe exits 66
    result = CliRunner().invoke(app, ["model", "train", "--drafter", "eagle"])
    assert result.exit_code == 2 and "--drafter 'eagle' is not one of mtp, dflash" in result.output
    result = CliRunner().invoke(app, ["model", "train", "--drafter", "dflash", "--target", "nope"])
    assert result.exit_code == 66 and "no embedded recipe 'nope'" in result.output


def test_train_refuses_an_option_of_the_other_drafter(micro_recipe, tmp_path):
    # --target with --drafter mtp and --preset with --drafter dflash were ignored (exit 0 training something else)
    result = CliRunner().invoke(app, ["model", "train", "--target", "nope", "--out-dir", str(tmp_path / "a")])
    assert result.exit_code == 2 and "--target is for --drafter dflash" in result.output, result.output
    result = CliRunner().invoke(app, ["model", "train", "--drafter", "dflash", "--preset", "micro", "--out-dir",
                                      str(tmp_path / "b")])
    assert result.exit_code == 2 and "--preset is for --drafter mtp" in result.output, result.output
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_train_dflash_refuses_a_corrupt_checkpoint(micro_recipe, tmp_path):
    # an unreadable dflash_ckpt.pt exits 65 naming it (was an UnpicklingError traceback), and is kept
    (tmp_path / "dflash_ckpt.pt").write_bytes(b"garbage")
    result = CliRunner().invoke(app, ["model", "train", "--drafter", "dflash", "--target", "micro-t", "--steps", "3",
                                      "--batch", "2", "--seq-len", "64", "--out-dir", str(tmp_path)])
    assert result.exit_code == 65, result.output
    assert f"{tmp_path / 'dflash_ckpt.pt'} is not a readable checkpoint" in result.output
    assert (tmp_path / "dflash_ckpt.pt").read_bytes() == b"garbage"


@pytest.mark.parametrize("seq_len", ["17", "129"])
def test_train_dflash_refuses_a_seq_len_its_windows_cannot_hold(micro_recipe, tmp_path, seq_len):
    # micro-t's drafter needs windows of 16 drafts + 2 rows within its context of 128: the option is named, with
    # the range, before OUT_DIR is made (a ValueError on "windows of 17 tokens" after loading the target before)
    result = CliRunner().invoke(app, ["model", "train", "--drafter", "dflash", "--target", "micro-t", "--steps", "1",
                                      "--batch", "2", "--seq-len", seq_len, "--out-dir", str(tmp_path / "run")])
    assert result.exit_code == 2, result.output
    assert f"--seq-len {seq_len} does not fit a drafter for micro-t" in result.output
    assert "pass --seq-len 18..128" in result.output and not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", ["micro-t.dflash.card.json", "dflash_ckpt.tmp"])
def test_train_dflash_card_or_checkpoint_that_cannot_be_written_exits_73(micro_recipe, tmp_path, name):
    # a folder where the card or the checkpoint goes: one line naming it (a traceback before)
    (tmp_path / name).mkdir()
    result = CliRunner().invoke(app, ["model", "train", "--drafter", "dflash", "--target", "micro-t", "--steps", "1",
                                      "--batch", "2", "--seq-len", "64", "--eval-every", "1", "--out-dir",
                                      str(tmp_path)])
    assert result.exit_code == 73, result.output
    assert f"error: cannot write {tmp_path / name}: Is a directory" in result.output
