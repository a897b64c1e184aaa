"""`met bench spec-cost --drafter dflash`: the block drafter's step as its own mode, keyed by the drafter's config."""

from dataclasses import asdict, replace

import pytest
from typer.testing import CliRunner

from met.bench.table_names import calibration_path
from met.cli import app
from met.engine.identity import RunSettings, plan_digests
from met.exit_codes import EX_CONFIG, EX_NOINPUT, EX_OK
from met.model.config import ModelConfig
from met.model.dflash import DflashConfig, DflashDrafter, save_drafter, shipped_path
from met.speculative.spec_cost import CostTable

FAST = ["--recipe", "micro-t", "--widths", "1,2", "--max-depth", "2", "--context-len", "16", "--repeats", "1",
        "--window", "0.002", "--energy", "none", "--box-class", "test-box", "--quiet"]


@pytest.fixture
def micro(micro_embedded, tmp_path, monkeypatch):
    """An embedded micro recipe in a temporary weights folder, with a random DFlash drafter beside it."""
    model, recipe = micro_embedded
    monkeypatch.chdir(tmp_path)
    drafter = DflashDrafter(DflashConfig.for_target(model.cfg, block=4, ffn_dim=64))
    save_drafter(drafter, shipped_path(recipe), recipe.id)
    return recipe, drafter


def test_dflash_table_has_its_draft_mode_and_no_calibration(micro, tmp_path):
    # default path <recipe>.dflash.toml; modes decode, verify, draft_dflash; positive draft costs at k >= 1
    recipe, drafter = micro
    result = CliRunner().invoke(app, ["bench", "spec-cost", "--drafter", "dflash", *FAST])
    assert result.exit_code == EX_OK, result.output
    out = tmp_path / "tables" / "test-box" / "micro-t.dflash.toml"
    table = CostTable.parse(out.read_text())
    assert table.key.modes == ("decode", "draft_dflash", "verify") and table.key.recipe == recipe.id
    assert all(c.draft_s > 0 for c in table.cells if c.k > 0)
    assert not calibration_path(out).exists()
    assert table.verify_cells == ()  # its cells price its own depths: no copies are verified past them


def test_tables_check_compares_a_dflash_tables_key_with_the_shipped_drafter(micro, tmp_path):
    # the draft_dflash digest is rebuilt from the drafter beside the weights: 0 for it, 78 for another, 66 for none
    recipe, drafter = micro
    assert CliRunner().invoke(app, ["bench", "spec-cost", "--drafter", "dflash", *FAST]).exit_code == EX_OK
    out = str(tmp_path / "tables" / "test-box" / "micro-t.dflash.toml")
    check = ["tables", "check", "--recipe", "micro-t", "--box-class", "test-box", out]
    result = CliRunner().invoke(app, check)
    assert result.exit_code == EX_OK, result.output
    save_drafter(DflashDrafter(replace(drafter.cfg, block=8)), shipped_path(recipe), recipe.id)
    result = CliRunner().invoke(app, check)
    assert result.exit_code == EX_CONFIG and "draft_dflash" in result.stderr
    shipped_path(recipe).unlink()
    result = CliRunner().invoke(app, check)
    assert result.exit_code == EX_NOINPUT and "no DFlash drafter at" in result.stderr


def test_draft_dflash_digest_covers_the_drafter_config(micro):
    # another block size: another draft_dflash digest; decode and verify digests do not move
    _, drafter = micro
    settings = RunSettings("float32", "cpu", 1)
    cfg = ModelConfig.from_name("micro")
    modes = ("decode", "verify", "draft_dflash")
    a = plan_digests(cfg, settings, modes, asdict(drafter.cfg))
    b = plan_digests(cfg, settings, modes, asdict(replace(drafter.cfg, block=8)))
    assert a["draft_dflash"] != b["draft_dflash"] and a["verify"] == b["verify"] and a["decode"] == b["decode"]


def test_dflash_without_a_drafter_or_with_calibrate_is_refused(micro, tmp_path):
    # no drafter beside the weights: 66 naming the training command; --calibrate, --verify-depth: usage errors
    recipe, _ = micro
    shipped_path(recipe).unlink()
    result = CliRunner().invoke(app, ["bench", "spec-cost", "--drafter", "dflash", *FAST])
    assert result.exit_code == EX_NOINPUT and "met model train --drafter dflash" in result.stderr
    result = CliRunner().invoke(app, ["bench", "spec-cost", "--drafter", "dflash", "--calibrate", *FAST])
    assert result.exit_code == 2 and "drop --calibrate" in result.output
    result = CliRunner().invoke(app, ["bench", "spec-cost", "--drafter", "dflash", "--verify-depth", "8", *FAST])
    assert result.exit_code == 2 and "drop --verify-depth" in result.output
