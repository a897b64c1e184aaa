"""`met bench spec-cost --eagle`: an EAGLE-3 head's step as its own mode, keyed by its config and files' digest."""

import pytest
import torch
from typer.testing import CliRunner

from eagle3_helpers import random_head, save_head
from met.bench import measured_boot as boot
from met.bench.measured_boot import BootError, MeasuredBoot
from met.bench.table_names import calibration_path
from met.cli import app
from met.engine.identity import (EAGLE_MODES, RunSettings, eagle_config, eagle_drafter_key, eagle_head,
                                 serve_table_key)
from met.exit_codes import EX_CONFIG, EX_NOINPUT, EX_OK
from met.speculative.spec_cost import AcceptanceCalibration, CostTable, SpecCostState

BOX = "test-box"
FAST = ["--widths", "1,2", "--max-depth", "2", "--verify-depth", "2", "--context-len", "16", "--repeats", "1",
        "--window", "0.002", "--energy", "none", "--box-class", BOX, "--quiet"]


@pytest.fixture
def heads(micro_embedded, tmp_path):
    """Two random EAGLE-3 heads for the embedded micro recipe: folders head-a and head-b (other weights)."""
    model, recipe = micro_embedded
    return recipe, save_head(tmp_path / "head-a", random_head(model.cfg, seed=1)), \
        save_head(tmp_path / "head-b", random_head(model.cfg, seed=2))


def _settings() -> RunSettings:
    return RunSettings("float32", "cpu", torch.get_num_threads())


def test_a_heads_table_is_keyed_by_it_and_calibrated_on_its_drafts(heads, tmp_path):
    # mode draft_eagle under the head's config and digest; draft costs at k >= 1; calibration kind eagle; the
    # same head boots, another is refused with 78 naming the plan digest and the drafter
    recipe, a, b = heads
    out = tmp_path / "t.toml"
    result = CliRunner().invoke(app, ["bench", "spec-cost", "--recipe", recipe.name, "--eagle", str(a), "--quick",
                                      "--quiet", "--energy", "none", "--box-class", BOX, "--out", str(out)])
    assert result.exit_code == EX_OK, result.output
    table = CostTable.parse(out.read_text())
    head = eagle_head(a, recipe.config)
    want = serve_table_key(recipe.id, recipe.config, _settings(), "none", EAGLE_MODES, BOX, eagle_config(head))
    assert table.key == want and table.key.modes == ("decode", "draft_eagle", "verify")
    assert table.meta["eagle_head"] == head.id and all(c.draft_s > 0 for c in table.cells if c.k)
    cal = AcceptanceCalibration.parse(calibration_path(out).read_text())
    assert cal.drafter == eagle_drafter_key(head) and cal.drafter.kind == "eagle"
    measured = MeasuredBoot(out, calibration_path(out), 0.1, "none", BOX)
    assert isinstance(boot.boot_measured(recipe, _settings(), measured, draft=head), SpecCostState)
    with pytest.raises(BootError) as other:
        boot.boot_measured(recipe, _settings(), measured, draft=eagle_head(b, recipe.config))
    fields = [line.strip().split(":")[0] for line in other.value.lines[1:]]
    assert other.value.code == EX_CONFIG and fields == ["plan_digests.draft_eagle", "drafter"]


def test_the_default_path_is_the_heads_own(heads, tmp_path, monkeypatch):
    # tables/<box>/<recipe>.eagle-<folder>.toml, where the measured boot looks for it (windows: the head's step from
    # its restored state); a table of another head there is refused with 78 before measuring
    from met.bench.loop_sweep import NothingTimed

    def ends_at_once(*args, **kwargs):
        raise NothingTimed("the decode at width 1, depth 0 ran no full step to time (its requests ended at once)")

    recipe, a, b = heads
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("met.bench.loop_sweep.measure_joint_in_loop", ends_at_once)
    result = CliRunner().invoke(app, ["bench", "spec-cost", "--recipe", recipe.name, "--eagle", str(a),
                                      "--no-calibrate", *FAST])
    assert result.exit_code == EX_OK, result.output
    out = tmp_path / boot.default_table(BOX, recipe.name, eagle_name="head-a")
    table = CostTable.parse(out.read_text())
    assert table.key.modes == ("decode", "draft_eagle", "verify") and "steps_per_window_min" in table.meta
    assert table.meta["catchup_rows"].startswith("depth + 1 before a draft")  # as the MTP block's
    result = CliRunner().invoke(app, ["bench", "spec-cost", "--recipe", recipe.name, "--eagle", str(b),
                                      "--no-calibrate", *FAST, "--out", str(out)])
    assert result.exit_code == EX_CONFIG and "EAGLE-3 head 'head-a'" in result.output


@pytest.mark.parametrize("flags, code, message", [
    (["--drafter", "dflash"], 2, "drop one of them"),  # a DFlash table prices its drafter alone
    (["--draft-model", "micro-t"], 2, "names a file"),  # a joint sweep writes a table per drafter into a folder
])
def test_eagle_refuses_dflash_and_a_joint_sweep_into_one_file(heads, tmp_path, flags, code, message):
    recipe, a, _ = heads
    result = CliRunner().invoke(app, ["bench", "spec-cost", "--recipe", recipe.name, "--eagle", str(a), *flags,
                                      *FAST, "--out", str(tmp_path / "t.toml")])
    assert result.exit_code == code and message in result.output.replace("\n", " ")


def test_a_missing_head_is_66(micro_embedded, tmp_path):
    # no folder there: nothing measured
    _, recipe = micro_embedded
    result = CliRunner().invoke(app, ["bench", "spec-cost", "--recipe", recipe.name, "--eagle",
                                      str(tmp_path / "none"), *FAST, "--out", str(tmp_path / "t.toml")])
    assert result.exit_code == EX_NOINPUT and "no such folder" in result.output


def test_tables_check_and_show_handle_a_heads_files(heads, tmp_path):
    # check --eagle with the head: 0 for both files; another head: 78; none named: 78 asking for --eagle; show names
    # the head in its header
    recipe, a, b = heads
    out = tmp_path / "t.toml"
    result = CliRunner().invoke(app, ["bench", "spec-cost", "--recipe", recipe.name, "--eagle", str(a), "--quick",
                                      "--quiet", "--energy", "none", "--box-class", BOX, "--out", str(out)])
    assert result.exit_code == EX_OK, result.output
    check = ["tables", "check", "--recipe", recipe.name, "--box-class", BOX]
    for path in (out, calibration_path(out)):
        same = CliRunner().invoke(app, [*check, "--eagle", str(a), str(path)])
        assert same.exit_code == EX_OK, same.output
        other = CliRunner().invoke(app, [*check, "--eagle", str(b), str(path)])
        assert other.exit_code == EX_CONFIG, other.output
        unnamed = CliRunner().invoke(app, [*check, str(path)])
        assert unnamed.exit_code == EX_CONFIG and "--eagle" in unnamed.stderr, unnamed.output
    other = CliRunner().invoke(app, [*check, "--eagle", str(b), str(out)])
    assert "plan_digests.draft_eagle" in other.stderr or "'draft_eagle'" in other.stderr
    shown = CliRunner().invoke(app, ["tables", "show", str(out), "--calibration", str(calibration_path(out))],
                               env={"COLUMNS": "200"})
    assert shown.exit_code == EX_OK and "EAGLE-3 head 'head-a@" in shown.stdout, shown.output
    assert "warning" not in shown.stderr
