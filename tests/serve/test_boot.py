"""`met serve --spec-cost-model measured` at boot: a table of another key exits 78 naming its field; a matching one
serves and says what it plans; bad options exit 2; a DFlash drafter is checked before anything starts."""

import pytest
from typer.testing import CliRunner

from met.cli import app
from met.engine.identity import mtp_drafter_key
from met.model.dflash import DflashConfig, DflashDrafter, save_drafter
from met.speculative.spec_cost import LookupBin

from boot_tables import BOX, calibration, serve_key, table, with_fields


@pytest.fixture
def recipe(micro_embedded):
    """An embedded recipe of a micro model, in a temporary weights folder."""
    return micro_embedded[1]


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
    result = _serve(tmp_path, with_fields(serve_key(recipe), box_class="nvidia-h200x1"), mtp_drafter_key(recipe))
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


def test_cli_warns_at_boot_of_a_narrow_a_quick_or_an_old_table(recipe, tmp_path, monkeypatch):
    # a table that matches its key is served, but the operator hears, one line each, what may make it plan poorly
    from datetime import datetime, timedelta, timezone

    monkeypatch.setattr("met.serve.server.run", lambda *a, **k: 0)
    fresh = {"when": datetime.now(timezone.utc).replace(microsecond=0).isoformat()}
    quiet = _serve(tmp_path, serve_key(recipe), mtp_drafter_key(recipe), "--max-batch", "4", meta=fresh)
    assert quiet.exit_code == 0 and "warning" not in quiet.stderr, quiet.output  # widths 1 and 4 cover 4 slots
    narrow = _serve(tmp_path, serve_key(recipe), mtp_drafter_key(recipe), "--max-batch", "16", meta=fresh)
    assert narrow.exit_code == 0, narrow.output
    assert "measured widths up to 4 and this serve batches up to 16 sequences" in narrow.stderr
    assert narrow.stderr.count("warning") == 1
    quick = _serve(tmp_path, serve_key(recipe), mtp_drafter_key(recipe), "--max-batch", "4", meta=fresh | {"quick": True})
    assert "is a --quick table" in quick.stderr and quick.stderr.count("warning") == 1
    old = {"when": (datetime.now(timezone.utc) - timedelta(days=45)).replace(microsecond=0).isoformat()}
    stale = _serve(tmp_path, serve_key(recipe), mtp_drafter_key(recipe), "--max-batch", "4", meta=old)
    assert "was measured 45 days ago" in stale.stderr and "--table-max-age 30 days" in stale.stderr
    assert stale.stderr.count("warning") == 1
    later = _serve(tmp_path, serve_key(recipe), mtp_drafter_key(recipe), "--max-batch", "4", "--table-max-age", "60",
                   meta=old)
    assert later.exit_code == 0 and "warning" not in later.stderr, later.output


def test_serve_help_states_the_default_temperature():
    # the first curl without a temperature samples at 1.0: the help says so, and how to get greedy text
    text = " ".join(CliRunner().invoke(app, ["serve", "--help"]).output.split())
    assert "samples at temperature 1.0" in text and '"temperature": 0 for greedy text' in text


def test_the_request_schema_states_the_default_temperature():
    # /openapi.json describes the field clients send: its default and how to get greedy text
    from met.serve.schemas import Sampled

    field = Sampled.model_json_schema()["properties"]["temperature"]
    assert field["default"] == 1.0 and "1.0 when not sent" in field["description"] and "0 for greedy" in \
        field["description"]
