"""`met bench spec-cost --model FOLDER`: a model without a drafter gets a decode-only table under its folder recipe."""

import pytest
from typer.testing import CliRunner

from checkpoint_helpers import checkpoint
from met.bench.spec_cost_cli import calibration_path
from met.cli import app
from met.exit_codes import EX_DATAERR, EX_OK
from met.model.hf_checkpoint import hf_recipe
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


@pytest.mark.parametrize("flag, message", [
    (["--max-depth", "2"], "has no MTP module, so there is no draft step to measure at --max-depth 2"),
    (["--calibrate"], "has no MTP drafter to calibrate; drop --calibrate"),
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
    cfg.write_text(cfg.read_text().replace("LlamaForCausalLM", "MistralForCausalLM"))
    result = CliRunner().invoke(app, ["bench", "spec-cost", "--model", str(tmp_path / "m"), *FAST,
                                      "--out", str(tmp_path / "t.toml")])
    assert result.exit_code == EX_DATAERR and "architecture MistralForCausalLM is not supported" in result.stderr
