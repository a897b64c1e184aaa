"""`met model info`: the recipe's card in lines, a checkpoint folder's id; an unknown recipe exits 66, a damaged card 65."""

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from checkpoint_helpers import checkpoint
from met.cli import app
from met.model.recipes import embedded


def _run(*args: str):
    return CliRunner().invoke(app, ["model", "info", *args])


@pytest.fixture
def shipped_copy(tmp_path, monkeypatch):
    """A weights folder like the shipped one (weights linked, cards copied) that a test may damage."""
    r = embedded(verify=False)
    for name in ("met-tiny-py.safetensors", "met-tiny-py.card.json", "met-tiny-py.dflash.card.json"):
        if name.endswith(".safetensors"):
            (tmp_path / name).symlink_to(r.weights.with_name(name))
        else:
            (tmp_path / name).write_text(r.weights.with_name(name).read_text())
    monkeypatch.setattr("met.model.recipes.WEIGHTS_DIR", tmp_path)
    return tmp_path


def test_overlong_recipe_exits_66():
    # a name past the file system's limit is an unknown recipe, not an OSError traceback
    r = _run("--recipe", "x" * 300)
    assert r.exit_code == 66 and "no embedded recipe" in r.output and "known: met-tiny-py" in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)


def test_path_as_recipe_exits_66():
    # a path into the weights folder is no checkpoint folder either (was the id ../weights/met-tiny-py@..., then a
    # ValueError)
    r = _run("--recipe", "../weights/met-tiny-py")
    assert r.exit_code == 66 and "no checkpoint folder '../weights/met-tiny-py'" in r.output
    assert "met-tiny-py@" not in r.output


def test_a_checkpoint_folders_recipe_id_covers_its_config(tmp_path):
    # --model FOLDER prints the id tables are keyed by; an edit of a config field met reads changes it
    checkpoint(tmp_path / "tiny")
    first = _run("--model", str(tmp_path / "tiny"))
    assert first.exit_code == 0 and "checkpoint folder: LlamaForCausalLM" in first.output
    assert "model.safetensors" in first.output and "config: dim" in first.output
    rid = re.search(r"tiny@[0-9a-f]{16}", first.output).group(0)
    doc = json.loads((tmp_path / "tiny" / "config.json").read_text())
    (tmp_path / "tiny" / "config.json").write_text(json.dumps(doc | {"rms_norm_eps": 0.5}))
    second = _run("--model", str(tmp_path / "tiny"))
    assert second.exit_code == 0 and rid not in second.output and "tiny@" in second.output
    assert json.loads(_run("--model", str(tmp_path / "tiny"), "--json").output)["source"] == "hf"


@pytest.mark.parametrize("card", ["met-tiny-py.card.json", "met-tiny-py.dflash.card.json"])
@pytest.mark.parametrize("text", ["{", "", "[]", "{}", '{"config": {}}'])
def test_damaged_card_exits_65_naming_it(shipped_copy, card, text):
    # a cut, emptied, listed or emptied-object card, the recipe's or its drafter's beside it, is invalid data, named
    (shipped_copy / card).write_text(text)
    r = _run()
    assert r.exit_code == 65 and card in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)


def test_card_without_a_figure_exits_65_naming_it(shipped_copy):
    # a card that loads but lacks what info prints (the training figures) names the missing field
    card = json.loads((shipped_copy / "met-tiny-py.card.json").read_text())
    del card["training"]["steps"]
    (shipped_copy / "met-tiny-py.card.json").write_text(json.dumps(card))
    r = _run()
    assert r.exit_code == 65 and "met-tiny-py.card.json" in r.output and "'steps'" in r.output


def test_acceptance_positions_in_numeric_order(shipped_copy):
    # positions 1, 2, 10 print in that order, not as strings sort (1, 10, 2)
    path = shipped_copy / "met-tiny-py.dflash.card.json"
    card = json.loads(path.read_text())
    card["acceptance"]["per_position"] = {"1": 0.5, "10": 0.01, "2": 0.3}
    path.write_text(json.dumps(card))
    r = _run()
    assert r.exit_code == 0, r.output
    assert re.findall(r"DFlash greedy acceptance at draft (\d+)", r.output) == ["1", "2", "10"]


def test_help_lists_exit_statuses():
    # every command's --help names its exit statuses
    out = " ".join(_run("--help").output.split())
    assert "Exit statuses: 0" in out and "65 (EX_DATAERR)" in out and "66 (EX_NOINPUT)" in out


@pytest.mark.parametrize("command", [
    ["tables", "check", str(Path(__file__).parents[2] / "tables/cpu-amd-epyc-1t/met-tiny-py.toml")],  # its key
    ["bench", "policies", "--quick", "--policies", "off"],
    ["model", "train", "--drafter", "dflash", "--target", "met-tiny-py", "--steps", "1"],
], ids=["tables-check", "bench-policies", "train-dflash"])
def test_a_damaged_card_is_65_from_every_command(shipped_copy, tmp_path, command):
    # each mapped every RecipeError to 66 (missing) where a damaged card is bad data
    (shipped_copy / "met-tiny-py.card.json").write_text("{")
    out = ["--out-dir", str(tmp_path / "out")] if command[0] != "tables" else []
    r = CliRunner().invoke(app, [*command, *out])
    assert r.exit_code == 65 and "met-tiny-py.card.json" in r.output, r.output


def test_training_lists_the_runs_it_continued(shipped_copy):
    # a card of weights trained --init-from earlier ones says so, each earlier run under the later one
    path = shipped_copy / "met-tiny-py.card.json"
    card = json.loads(path.read_text())
    first = {"steps": 800, "batch": 16, "seq_len": 256, "tokens_seen": 3289600, "wall_s": 4284.5, "threads": 2}
    card["training"] = {**first, "steps": 2000, "threads": 1, "started_from": {"digest": "0123456789abcdef",
                                                                              "training": first}}
    path.write_text(json.dumps(card))
    r = _run()
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("training: 2000 steps"))
    assert lines[at + 1].strip() == ("started from 0123456789abcdef: training: 800 steps x 16 x 256, 3,289,600 "
                                     "tokens, 71 min on 2 threads")
