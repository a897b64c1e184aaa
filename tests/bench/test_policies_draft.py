"""`met bench policies` with a draft model: the draft-* policies draft with it, and greedy text stays plain's."""

import json

import pytest
import torch
from typer.testing import CliRunner

from policies_env import BOX, calibration, command_env, table
import met.bench.policies as pol
from met.bench.policies_cli import _policy_names
from met.bench.policies_identity import mismatches
from met.bench.policies_report import summarise
from met.cli import app
from met.engine.identity import (DRAFT_MODEL_MODES, MODES, draft_model_config, draft_model_drafter_key,
                                 mtp_drafter_key, serve_table_key)
from met.exit_codes import EX_CONFIG, EX_DATAERR, EX_OK
from met.speculative.spec_capacity import DEFAULT_POOLS
from met.model.transformer import Transformer
from met.speculative.spec_cost import SpecCostState, TableKey

PROMPTS = ((104, 101, 108, 108, 111, 32, 119), (100, 101, 102, 32, 102, 40, 41, 58), (97,) * 12, (120, 121))


def near(model: Transformer, std: float) -> Transformer:
    """A copy of model with normal(0, std) noise on every weight: it drafts many of model's tokens, not all."""
    torch.manual_seed(3)
    other = Transformer(model.cfg).double()
    other.load_state_dict(model.state_dict())
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn_like(p) * std)
    return other.eval()


def test_draft_policies_draft_with_the_draft_model_and_leave_greedy_text_plain(model):
    # a near copy drafts: some drafts are accepted, the rest verified away, and every output equals off's; the
    # draft-* runs' steps are the draft model's (mode draft), none of them the MTP module's
    key = TableKey(BOX, "micro@t", "none", {m: "0" * 16 for m in DRAFT_MODEL_MODES})
    drafter = draft_model_drafter_key(type("R", (), {"name": "small", "digest": "s"})())
    state = SpecCostState(table(key), calibration(drafter), 0.1, key, drafter)
    mtp_key = TableKey(BOX, "micro@t", "none", {m: "1" * 16 for m in MODES})
    mtp_drafter = mtp_drafter_key(type("R", (), {"name": "micro", "digest": "t"})())
    mtp = SpecCostState(table(mtp_key), calibration(mtp_drafter), 0.1, mtp_key, mtp_drafter)
    names = ["off", "fixed-2", *pol.DRAFT_POLICIES]  # the choice between MTP and the draft model among them
    factories = pol.policy_factories(names, model.cfg.mtp_depth, DEFAULT_POOLS, mtp, {}, draft_model=True,
                                     draft_state=state)
    runs = pol.run_all(model, "micro@t", factories, pol.Workload(PROMPTS, 12, (1, 4), 1),
                       draft_model=near(model, 0.05))
    assert mismatches(runs) == [] and all(o.tokens for r in runs for o in r.outputs)
    fixed = [r for r in runs if r.policy == "draft-fixed-4"]
    assert all(0 < r.accepted < r.proposed for r in fixed), [(r.accepted, r.proposed) for r in fixed]
    for r in runs:
        modes = {mode for mode, *_ in r.steps}
        if r.policy.startswith("draft-fixed-"):
            assert "draft" in modes and "mtp" not in modes and r.proposed > 0, (r.policy, r.steps)
        if r.policy == "fixed-2":
            assert "mtp" in modes and "draft" not in modes
    deepest = {r.policy: max(k for _, _, k, _, _ in r.steps) for r in runs if r.concurrency == 1}
    assert deepest["draft-fixed-1"] == 1 and deepest["draft-fixed-4"] == 4
    rows = {(r.policy, r.concurrency) for r in summarise(runs, None)}
    assert rows == {(p, c) for p in names for c in (1, 4)}


def test_a_model_drafting_for_itself_has_every_draft_accepted(model):
    # the draft model is the target: each draft is the target's own greedy token
    factories = pol.policy_factories(["off", "draft-fixed-3"], model.cfg.mtp_depth, DEFAULT_POOLS, None, {},
                                     draft_model=True)
    runs = pol.run_all(model, "micro@t", factories, pol.Workload(PROMPTS, 12, (1, 2), 1), draft_model=model)
    drafted = [r for r in runs if r.policy == "draft-fixed-3"]
    assert mismatches(runs) == [] and all(r.proposed > 0 and r.accepted == r.proposed for r in drafted)


def test_draft_policies_need_a_draft_model_and_draft_measured_its_table():
    with pytest.raises(ValueError, match="drafts with a draft model"):
        pol.policy_factories(["draft-fixed-1"], 4, DEFAULT_POOLS, None, {})
    with pytest.raises(ValueError, match="the draft model's cost table and calibration"):
        pol.policy_factories(["draft-measured"], 4, DEFAULT_POOLS, None, {}, draft_model=True)
    # the recipe's MTP module is not needed to draft with a draft model
    assert set(pol.policy_factories(["off", "draft-fixed-2"], 0, DEFAULT_POOLS, None, {}, draft_model=True)) == \
        {"off", "draft-fixed-2"}


def test_the_draft_policies_run_by_default_only_with_a_draft_model():
    assert _policy_names(None) == list(pol.POLICIES)
    assert _policy_names(None, draft_model=True) == [*pol.POLICIES, *pol.DRAFT_POLICIES]
    assert _policy_names("off,draft-fixed-2") == ["off", "draft-fixed-2"]


# --- the command -------------------------------------------------------------------------------


@pytest.fixture
def cli_env(monkeypatch, tmp_path, micro_recipe):
    """The command on the micro recipe in float64, drafted for by itself (every name resolves to it), with hand-made
    tables: the MTP one and the draft model's."""
    settings, args = command_env(monkeypatch, tmp_path, micro_recipe)
    draft = serve_table_key(micro_recipe.id, micro_recipe.config, settings, "none", DRAFT_MODEL_MODES, BOX,
                            draft_model_config(micro_recipe))
    (tmp_path / "d.toml").write_text(table(draft).to_toml())
    (tmp_path / "d.calibration.toml").write_text(calibration(draft_model_drafter_key(micro_recipe)).to_toml())
    return tmp_path, args


def test_cli_runs_the_draft_policies_with_identical_outputs(cli_env):
    # every named policy at every --quick concurrency; outputs identical (the check covers the draft-* runs);
    # the draft model and its table are in the report and the command that repeats the run
    tmp_path, args = cli_env
    names = ["off", "measured", "draft-fixed-2", "draft-measured"]
    result = CliRunner().invoke(app, [*args, "--draft-model", "micro", "--draft-table", str(tmp_path / "d.toml"),
                                      "--policies", ",".join(names)])
    assert result.exit_code == EX_OK, result.output
    doc = json.loads((tmp_path / "out" / "policies.json").read_text())
    assert {(r["policy"], r["concurrency"]) for r in doc["rows"]} == {(p, c) for p in names for c in (1, 2, 4)}
    assert doc["outputs_identical"] and doc["meta"]["draft_model"].startswith("micro-random@")
    assert doc["meta"]["draft_table"] == str(tmp_path / "d.toml")
    assert f"--draft-model micro --draft-table {tmp_path / 'd.toml'}" in doc["meta"]["command"]
    drafted = [r for r in doc["runs"] if r["policy"] == "draft-fixed-2"]
    assert all(r["proposed"] > 0 and r["accepted"] == r["proposed"] for r in drafted)  # it drafts for itself
    assert "Draft model: `micro-random@" in (tmp_path / "out" / "policies.md").read_text()


def test_cli_a_draft_policy_without_a_draft_model_is_a_usage_error(cli_env):
    _, args = cli_env
    result = CliRunner().invoke(app, [*args, "--policies", "off,draft-fixed-1"])
    assert result.exit_code == 2 and "pass --draft-model" in result.output, result.output


def test_cli_draft_measured_refuses_the_mtp_table_with_78(cli_env):
    # the MTP drafter's table as the draft model's: its draft step was never measured, its calibration another's
    tmp_path, args = cli_env
    result = CliRunner().invoke(app, [*args, "--draft-model", "micro", "--draft-table", str(tmp_path / "t.toml"),
                                      "--policies", "off,draft-measured"])
    assert result.exit_code == EX_CONFIG, result.output
    assert "plan_digests.draft_model: table has (not measured)" in result.output and "drafter:" in result.output
    assert not (tmp_path / "out").exists()


def test_cli_a_draft_model_of_another_tokenizer_exits_65(cli_env, tmp_path_factory):
    pytest.importorskip("transformers")
    from checkpoint_helpers import checkpoint

    tmp_path, args = cli_env
    folder = tmp_path_factory.mktemp("hf") / "small-llama"
    checkpoint(folder, num_hidden_layers=1)
    result = CliRunner().invoke(app, [*args, "--draft-model", str(folder), "--policies", "off,draft-fixed-1"])
    assert result.exit_code == EX_DATAERR and "has tokenizer hf-" in result.output, result.output
