"""`met model train`'s refusals: bad option values (2), an unusable checkpoint (65), an unwritable --out-dir (73)."""

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from met.cli import app
from met.model.config import ModelConfig
from met.model.corpus import Split
from met.train import checkpoint
from met.train.recipe import TrainParams

from random_models import random_micro

MICRO = ["model", "train", "--preset", "micro", "--batch", "2", "--seq-len", "16"]


class Trained(Exception):
    """Raised where training would begin: a refusal must come before it."""


@pytest.fixture
def no_training(monkeypatch):
    """Any read of the corpus fails the test: refusals come before training."""
    def load_split(heldout):
        raise Trained

    monkeypatch.setattr("met.model.corpus.load_split", load_split)  # the command imports it when it runs


@pytest.fixture
def tiny_corpus(monkeypatch):
    """A small corpus instead of the stdlib (the checkpoint cases fail before a step)."""
    split = Split(np.random.default_rng(0).integers(97, 110, 2000).astype(np.uint16), ("x",))
    monkeypatch.setattr("met.model.corpus.load_split", lambda heldout: split)


def _run(*args: str):
    return CliRunner().invoke(app, list(args))


def _micro_checkpoint(path, step: int) -> None:
    """A checkpoint of the micro preset at `step`, as `met model train --preset micro` saves it."""
    model = random_micro()
    opt = torch.optim.AdamW(model.parameters())
    path.parent.mkdir(parents=True, exist_ok=True)
    checkpoint.save(path, "model", model, opt, np.random.default_rng(0), None, step, {"wall_s": 1.0},
                     TrainParams(steps=step, batch=2, seq_len=16), model.cfg)


@pytest.mark.parametrize("option, value, message", [
    ("--steps", "0", "'--steps'"),  # 0 once meant the default 6000
    ("--batch", "0", "'--batch'"),
    ("--seq-len", "0", "'--seq-len'"),
    ("--eval-every", "0", "'--eval-every'"),
    ("--threads", "-1", "'--threads'"),  # torch refused it with a traceback
    ("--threads", "100000", "'--threads'"),  # torch crashed the process
    ("--lr", "0", "--lr 0.0 must be a finite number above 0"),
    ("--lr", "nan", "--lr nan must be a finite number above 0"),
])
@pytest.mark.parametrize("drafter", ["mtp", "dflash"])
def test_option_values_out_of_range_exit_2(no_training, tmp_path, option, value, message, drafter):
    # each bad value is named, for both trainers, before any training and before OUT_DIR is made
    result = _run(*MICRO, "--drafter", drafter, option, value, "--out-dir", str(tmp_path / "run"))
    assert result.exit_code == 2, result.output
    assert message in result.output and not (tmp_path / "run").exists()


@pytest.mark.parametrize("drafter", ["mtp", "dflash"])
def test_an_empty_out_dir_exits_2_and_writes_nothing_here(no_training, tmp_path, monkeypatch, drafter):
    # typer reads '' (an unset variable) as Path('.'): the run trained into the current folder
    import met.train.dflash_cli as train_dflash_cli

    import met.model.corpus as corpus

    monkeypatch.setattr(train_dflash_cli, "load_split", corpus.load_split)  # no_training's, which raises
    monkeypatch.chdir(tmp_path)
    result = _run("model", "train", "--drafter", drafter, "--out-dir", "")
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--out-dir': is empty" in result.output and not list(tmp_path.iterdir())


def test_a_seq_len_past_the_presets_context_exits_2(no_training, tmp_path):
    # micro's context is 128: 127 leaves no room for the 2 MTP targets (train raised a ValueError traceback)
    result = _run("model", "train", "--preset", "micro", "--seq-len", "127", "--out-dir", str(tmp_path))
    assert result.exit_code == 2
    assert "--seq-len 127 leaves no room" in result.output and "--seq-len 126 or less" in result.output


@pytest.mark.parametrize("seq_len, noted", [("16", True), ("126", False)])
def test_windows_shorter_than_the_context_are_noted_before_training(no_training, tmp_path, seq_len, noted):
    # a model trained on short windows falls apart past them; micro's context is 128
    result = _run("model", "train", "--preset", "micro", "--seq-len", seq_len, "--out-dir", str(tmp_path))
    assert isinstance(result.exception, Trained)
    assert ("train no position past 17 of preset micro's context of 128" in result.output) == noted
    assert ("--seq-len 126 trains them all" in result.output) == noted


def test_omitted_options_are_the_defaults_and_given_ones_kept(tiny_corpus, monkeypatch, tmp_path):
    # --steps 1 trains 1 step (not `1 or default`); no --steps gives TrainParams' default, no --seq-len every
    # position of the preset's context (less the 2 MTP targets): shorter windows leave the rest untrained
    seen = []

    def train(model, train_split, heldout, params, ckpt, on_step):
        seen.append(params)
        raise Trained

    monkeypatch.setattr("met.train.recipe.train", train)
    _run(*MICRO, "--steps", "1", "--eval-every", "1", "--lr", "1e-9", "--out-dir", str(tmp_path))
    _run("model", "train", "--out-dir", str(tmp_path))
    given, default = seen
    assert (given.steps, given.eval_every, given.lr, given.batch, given.seq_len) == (1, 1, 1e-9, 2, 16)
    assert default == TrainParams(seq_len=ModelConfig.from_name("met-tiny-py").max_seq_len - 2)


@pytest.mark.parametrize("out_dir, message", [
    ("a-file", "a-file: it is a file, not a folder"),
    ("a-file/sub", "a-file/sub: Not a directory"),
    ("/proc/met-test", "/proc/met-test: No such file or directory"),  # /proc takes no new folders
])
def test_an_out_dir_that_cannot_be_made_exits_73(no_training, tmp_path, monkeypatch, out_dir, message):
    # one error line naming the folder, before any training (mkdir raised a traceback)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("")
    result = _run(*MICRO, "--out-dir", out_dir)
    assert result.exit_code == 73, result.output
    assert f"error: cannot write to --out-dir {message}" in result.output and "Traceback" not in result.output


def test_dflash_out_dir_that_cannot_be_made_exits_73(no_training, micro_embedded, tmp_path):
    # the drafter's trainer refuses the same way, before loading its target
    (tmp_path / "a-file").write_text("")
    result = _run("model", "train", "--drafter", "dflash", "--target", "micro-t", "--seq-len", "64", "--out-dir",
                  str(tmp_path / "a-file"))  # the default 256 is past micro-t's context: refused first, as for mtp
    assert result.exit_code == 73 and "it is a file, not a folder" in result.output


@pytest.mark.parametrize("content, message", [
    (b"garbage", "is not a readable checkpoint ("),  # an UnpicklingError traceback before
    (b"", "is not a readable checkpoint (EOFError"),  # printed only "Aborted!"
])
def test_a_corrupt_checkpoint_exits_65_naming_it(tiny_corpus, tmp_path, content, message):
    # the file is named, with what to do; the run does not start over it
    (tmp_path / "ckpt.pt").write_bytes(content)
    result = _run(*MICRO, "--steps", "3", "--out-dir", str(tmp_path))
    assert result.exit_code == 65, result.output
    assert f"error: {tmp_path / 'ckpt.pt'} {message}" in result.output
    assert "remove it to train from step 0, or pass another --out-dir" in result.output
    assert (tmp_path / "ckpt.pt").read_bytes() == content


def test_another_presets_checkpoint_exits_65_naming_the_difference(tiny_corpus, tmp_path):
    # a micro checkpoint resumed with the default preset (a load_state_dict size-mismatch traceback before)
    _micro_checkpoint(tmp_path / "ckpt.pt", 2)
    result = _run("model", "train", "--batch", "2", "--seq-len", "16", "--out-dir", str(tmp_path))
    assert result.exit_code == 65, result.output
    assert f"{tmp_path / 'ckpt.pt'} was saved for another model: dim 32 (this run: 192)" in result.output


def test_a_checkpoint_past_steps_is_refused_not_carded(tiny_corpus, tmp_path):
    # at step 2, --steps 1 would have written a card claiming 1 step: exit 2, no card
    _micro_checkpoint(tmp_path / "ckpt.pt", 2)
    result = _run(*MICRO, "--steps", "1", "--out-dir", str(tmp_path))
    assert result.exit_code == 2, result.output
    assert "is already at step 2, past --steps 1; pass --steps 2 or more" in result.output
    assert not (tmp_path / "micro.card.json").exists()


def test_a_checkpoint_of_other_options_is_refused_not_carded(tiny_corpus, tmp_path):
    # trained with --batch 2, resumed with --batch 4: the card said 4 x 4 x 16 for 2 steps of 2 (exit 0 before)
    _micro_checkpoint(tmp_path / "ckpt.pt", 2)
    result = _run("model", "train", "--preset", "micro", "--batch", "4", "--seq-len", "16", "--lr", "0.01",
                  "--steps", "4", "--out-dir", str(tmp_path))
    assert result.exit_code == 2, result.output
    assert (f"{tmp_path / 'ckpt.pt'} was trained with --batch 2 (this run: 4), --lr 0.002 (this run: 0.01); "
            "pass the same to resume it") in " ".join(result.output.split())
    assert not (tmp_path / "micro.card.json").exists()


def test_help_lists_the_exit_statuses():
    # as every other command's help does
    result = _run("model", "train", "--help")
    assert result.exit_code == 0
    assert "Exit statuses:" in result.output
    for status in ("65 (EX_DATAERR)", "66 (EX_NOINPUT)", "73 (EX_CANTCREAT)", "0<=x<=1024"):
        assert status in " ".join(result.output.split())


@pytest.mark.parametrize("name", ["micro.safetensors", "micro.card.json", "ckpt.tmp"])
def test_weights_or_card_that_cannot_be_written_exit_73(tiny_corpus, monkeypatch, tmp_path, name):
    # a folder where the weights, the card or the checkpoint go: one line naming the file (a traceback before)
    monkeypatch.setattr("met.train.acceptance.mtp_acceptance", lambda *a, **k: {})
    (tmp_path / name).mkdir()
    result = _run(*MICRO, "--steps", "1", "--eval-every", "1", "--out-dir", str(tmp_path))
    assert result.exit_code == 73, result.output
    assert f"error: cannot write {tmp_path / name}: Is a directory" in result.output
    assert "Traceback" not in result.output


def test_init_from_continues_those_weights_and_cards_where_it_started(tiny_corpus, tmp_path):
    # two steps from a first run's weights: the second run starts where the first ended, not afresh
    first = tmp_path / "first"
    assert _run(*MICRO, "--steps", "2", "--eval-every", "2", "--out-dir", str(first)).exit_code == 0
    start = first / "micro.safetensors"
    result = _run(*MICRO, "--steps", "1", "--eval-every", "1", "--lr", "1e-9", "--out-dir", str(tmp_path / "second"),
                  "--init-from", str(start))
    assert result.exit_code == 0, result.output
    from met.model.config import ModelConfig
    from met.model.weights import file_digest, load_model, read_card
    before = load_model(ModelConfig.from_name("micro"), start).state_dict()
    after = load_model(ModelConfig.from_name("micro"), tmp_path / "second" / "micro.safetensors").state_dict()
    assert all(torch.allclose(before[k], after[k], atol=1e-5) for k in before)  # lr 1e-9: one step moves nothing
    started = read_card(tmp_path / "second" / "micro.card.json")["training"]["started_from"]
    assert started["digest"] == file_digest(start) and started["training"]["steps"] == 2


def test_a_checkpoint_started_from_other_weights_is_refused(tiny_corpus, tmp_path):
    _micro_checkpoint(tmp_path / "ckpt.pt", 1)
    weights = tmp_path / "w.safetensors"
    from met.model.weights import save_weights
    save_weights(random_micro(), weights)
    result = _run(*MICRO, "--steps", "3", "--out-dir", str(tmp_path), "--init-from", str(weights))
    assert result.exit_code == 2, result.output
    assert "was trained with --init-from" in " ".join(result.output.split())


@pytest.mark.parametrize("content, status, message", [
    (None, 66, "no such file"),
    (b"not safetensors", 65, "not weights of this preset"),
])
def test_init_from_that_is_no_weights_of_the_preset_is_refused(no_training, tmp_path, content, status, message):
    path = tmp_path / "w.safetensors"
    if content is not None:
        path.write_bytes(content)
    result = _run(*MICRO, "--steps", "1", "--out-dir", str(tmp_path / "o"), "--init-from", str(path))
    assert result.exit_code == status, result.output
    assert f"--init-from {path}: {message}" in " ".join(result.output.split())
