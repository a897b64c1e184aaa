"""`met bench policies` with an EAGLE-3 head: the eagle-* policies and the choices naming it draft with the head,
and greedy text stays plain's."""

import json

import pytest
from typer.testing import CliRunner

from policies_env import BOX, calibration, command_env, table
import met.bench.policies as pol
from eagle3_helpers import random_head, save_head
from met.bench.policies_cli import _policy_names
from met.cli import app
from met.engine.identity import EAGLE_MODES, eagle_config, eagle_drafter_key, eagle_head, serve_table_key
from met.exit_codes import EX_CONFIG, EX_OK


@pytest.fixture
def eagle_env(monkeypatch, tmp_path, micro_recipe):
    """The command on the micro recipe in float64 with a random EAGLE-3 head and hand-made tables: the MTP one and
    the head's."""
    settings, args = command_env(monkeypatch, tmp_path, micro_recipe)
    head = save_head(tmp_path / "head", random_head(micro_recipe.config, layers=(0, 1, 1)))
    identity = eagle_head(head, micro_recipe.config)
    key = serve_table_key(micro_recipe.id, micro_recipe.config, settings, "none", EAGLE_MODES, BOX,
                          eagle_config(identity))
    (tmp_path / "e.toml").write_text(table(key).to_toml())
    (tmp_path / "e.calibration.toml").write_text(calibration(eagle_drafter_key(identity)).to_toml())
    return tmp_path, head, args


def test_cli_runs_the_eagle_policies_with_identical_outputs(eagle_env):
    # the head's fixed and measured policies and the choice beside MTP at every --quick concurrency; greedy outputs
    # identical to off's; the head and its table in the report and the command that repeats the run
    tmp_path, head, args = eagle_env
    names = ["off", "eagle-fixed-2", "eagle-measured", "mtp+eagle-measured"]
    result = CliRunner().invoke(app, [*args, "--eagle", str(head), "--eagle-table", str(tmp_path / "e.toml"),
                                      "--policies", ",".join(names)])
    assert result.exit_code == EX_OK, result.output
    doc = json.loads((tmp_path / "out" / "policies.json").read_text())
    assert {(r["policy"], r["concurrency"]) for r in doc["rows"]} == {(p, c) for p in names for c in (1, 2, 4)}
    assert doc["outputs_identical"] and doc["meta"]["eagle_head"].startswith("head@")
    assert f"--eagle {head} --eagle-table {tmp_path / 'e.toml'}" in doc["meta"]["command"]
    drafted = [r for r in doc["runs"] if r["policy"] == "eagle-fixed-2"]
    assert all(r["proposed"] > 0 for r in drafted)  # the random head drafts, and its drafts are verified away
    assert "EAGLE-3 head: `head@" in (tmp_path / "out" / "policies.md").read_text()


def test_another_heads_table_is_refused_with_78(eagle_env, micro_recipe):
    # a head retrained (other weights, same folder name) is another head: its old table is refused
    tmp_path, head, args = eagle_env
    save_head(head, random_head(micro_recipe.config, layers=(0, 1, 1), seed=9))
    result = CliRunner().invoke(app, [*args, "--eagle", str(head), "--eagle-table", str(tmp_path / "e.toml"),
                                      "--policies", "off,eagle-measured"])
    assert result.exit_code == EX_CONFIG and "plan_digests.draft_eagle" in result.output, result.output


def test_default_policies_with_a_head_add_its_own_and_the_choice():
    # --eagle alone: the eagle-* ones and mtp+eagle-measured; with --draft-model too: the three-way choice
    assert _policy_names(None, eagle=True) == [*pol.POLICIES, *pol.EAGLE_POLICIES, "mtp+eagle-measured"]
    both = _policy_names(None, draft_model=True, eagle=True)
    assert both == [*pol.POLICIES, *pol.DRAFT_POLICIES, *pol.EAGLE_POLICIES, "mtp+draft+eagle-measured"]
    assert pol.policy_drafters("draft+eagle-measured") == ("draft", "eagle")
    assert pol.policy_drafters("eagle-fixed-3") == ("eagle",) and pol.policy_drafters("fixed-3") == ("mtp",)


def test_an_eagle_policy_without_a_head_exits_2(eagle_env):
    _, _, args = eagle_env
    result = CliRunner().invoke(app, [*args, "--policies", "off,eagle-fixed-1"])
    assert result.exit_code == 2 and "pass --eagle FOLDER" in result.output
