"""`met top` against a live server, and the serve's keys file."""

import pytest
from typer.testing import CliRunner

from met.cli import app
from met.serve.auth import KeyRing, KeysFileError, read_keys_file
from serve_helpers import serving


def test_top_once_shows_the_snapshot(model):
    # one frame of a running server's snapshot; a key-protected server without --api-key is a clear error
    with serving(model, "mtp", keys={"k": "t"}) as srv:
        ok = CliRunner().invoke(app, ["top", "--url", srv.url, "--api-key", "k", "--once"])
        denied = CliRunner().invoke(app, ["top", "--url", srv.url, "--once"])
    assert ok.exit_code == 0 and "spec" in ok.output and "mtp" in ok.output and "acceptance" in ok.output
    assert denied.exit_code == 69 and "401" in denied.output and "--api-key" in denied.output


def test_top_unreachable_exits_69():
    # nothing listens on port 9 of loopback
    r = CliRunner().invoke(app, ["top", "--url", "http://127.0.0.1:9", "--once"])
    assert r.exit_code == 69 and "cannot reach" in r.output


def test_keys_file_maps_keys_to_tenants(tmp_path):
    # comments and blank lines skipped; each key's tenant; unknown keys have none
    f = tmp_path / "keys"
    f.write_text("# key tenant\nsk-a alice\n\nsk-b bob  # ops\n")
    ring = KeyRing(read_keys_file(f))
    assert (ring.tenant_of("sk-a"), ring.tenant_of("sk-b"), ring.tenant_of("sk-c"), ring.tenant_of(None)) == \
        ("alice", "bob", None, None)
    assert KeyRing({}).tenant_of(None) == "default"  # no keys configured: open, one tenant


@pytest.mark.parametrize("text, words", [
    ("sk-a\n", "expected `KEY TENANT`"),  # a key without a tenant
    ("sk-a alice\nsk-a bob\n", "given twice"),  # one key, two tenants
    ("sk-a al/ice\n", "tenant"),  # a tenant name that is not a plain name
    ("# nothing\n", "no keys"),  # an empty file would silently open the server
])
def test_bad_keys_files_are_refused(tmp_path, text, words):
    f = tmp_path / "keys"
    f.write_text(text)
    with pytest.raises(KeysFileError, match=words):
        read_keys_file(f)


def test_dashboard_frame_shows_depth_why_acceptance_and_energy():
    # the fields an operator reads: mode, planned depth and why, per-position acceptance, J/token when measured
    from rich.console import Console

    from met.serve.tui import render

    doc = {"spec": "mtp/measured", "mode": "mtp", "depth": 2, "why": "k=2: the most tokens/J", "width": 3,
           "queued": 1, "accepted_at": [5, 3], "proposed_at": [6, 5], "joules_per_token": 0.02, "energy_j": 3.5,
           "tokens_per_s": 41.0, "finished": {"length": 2}, "failed_ticks": 1}
    console = Console(width=100, record=True)
    console.print(render(doc))
    text = console.export_text()
    for words in ("planned depth 2", "k=2: the most tokens/J", "83.3%", "0.02 J/token", "41.0 tok/s",
                  "queued 1", "failed ticks 1"):
        assert words in text, words
