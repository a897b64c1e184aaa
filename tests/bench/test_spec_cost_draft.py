"""`met bench spec-cost --draft-model`: a draft model's step as its own mode, keyed by its recipe and config."""

from dataclasses import asdict, replace

import pytest
import torch
from typer.testing import CliRunner

from met.bench import measured_boot as boot
from met.bench.measured_boot import BootError, MeasuredBoot
from met.bench.table_names import calibration_path
from met.cli import app
from met.engine.identity import (DRAFT_MODEL_MODES, RunSettings, draft_model_config, draft_model_drafter_key,
                                 serve_table_key)
from met.exit_codes import EX_CONFIG, EX_DATAERR, EX_NOINPUT, EX_OK
from met.model.config import ModelConfig
from met.model.transformer import Transformer
from met.model.weights import save_weights, write_card
from met.speculative.spec_cost import AcceptanceCalibration, CostTable, SpecCostState

BOX = "test-box"
FAST = ["--widths", "1,2", "--max-depth", "2", "--verify-depth", "2", "--context-len", "16", "--repeats", "1",
        "--window", "0.002", "--energy", "none", "--box-class", BOX, "--quiet"]


def embed(folder, name: str, config: ModelConfig, seed: int) -> None:
    """A random model saved as the embedded recipe `name` (weights and card) in folder."""
    torch.manual_seed(seed)
    digest = save_weights(Transformer(config), folder / f"{name}.safetensors")
    write_card({"config": asdict(config), "digest": digest}, folder / f"{name}.card.json")


@pytest.fixture(scope="module")
def recipes(tmp_path_factory):
    """micro-t (with an MTP module) and three one-layer draft models without one: micro-d, micro-e (other weights)
    and micro-wide (a larger vocabulary), all embedded in a temporary weights folder."""
    import met.model.recipes as recipes

    folder = tmp_path_factory.mktemp("weights")
    micro = ModelConfig.from_name("micro")
    small = replace(micro, n_layers=1, mtp_depth=0)
    embed(folder, "micro-t", micro, 0)
    embed(folder, "micro-d", small, 1)
    embed(folder, "micro-e", small, 2)
    embed(folder, "micro-wide", replace(small, vocab_size=micro.vocab_size + 8), 3)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(recipes, "WEIGHTS_DIR", folder)
        yield {name: recipes.embedded(name) for name in ("micro-t", "micro-d", "micro-e", "micro-wide")}


@pytest.fixture(scope="module")
def quick_run(recipes, tmp_path_factory):
    """One --quick run of micro-t drafted by micro-d (sweep and calibration), read by several tests."""
    out = tmp_path_factory.mktemp("tables") / "t.toml"
    result = CliRunner().invoke(app, ["bench", "spec-cost", "--recipe", "micro-t", "--draft-model", "micro-d",
                                      "--quick", "--quiet", "--energy", "none", "--box-class", BOX, "--out", str(out)])
    return result, out


def _settings() -> RunSettings:
    return RunSettings("float32", "cpu", torch.get_num_threads())


def _boot(out, target, draft):
    return boot.boot_measured(target, _settings(), MeasuredBoot(out, calibration_path(out), 0.1, "none", BOX),
                              draft=draft)


def test_a_draft_models_table_is_keyed_by_it_and_calibrated_on_its_drafts(quick_run, recipes):
    # mode draft_model under the draft model's recipe and config; draft costs at k >= 1; calibration kind draft
    result, out = quick_run
    assert result.exit_code == EX_OK, result.output
    target, draft = recipes["micro-t"], recipes["micro-d"]
    table = CostTable.parse(out.read_text())
    assert table.key.modes == ("decode", "draft_model", "verify") and table.key.recipe == target.id
    want = serve_table_key(target.id, target.config, _settings(), "none", DRAFT_MODEL_MODES, BOX,
                           draft_model_config(draft))
    assert table.key == want and table.meta["draft_model"] == draft.id
    assert table.kmax == 2 and all(c.draft_s > 0 for c in table.cells if c.k > 0)
    assert table.meta["method"].startswith("in-loop")  # no energy source: timed inside running decodes
    cal = AcceptanceCalibration.parse(calibration_path(out).read_text())
    assert cal.drafter == draft_model_drafter_key(draft) and cal.drafter.kind == "draft"


def test_the_measured_boot_takes_it_with_its_draft_model_only(quick_run, recipes):
    # the same draft model boots; another draft model, or the MTP drafter, is refused with 78 naming the fields
    _, out = quick_run
    target = recipes["micro-t"]
    assert isinstance(_boot(out, target, recipes["micro-d"]), SpecCostState)
    with pytest.raises(BootError) as other:
        _boot(out, target, recipes["micro-e"])
    fields = [line.strip().split(":")[0] for line in other.value.lines[1:]]
    assert other.value.code == EX_CONFIG and fields == ["plan_digests.draft_model", "drafter"]
    with pytest.raises(BootError) as mtp:
        _boot(out, target, None)
    fields = [line.strip().split(":")[0] for line in mtp.value.lines[1:]]
    assert mtp.value.code == EX_CONFIG and fields == ["plan_digests.draft_mtp", "drafter"]


def test_the_default_path_is_the_draft_models_own(recipes, tmp_path, monkeypatch):
    # tables/<box>/<recipe>.draft-<draft model>.toml, where the measured boot looks for it; --no-calibrate: no
    # calibration beside it
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["bench", "spec-cost", "--recipe", "micro-t", "--draft-model", "micro-d",
                                      "--no-calibrate", *FAST])
    assert result.exit_code == EX_OK, result.output
    out = tmp_path / "tables" / BOX / "micro-t.draft-micro-d.toml"
    assert out.relative_to(tmp_path) == boot.default_table(BOX, "micro-t", "micro-d")
    assert CostTable.parse(out.read_text()).key.modes == ("decode", "draft_model", "verify")
    assert not calibration_path(out).exists()


def test_windows_time_the_draft_models_step(recipes, tmp_path, monkeypatch):
    # where no step can be timed in the loop, the windows time the draft model's step from its restored state
    from met.bench.loop_sweep import NothingTimed

    def ends_at_once(*args, **kwargs):
        raise NothingTimed("the decode at width 1, depth 0 ran no full step to time (its requests ended at once)")

    monkeypatch.setattr("met.bench.loop_sweep.measure_joint_in_loop", ends_at_once)
    out = tmp_path / "t.toml"
    result = CliRunner().invoke(app, ["bench", "spec-cost", "--recipe", "micro-t", "--draft-model", "micro-d",
                                      "--no-calibrate", *FAST, "--out", str(out)])
    assert result.exit_code == EX_OK, result.output
    table = CostTable.parse(out.read_text())
    assert "steps_per_window_min" in table.meta and table.meta["catchup_rows"].startswith("2 before a draft")
    assert table.key.modes == ("decode", "draft_model", "verify") and all(c.draft_s > 0 for c in table.cells if c.k)


@pytest.mark.parametrize("flags, code, message", [
    (["--draft-model", "micro-d", "--drafter", "dflash"], 2, "a table prices one drafter"),
    (["--draft-model", "micro-wide"], EX_DATAERR, "must share its target's vocabulary"),
    (["--draft-model", "no-such-draft"], EX_NOINPUT, "no-such-draft"),
])
def test_a_draft_model_that_cannot_draft_for_the_recipe_is_refused(recipes, tmp_path, flags, code, message):
    # with DFlash: usage; another vocabulary: 65 naming both; missing: 66; nothing is written either way
    out = tmp_path / "t.toml"
    result = CliRunner().invoke(app, ["bench", "spec-cost", "--recipe", "micro-t", *flags, *FAST, "--out", str(out)])
    assert result.exit_code == code and message in result.output, result.output
    assert not out.exists()


def test_a_table_of_another_draft_model_at_out_is_refused(quick_run, recipes, tmp_path):
    # --out holds micro-d's table: measuring micro-e there, or the MTP drafter, is refused before measuring (78)
    _, made = quick_run
    out = tmp_path / "t.toml"
    out.write_text(made.read_text())
    for flags, theirs in ((["--draft-model", "micro-e"], "recipe 'micro-t', draft model 'micro-e';"),
                          ([], "recipe 'micro-t';")):
        result = CliRunner().invoke(app, ["bench", "spec-cost", "--recipe", "micro-t", *flags, "--no-calibrate",
                                          *FAST, "--out", str(out)])
        assert result.exit_code == EX_CONFIG, result.output
        assert "draft model 'micro-d'" in result.stderr and f"this run measures box_class '{BOX}', " \
            f"{theirs}" in result.stderr
    assert out.read_text() == made.read_text()


def test_tables_check_compares_a_draft_models_files_with_draft_model(quick_run, recipes):
    # with --draft-model micro-d: 0 for both files; another draft model: 78; none named: the embedded draft model the
    # file names (0), and where that one is not here, 78 saying to name one
    _, out = quick_run
    check = ["tables", "check", "--recipe", "micro-t", "--box-class", BOX]
    for path in (out, calibration_path(out)):
        assert CliRunner().invoke(app, [*check, "--draft-model", "micro-d", str(path)]).exit_code == EX_OK
        other = CliRunner().invoke(app, [*check, "--draft-model", "micro-e", str(path)])
        assert other.exit_code == EX_CONFIG, other.output
        assert CliRunner().invoke(app, [*check, str(path)]).exit_code == EX_OK
    weights = recipes["micro-d"].weights
    weights.rename(weights.with_suffix(".gone"))
    try:
        for path in (out, calibration_path(out)):
            unnamed = CliRunner().invoke(app, [*check, str(path)])
            assert unnamed.exit_code == EX_CONFIG and "--draft-model" in unnamed.stderr, unnamed.output
    finally:
        weights.with_suffix(".gone").rename(weights)
    other = CliRunner().invoke(app, [*check, "--draft-model", "micro-e", str(out)])
    assert "plan_digests.draft_model" in other.stderr or "'draft_model'" in other.stderr


def test_tables_show_names_the_draft_model_and_warns_of_an_mtp_calibration(quick_run, recipes, tmp_path):
    # the header names the draft model; its plan is marked per width; an MTP calibration beside it is warned of
    from boot_tables import calibration

    from met.engine.identity import mtp_drafter_key

    _, out = quick_run
    shown = CliRunner().invoke(app, ["tables", "show", str(out), "--calibration", str(calibration_path(out))],
                               env={"COLUMNS": "200"})
    assert shown.exit_code == EX_OK, shown.output
    assert f"draft model '{recipes['micro-d'].id}'" in shown.stdout and "◀" in shown.stdout
    assert "warning" not in shown.stderr
    mtp = tmp_path / "mtp.calibration.toml"
    mtp.write_text(calibration(mtp_drafter_key(recipes["micro-t"])).to_toml())
    warned = CliRunner().invoke(app, ["tables", "show", str(out), "--calibration", str(mtp)])
    assert warned.exit_code == EX_OK and "the table measured the draft model micro-d@" in warned.stderr


def test_a_folder_drafted_by_a_folder_of_its_tokenizer_gets_draft_cells(recipes, tmp_path):
    # a checkpoint has no MTP module, but with a draft model its table holds draft cells and a calibration fitted
    # in its own tokenizer; a draft model of another tokenizer (the byte recipes') is refused with 65
    pytest.importorskip("transformers")
    from checkpoint_helpers import checkpoint

    from met.model.recipes import hf_recipe

    checkpoint(tmp_path / "target")
    checkpoint(tmp_path / "small", seed=1, num_hidden_layers=1)
    out = tmp_path / "t.toml"
    result = CliRunner().invoke(app, ["bench", "spec-cost", "--model", str(tmp_path / "target"), "--draft-model",
                                      str(tmp_path / "small"), "--quick", "--quiet", "--energy", "none",
                                      "--box-class", BOX, "--out", str(out)])
    assert result.exit_code == EX_OK, result.output
    table = CostTable.parse(out.read_text())
    draft = hf_recipe(tmp_path / "small")
    assert table.key.modes == ("decode", "draft_model", "verify") and table.kmax == 2
    assert table.meta["draft_model"] == draft.id
    assert AcceptanceCalibration.parse(calibration_path(out).read_text()).drafter == draft_model_drafter_key(draft)
    refused = CliRunner().invoke(app, ["bench", "spec-cost", "--model", str(tmp_path / "target"), "--draft-model",
                                       "micro-d", *FAST, "--out", str(tmp_path / "u.toml")])
    assert refused.exit_code == EX_DATAERR and "draft model micro-d has tokenizer byte" in refused.stderr, \
        refused.output
    assert not (tmp_path / "u.toml").exists()


def test_a_joint_sweep_writes_each_drafters_table_with_one_plain_step_and_one_set_of_copies(recipes, tmp_path):
    # --with-mtp --draft-model: both tables, keyed as their own runs key them, sharing k = 0 and the copy cells while
    # each drafter's k >= 1 cells and calibration are its own
    result = CliRunner().invoke(app, ["bench", "spec-cost", "--recipe", "micro-t", "--draft-model", "micro-d",
                                      "--with-mtp", "--quick", "--quiet", "--energy", "none", "--box-class", BOX,
                                      "--out", str(tmp_path)])
    assert result.exit_code == EX_OK, result.output
    mtp = CostTable.parse((tmp_path / "micro-t.toml").read_text())
    small = CostTable.parse((tmp_path / "micro-t.draft-micro-d.toml").read_text())
    assert mtp.key.modes == ("decode", "draft_mtp", "verify") and small.key.modes == ("decode", "draft_model", "verify")
    assert "draft_model" not in mtp.meta and small.meta["draft_model"].startswith("micro-d@")
    assert "mtp, draft" in mtp.meta["joint_sweep"] and mtp.meta["joint_sweep"] == small.meta["joint_sweep"]
    assert mtp.verify_cells and mtp.verify_cells == small.verify_cells
    plain = {c.n: c for c in mtp.cells if c.k == 0}
    assert plain == {c.n: c for c in small.cells if c.k == 0}
    drafted = [(a.draft_s, b.draft_s) for a, b in zip(mtp.cells, small.cells) if a.k]
    assert drafted and all(a > 0 and b > 0 for a, b in drafted) and any(a != b for a, b in drafted)
    kinds = {AcceptanceCalibration.parse(calibration_path(tmp_path / f).read_text()).drafter.kind
             for f in ("micro-t.toml", "micro-t.draft-micro-d.toml")}
    assert kinds == {"mtp", "draft"}


@pytest.mark.parametrize("flags, message", [
    (["--with-mtp"], "drop --with-mtp"),  # nothing to time it beside
    (["--with-mtp", "--draft-model", "micro-d", "--recipe", "micro-d"], "no MTP module to time beside"),
    (["--with-mtp", "--draft-model", "micro-d", "--out", "x.toml"], "names a file"),
])
def test_a_joint_sweep_is_refused_without_a_second_drafter_an_mtp_module_or_a_folder(recipes, tmp_path, flags,
                                                                                      message):
    args = ["bench", "spec-cost", "--recipe", "micro-t", *FAST, "--no-calibrate"]
    flags = [str(tmp_path / f) if f == "x.toml" else f for f in flags]
    result = CliRunner().invoke(app, args + (flags if "--out" in flags else flags + ["--out", str(tmp_path)]))
    assert result.exit_code == 2 and message in result.output.replace("\n", " "), result.output
    assert not list(tmp_path.glob("*.toml"))
