"""`met top` against a live server, and the dashboard frame it shows."""

from typer.testing import CliRunner

from met.cli import app
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
