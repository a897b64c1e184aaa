"""`met serve` with more than the MTP module: the planner choosing between MTP and a draft model (--spec
mtp+draft), and an EAGLE-3 head (--spec eagle); their boot lines and refusals."""

from typer.testing import CliRunner

from boot_tables import BOX, calibration, serve_key, settings, table
from eagle3_helpers import random_head, save_head
from met.cli import app
from met.engine.identity import (DRAFT_MODEL_MODES, draft_model_config, draft_model_drafter_key, mtp_drafter_key,
                                 serve_table_key)
from met.engine.policy import PolicyConfig, build_policy
from met.engine.policy_choice import DrafterChoicePolicy
from met.engine.policy_mtp import MtpLadderPolicy, MtpPlannedPolicy

MEASURED = ["--spec-cost-model", "measured", "--box-class", BOX, "--energy", "none", "--port", "0"]


def _tables(folder, recipe) -> None:
    """Both default tables of micro-t drafting for itself under tables/<box>/: the MTP module's and the draft model's."""
    where = folder / "tables" / BOX
    where.mkdir(parents=True)
    (where / "micro-t.toml").write_text(table(serve_key(recipe)).to_toml())
    (where / "micro-t.calibration.toml").write_text(calibration(mtp_drafter_key(recipe)).to_toml())
    key = serve_table_key(recipe.id, recipe.config, settings(), "none", DRAFT_MODEL_MODES, BOX,
                          draft_model_config(recipe))
    (where / "micro-t.draft-micro-t.toml").write_text(table(key, draft_s=0.0005).to_toml())
    (where / "micro-t.draft-micro-t.calibration.toml").write_text(calibration(draft_model_drafter_key(recipe)).to_toml())


def test_measured_with_a_draft_model_chooses_between_it_and_mtp_from_both_tables(micro_embedded, tmp_path,
                                                                                monkeypatch):
    recipe = micro_embedded[1]
    monkeypatch.setattr("met.serve.server.run", lambda *a, **k: 0)
    monkeypatch.chdir(tmp_path)
    _tables(tmp_path, recipe)
    r = CliRunner().invoke(app, ["serve", "--model", "micro-t", "--draft-model", "micro-t", *MEASURED])
    assert r.exit_code == 0, r.output
    assert "spec mtp+draft/measured" in r.stderr and "choosing every step among mtp, draft" in r.stderr
    assert f"planning mtp from tables/{BOX}/micro-t.toml" in r.stderr
    assert f"planning draft from tables/{BOX}/micro-t.draft-micro-t.toml" in r.stderr
    # the draft model's table missing: 65 naming it
    (tmp_path / "tables" / BOX / "micro-t.draft-micro-t.toml").unlink()
    r = CliRunner().invoke(app, ["serve", "--model", "micro-t", "--spec", "mtp+draft", "--draft-model", "micro-t",
                                 *MEASURED])
    assert r.exit_code == 65 and "micro-t.draft-micro-t.toml" in r.stderr, r.output


def test_mtp_plus_draft_needs_the_measured_planner_and_default_tables(micro_embedded):
    for args, words in ((["--spec", "mtp+draft", "--draft-model", "micro-t"], "pass --spec-cost-model measured"),
                        (["--spec", "mtp+draft", "--draft-model", "micro-t", "--spec-cost-model", "measured",
                          "--spec-cost-table", "x.toml"], "from its default path")):
        r = CliRunner().invoke(app, ["serve", "--model", "micro-t", *args])
        assert r.exit_code == 2 and words in r.output, r.output


def test_build_policy_composes_the_choice_and_eagle(micro_embedded):
    recipe = micro_embedded[1]
    from met.speculative.spec_cost import SpecCostState

    mtp = SpecCostState(table(serve_key(recipe)), calibration(mtp_drafter_key(recipe)), 0.1, serve_key(recipe),
                        mtp_drafter_key(recipe))
    key = serve_table_key(recipe.id, recipe.config, settings(), "none", DRAFT_MODEL_MODES, BOX,
                          draft_model_config(recipe))
    draft = SpecCostState(table(key), calibration(draft_model_drafter_key(recipe)), 0.1, key,
                          draft_model_drafter_key(recipe))
    choice = build_policy(PolicyConfig("mtp+draft"), 4, mtp, draft_model=True, draft_cost_state=draft)
    assert isinstance(choice, DrafterChoicePolicy) and choice.name == "mtp+draft/measured"
    assert [p.state for p in choice.planners] == [mtp, draft]
    eagle = build_policy(PolicyConfig("eagle", draft_depth=3), 0, eagle=True, environ={})
    assert isinstance(eagle, MtpLadderPolicy) and (eagle.drafter, eagle.num_drafts) == ("eagle", 3)
    planned = build_policy(PolicyConfig("eagle", draft_depth=3), 0, mtp, eagle=True)  # from the head's own table
    assert isinstance(planned, MtpPlannedPolicy) and (planned.drafter, planned.num_drafts) == ("eagle", 3)
    three = build_policy(PolicyConfig("mtp+draft+eagle"), 4, draft_model=True, eagle=True,
                         cost_states={"mtp": mtp, "draft": draft, "eagle": mtp})
    assert three.name == "mtp+draft+eagle/measured" and [p.drafter for p in three.planners] == ["mtp", "draft", "eagle"]
    for config, kw, words in ((PolicyConfig("mtp+draft"), {"draft_model": True}, "needs a model with an MTP module"),
                              (PolicyConfig("eagle"), {}, "needs a runner with an EAGLE-3 head"),
                              (PolicyConfig("mtp+eagle"), {"cost_states": {"mtp": mtp, "eagle": mtp}},
                               "eagle lacks a drafter or a table")):
        try:
            build_policy(config, 4, **kw)
        except ValueError as exc:
            assert words in str(exc)
        else:
            raise AssertionError(f"{config} {kw} was not refused")


def test_serve_spec_eagle_boots_with_a_head_and_refuses_without_one(micro_embedded, tmp_path, monkeypatch):
    model, recipe = micro_embedded
    monkeypatch.setattr("met.serve.server.run", lambda *a, **k: 0)
    head = save_head(tmp_path / "head", random_head(recipe.config, layers=(0, 1, 1)))
    r = CliRunner().invoke(app, ["serve", "--model", "micro-t", "--spec", "eagle", "--drafter", str(head),
                                 "--port", "0"])
    assert r.exit_code == 0, r.output
    assert "spec eagle" in r.stderr
    r = CliRunner().invoke(app, ["serve", "--model", "micro-t", "--spec", "eagle"])
    assert r.exit_code == 2 and "drafts with an EAGLE-3 head" in r.output
    r = CliRunner().invoke(app, ["serve", "--model", "micro-t", "--spec", "eagle", "--drafter", str(tmp_path / "no")])
    assert r.exit_code == 66, r.output


def _eagle_tables(folder, recipe, head) -> None:
    """The EAGLE-3 head's default table and calibration under tables/<box>/, keyed by the head's files."""
    from met.engine.identity import EAGLE_MODES, eagle_config, eagle_drafter_key, eagle_head

    where = folder / "tables" / BOX
    where.mkdir(parents=True, exist_ok=True)
    identity = eagle_head(head, recipe.config)
    key = serve_table_key(recipe.id, recipe.config, settings(), "none", EAGLE_MODES, BOX, eagle_config(identity))
    (where / f"micro-t.eagle-{head.name}.toml").write_text(table(key, draft_s=0.0005).to_toml())
    (where / f"micro-t.eagle-{head.name}.calibration.toml").write_text(
        calibration(eagle_drafter_key(identity)).to_toml())


def _booted_with_every_table(recipe, folder, monkeypatch):
    """(recipe, head): in folder, the default tables of micro-t's MTP module, its draft model (itself) and a random
    EAGLE-3 head saved there; the serve never listens."""
    monkeypatch.setattr("met.serve.server.run", lambda *a, **k: 0)
    monkeypatch.chdir(folder)
    _tables(folder, recipe)
    head = save_head(folder / "head", random_head(recipe.config, layers=(0, 1, 1)))
    _eagle_tables(folder, recipe, head)
    return recipe, head


def test_mtp_plus_eagle_boots_on_both_tables_and_refuses_another_heads(micro_embedded, tmp_path, monkeypatch):
    # both planners from their default tables, named in the banner; the table of another head: 78 naming its fields
    recipe, head = _booted_with_every_table(micro_embedded[1], tmp_path, monkeypatch)
    r = CliRunner().invoke(app, ["serve", "--model", "micro-t", "--spec", "mtp+eagle", "--drafter", str(head),
                                 *MEASURED])
    assert r.exit_code == 0, r.output
    assert "spec mtp+eagle/measured" in r.stderr and "choosing every step among mtp, eagle" in r.stderr
    assert f"planning mtp from tables/{BOX}/micro-t.toml" in r.stderr
    assert f"planning eagle from tables/{BOX}/micro-t.eagle-head.toml" in r.stderr
    r = CliRunner().invoke(app, ["serve", "--model", "micro-t", "--spec", "eagle", "--drafter", str(head), *MEASURED])
    assert r.exit_code == 0 and "spec eagle/measured" in r.stderr, r.output
    other = save_head(tmp_path / "other" / "head", random_head(recipe.config, layers=(0, 1, 1), seed=5))
    r = CliRunner().invoke(app, ["serve", "--model", "micro-t", "--spec", "mtp+eagle", "--drafter", str(other),
                                 *MEASURED])
    assert r.exit_code == 78 and "plan_digests.draft_eagle" in r.stderr and "drafter:" in r.stderr, r.output


def test_every_choice_names_its_drafters(micro_embedded, tmp_path, monkeypatch):
    # mtp+draft+eagle holds all three; draft+eagle needs no MTP module; each refuses a missing drafter with 2
    recipe, head = _booted_with_every_table(micro_embedded[1], tmp_path, monkeypatch)
    for spec in ("mtp+draft+eagle", "draft+eagle"):
        r = CliRunner().invoke(app, ["serve", "--model", "micro-t", "--spec", spec, "--drafter", str(head),
                                     "--draft-model", "micro-t", *MEASURED])
        assert r.exit_code == 0 and f"spec {spec}/measured" in r.stderr, r.output
        assert f"choosing every step among {spec.replace('+', ', ')}" in r.stderr
    for args, words in ((["--spec", "mtp+eagle", "--spec-cost-model", "measured"], "pass its folder"),
                        (["--spec", "draft+eagle", "--drafter", str(head), "--spec-cost-model", "measured"],
                         "give both or neither"),
                        (["--spec", "mtp+eagle", "--drafter", str(head), "--spec-cost-model", "static"],
                         "pass --spec-cost-model measured")):
        r = CliRunner().invoke(app, ["serve", "--model", "micro-t", *args])
        assert r.exit_code == 2 and words in r.output, r.output
