"""`met bench spec-cost --model FOLDER`: a model without a drafter gets a decode-only table under its folder recipe."""

import pytest
from typer.testing import CliRunner

from checkpoint_helpers import checkpoint
from met.bench.loop_sweep import NothingTimed
from met.bench.table_names import calibration_path
from met.cli import app
from met.exit_codes import EX_DATAERR, EX_OK
from met.model.recipes import hf_recipe
from met.speculative.spec_cost import CostTable

pytest.importorskip("transformers")

FAST = ["--widths", "1,2", "--context-len", "16", "--repeats", "1", "--window", "0.002", "--energy", "none",
        "--box-class", "test-box", "--quiet"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "tiny-qwen2"
    checkpoint(path, "qwen2")
    return path


def test_folder_table_holds_decode_cells_under_its_recipe(folder, tmp_path, monkeypatch):
    # default path tables/<box>/<folder name>.toml; key recipe name@digest; k = 0 only; no calibration
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["bench", "spec-cost", "--model", str(folder), *FAST])
    assert result.exit_code == EX_OK, result.output
    out = tmp_path / "tables" / "test-box" / "tiny-qwen2.toml"
    table = CostTable.parse(out.read_text())
    assert table.key.recipe == hf_recipe(folder).id and table.key.modes == ("decode",)
    assert table.kmax == 0 and table.widths == (1, 2)
    assert not calibration_path(out).exists()
    # no energy source: timed in running decodes through the scheduler, with the folder's tokenizer
    assert table.meta["method"].startswith("in-loop") and table.meta["context_len"] == 16


def test_a_folder_whose_decodes_end_at_once_is_timed_in_windows(folder, tmp_path, monkeypatch):
    def ends_at_once(*args, **kwargs):
        raise NothingTimed("the decode at width 1, depth 0 ran no full step to time (its requests ended at once)")

    monkeypatch.setattr("met.bench.loop_sweep.measure_joint_in_loop", ends_at_once)  # the command imports it when it runs
    out = tmp_path / "t.toml"
    loud = [a for a in FAST if a != "--quiet"]  # the switch is news, which --quiet silences
    result = CliRunner().invoke(app, ["bench", "spec-cost", "--model", str(folder), *loud, "--out", str(out)])
    assert result.exit_code == EX_OK, result.output
    assert "ran no full step to time" in result.stderr and "windows instead" in result.stderr
    assert "steps_per_window_min" in CostTable.parse(out.read_text()).meta  # timed in windows


def test_a_folder_without_a_tokenizer_is_timed_in_windows(tmp_path):
    checkpoint(tmp_path / "m")
    (tmp_path / "m" / "tokenizer.json").unlink()
    out = tmp_path / "t.toml"
    result = CliRunner().invoke(app, ["bench", "spec-cost", "--model", str(tmp_path / "m"), *FAST, "--out", str(out)])
    assert result.exit_code == EX_OK, result.output
    assert "steps_per_window_min" in CostTable.parse(out.read_text()).meta  # timed in windows


@pytest.mark.parametrize("flag, message", [
    (["--max-depth", "2"], "has no MTP module, so there is no draft step to measure at --max-depth 2"),
    (["--calibrate"], "has no MTP drafter to calibrate; drop --calibrate"),
    (["--verify-depth", "8"], "so there are no copies to verify (--verify-depth 8); drop --verify-depth"),
])
def test_asking_a_folder_for_drafts_is_refused(folder, tmp_path, flag, message):
    # an explicit draft depth or calibration is refused (exit 2), not silently dropped; nothing is written
    out = tmp_path / "t.toml"
    result = CliRunner().invoke(app, ["bench", "spec-cost", "--model", str(folder), *FAST, *flag, "--out", str(out)])
    assert result.exit_code == 2 and message in result.stderr and not out.exists()


def test_unsupported_folder_exits_65(tmp_path):
    # the architecture is named; no lock or table is made
    checkpoint(tmp_path / "m")
    cfg = tmp_path / "m" / "config.json"
    cfg.write_text(cfg.read_text().replace("LlamaForCausalLM", "GemmaForCausalLM"))
    result = CliRunner().invoke(app, ["bench", "spec-cost", "--model", str(tmp_path / "m"), *FAST,
                                      "--out", str(tmp_path / "t.toml")])
    assert result.exit_code == EX_DATAERR and "architecture GemmaForCausalLM is not supported" in result.stderr
