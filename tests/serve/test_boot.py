"""Boot under --spec-cost-model measured: every key mismatch exits 78 naming its field; bad files exit 65."""


import pytest
import torch
from typer.testing import CliRunner

from met.cli import app
from met.engine.identity import MODES, RunSettings, mtp_drafter_key, serve_table_key
from met.model.dflash import DflashConfig, DflashDrafter, save_drafter
from met.serve import boot
from met.serve.boot import BootError, MeasuredBoot
from met.speculative.spec_cost import (AcceptanceCalibration, Cell, CostTable, DrafterKey, LookupBin,
                                       PositionPrior, SpecCostState, TableKey)

BOX = "test-box"


@pytest.fixture
def recipe(micro_embedded):
    """An embedded recipe of a micro model, in a temporary weights folder."""
    return micro_embedded[1]


def _settings() -> RunSettings:
    return RunSettings("float32", "cpu", torch.get_num_threads())


def serve_key(recipe) -> TableKey:
    """This serve's key, as `met serve --box-class test-box --energy none` computes it."""
    return serve_table_key(recipe.id, recipe.config, _settings(), "none", MODES, BOX)


def table(key: TableKey, meta: dict | None = None, draft_s: float = 0.001) -> CostTable:
    joules = key.energy_source != "none"
    cells = [Cell(n, k, 0.01 + 0.002 * k, draft_s * k, 1.0 + k if joules else None, 0.1 * k if joules else None)
             for n in (1, 4) for k in range(3)]
    return CostTable(key, cells, meta or {})


def calibration(drafter: DrafterKey, lookup: tuple = (), shared_lookup: tuple = ()) -> AcceptanceCalibration:
    return AcceptanceCalibration(drafter, 0.6, 400, (), [PositionPrior(1, 0.7, 200), PositionPrior(2, 0.5, 100)],
                                 lookup=lookup, shared_lookup=shared_lookup)


def _with(key: TableKey, **changes) -> TableKey:
    fields = {"box_class": key.box_class, "recipe": key.recipe, "energy_source": key.energy_source,
              "plan_digests": dict(key.plan_digests), "schema": key.schema} | changes
    return TableKey(**fields)


def _variants(key: TableKey) -> dict[str, TableKey]:
    digests = dict(key.plan_digests)
    return {
        "schema": _with(key, schema=2),  # written by another schema version
        "box_class": _with(key, box_class="nvidia-h200x1"),  # another class of box
        "recipe": _with(key, recipe="micro-t@0000000000000000"),  # other weights
        "energy_source": _with(key, energy_source="nvml"),  # measured with a meter this serve does not plan with
        "plan_digests.verify": _with(key, plan_digests=digests | {"verify": "0" * 16}),  # another plan
        "plan_digests.draft_mtp": _with(key, plan_digests={m: d for m, d in digests.items() if m != "draft_mtp"}),
    }


@pytest.mark.parametrize("field", ["schema", "box_class", "recipe", "energy_source", "plan_digests.verify",
                                   "plan_digests.draft_mtp", "drafter"])
def test_every_mismatch_refuses_with_78_naming_its_field(recipe, field):
    # one field differs: exit status 78, one mismatch listed, the field named with both values
    key = serve_key(recipe)
    drafter = mtp_drafter_key(recipe)
    t = table(_variants(key).get(field, key))
    cal = calibration(DrafterKey("mtp", "other-drafter", "abc") if field == "drafter" else drafter)
    with pytest.raises(BootError) as err:
        boot.check(t, cal, key, drafter, 0.1)
    assert err.value.code == 78
    assert len(err.value.lines) == 2 and err.value.lines[1].strip().startswith(f"{field}:")
    assert "this serve has" in err.value.lines[1]


def test_all_mismatches_are_listed_at_once(recipe):
    # box, recipe and drafter all differ: three lines, one each
    key = serve_key(recipe)
    t = table(_with(key, box_class="other", recipe="other@1"))
    with pytest.raises(BootError) as err:
        boot.check(t, calibration(DrafterKey("mtp", "x", "y")), key, mtp_drafter_key(recipe), 0.1)
    fields = [line.strip().split(":")[0] for line in err.value.lines[1:]]
    assert fields == ["box_class", "recipe", "drafter"]


def test_matching_files_boot(recipe, tmp_path):
    # the bench's key and drafter: a SpecCostState that plans
    key = serve_key(recipe)
    (tmp_path / "t.toml").write_text(table(key).to_toml())
    (tmp_path / "t.calibration.toml").write_text(calibration(mtp_drafter_key(recipe)).to_toml())
    state = boot.boot_measured(recipe, _settings(), MeasuredBoot(tmp_path / "t.toml", tmp_path / "t.calibration.toml",
                                                                 0.1, "none", BOX))
    assert isinstance(state, SpecCostState) and state.plan(1).k in (0, 1, 2)


@pytest.mark.parametrize("problem", ["missing", "invalid", "calibration missing"])
def test_missing_or_invalid_files_exit_65(recipe, tmp_path, problem):
    # nothing is approximated: a table or calibration that cannot be read is refused with 65
    key = serve_key(recipe)
    t, c = tmp_path / "t.toml", tmp_path / "t.calibration.toml"
    if problem != "missing":
        t.write_text(table(key).to_toml() if problem == "calibration missing" else "schema = 1\n[key]\n")
    c.write_text(calibration(mtp_drafter_key(recipe)).to_toml()) if problem != "calibration missing" else None
    with pytest.raises(BootError) as err:
        boot.boot_measured(recipe, _settings(), MeasuredBoot(t, c, 0.1, "none", BOX))
    assert err.value.code == 65 and ("calibration" in err.value.lines[0]) == (problem == "calibration missing")


def test_default_paths_are_the_bench_defaults():
    # tables/<box_class>/<recipe>.toml and the calibration beside it
    t = boot.default_table("cpu-x-2t", "met-tiny-py")
    assert str(t) == "tables/cpu-x-2t/met-tiny-py.toml"
    assert str(boot.default_calibration(t)) == "tables/cpu-x-2t/met-tiny-py.calibration.toml"


def _serve(tmp_path, key, drafter, *extra, meta=None, draft_s=0.001, cal=None):
    (tmp_path / "t.toml").write_text(table(key, meta, draft_s).to_toml())
    (tmp_path / "t.calibration.toml").write_text((cal or calibration(drafter)).to_toml())
    args = ["serve", "--model", "micro-t", "--spec", "mtp", "--spec-cost-model", "measured",
            "--spec-cost-table", str(tmp_path / "t.toml"), "--calibration", str(tmp_path / "t.calibration.toml"),
            "--box-class", BOX, "--energy", "none", "--port", "0", *extra]
    return CliRunner().invoke(app, args)


def test_cli_refuses_a_table_of_another_box_class_with_78(recipe, tmp_path, monkeypatch):
    # the operator's view: exit 78, the field, both values and what to do
    monkeypatch.setattr("met.serve.server.run", lambda *a, **k: pytest.fail("the server must not start"))
    result = _serve(tmp_path, _with(serve_key(recipe), box_class="nvidia-h200x1"), mtp_drafter_key(recipe))
    assert result.exit_code == 78, result.output
    assert "box_class: table has 'nvidia-h200x1', this serve has 'test-box'" in result.output
    assert "run met bench spec-cost here or pass --box-class" in result.output


def test_cli_boots_on_a_matching_table(recipe, tmp_path, monkeypatch):
    # the same command on a table of this key starts the server (stubbed here) and says what it plans
    started = []
    monkeypatch.setattr("met.serve.server.run", lambda app, host, port, level: started.append((host, port)) or 0)
    result = _serve(tmp_path, serve_key(recipe), mtp_drafter_key(recipe))
    assert result.exit_code == 0, result.output
    assert started == [("127.0.0.1", 0)] and "planning from" in result.output and "mtp/measured" in result.output
    assert "measured 20" not in result.output  # this table's [meta] does not say when it was measured
    assert "MTP drafts only (the calibration has no prompt-lookup bins)" in result.output  # what it weighs
    # as the serve plans: where drafts are cheap the table goes to k = 2, but the verify pools clamp width 16
    # to one draft
    cheap = _serve(tmp_path, serve_key(recipe), mtp_drafter_key(recipe), draft_s=0.0001)
    assert "width 1: k=2" in cheap.output and "width 16: k=1" in cheap.output, cheap.output
    result = _serve(tmp_path, serve_key(recipe), mtp_drafter_key(recipe), meta={"when": "2026-11-30T00:38:54Z"})
    assert result.exit_code == 0 and "planning from" in result.output
    assert "(measured 2026-11-30 00:38 UTC, " in result.output  # its age beside it: plans age with the box
    # a calibration with copy bins: the planner weighs copies, and with shared bins other requests' too
    own, shared = (LookupBin(1, 12, (0.5,), (100,)),), (LookupBin(2, 12, (0.5,), (100,)),)
    copying = _serve(tmp_path, serve_key(recipe), mtp_drafter_key(recipe),
                     cal=calibration(mtp_drafter_key(recipe), own)).output
    assert "weighing copies from each history (the calibration's" in copying
    both = _serve(tmp_path, serve_key(recipe), mtp_drafter_key(recipe),
                  cal=calibration(mtp_drafter_key(recipe), own, shared)).output
    assert "weighing copies from each history and from the tenant's other requests (" in both


def test_cli_bad_options_exit_2(recipe, tmp_path):
    keys_file = tmp_path / "keys"  # k1 belongs to tenant-a here: --api-key k1 beside it was silently re-tenanted
    keys_file.write_text("k1 tenant-a\n")
    # measured with a host drafter, an unknown spec: usage errors, nothing loaded
    r = CliRunner().invoke(app, ["serve", "--model", "micro-t", "--spec", "ngram", "--spec-cost-model", "measured"])
    assert r.exit_code == 2 and "calibrated drafter" in r.output
    assert CliRunner().invoke(app, ["serve", "--spec", "eagle"]).exit_code == 2
    for args, words in [(["--dtype", "int8"], "--dtype 'int8'"), (["--device", "bogus"], "--device 'bogus'"),
                        (["--threads", "100000"], "--threads"),  # each was a traceback, or a crash, at load
                        (["--drafter", "d.safetensors"], "--spec off would not use it"),  # was ignored
                        (["--max-len", "1"], "2..128 tokens"),  # a server that could serve nothing
                        (["--max-len", "5000"], "2..128 tokens"),  # past the model's context: was cut silently
                        (["--api-key", "k1", "--api-keys-file", str(keys_file)], "also in --api-keys-file")]:
        r = CliRunner().invoke(app, ["serve", "--model", "micro-t", "--spec", "off", *args])
        assert r.exit_code == 2 and words in r.output, r.output


def test_cli_serves_dflash_with_its_drafter_and_refuses_a_missing_or_foreign_one(recipe, tmp_path, monkeypatch):
    # --spec dflash loads the drafter before anything starts: 66 when there is none, 65 when it is another model's
    started = []
    monkeypatch.setattr("met.serve.server.run", lambda app, host, port, level: started.append(port) or 0)
    base = ["serve", "--model", "micro-t", "--spec", "dflash", "--port", "0"]
    r = CliRunner().invoke(app, [*base, "--drafter", str(tmp_path / "absent.safetensors")])
    assert r.exit_code == 66 and "no DFlash drafter at" in r.output and not started
    drafter = DflashDrafter(DflashConfig.for_target(recipe.config, block=4, ffn_dim=64))
    save_drafter(drafter, tmp_path / "ours.safetensors", recipe.id)
    save_drafter(drafter, tmp_path / "theirs.safetensors", "other@0000000000000000")
    r = CliRunner().invoke(app, [*base, "--drafter", str(tmp_path / "theirs.safetensors")])
    assert r.exit_code == 65 and "trained against other@0000000000000000" in r.output and not started
    r = CliRunner().invoke(app, [*base, "--drafter", str(tmp_path / "ours.safetensors")])
    assert r.exit_code == 0, r.output
    assert started == [0] and "spec dflash" in r.output
