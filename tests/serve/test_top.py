"""`met top` against a live server, and the dashboard frame it shows."""

import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from typer.testing import CliRunner

from met.cli import app
from met.serve.report import snapshot_doc
from met.serve.tui import snapshot_problem
from met.speculative.snapshot import SchedulerSnapshot
from serve_helpers import serving


@contextmanager
def answering(body: bytes):
    """A non-met HTTP server on loopback that answers every GET with 200 and this body."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


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


@pytest.mark.parametrize("body, why", [
    (b"<html>hello</html>", "(not JSON: "),  # a web page
    (b"[1, 2]", "(a JSON array, not an object)"),  # was 'list' object has no attribute 'get'
    (b'{"not": "a snapshot"}', "(no tick, width, active"),  # was an empty dashboard and exit 0
    (b'{"tick": 1, "width": 0, "active": 0, "queued": 0, "mode": "idle", "depth": 0, "why": "", '
     b'"tokens_per_s": "fast", "drafts_proposed": 0, "drafts_accepted": 0, "emitted_tokens": 0}',
     '(tokens_per_s is "fast")'),  # every key, one of them a string where render formats a number
    (b'{"tick": 1, "width": 0, "active": 0, "queued": 0, "mode": "idle", "depth": 0, "why": "", '
     b'"tokens_per_s": 1' + b"0" * 400 + b', "drafts_proposed": 0, "drafts_accepted": 0, "emitted_tokens": 0}',
     "(tokens_per_s is 1000"),  # a JSON integer no float holds: render raised OverflowError (exit 1)
])
def test_top_against_a_server_that_is_not_met_exits_69(body, why):
    # the URL answers 200, but with no met snapshot: say so, exit 69 as for an unreachable server
    with answering(body) as url:
        r = CliRunner().invoke(app, ["top", "--url", url, "--once"])
    assert r.exit_code == 69, r.output
    assert f"{url} did not answer a met snapshot {why}" in r.output


def test_top_invalid_url_exits_69():
    # httpx.InvalidURL is no httpx.HTTPError: it was exit 1 with a traceback
    r = CliRunner().invoke(app, ["top", "--url", "http://256.0.0.1:80", "--once"])
    assert r.exit_code == 69 and "invalid URL http://256.0.0.1:80 (Invalid IPv4 address" in r.output, r.output


def test_every_snapshot_the_server_sends_is_one():
    # the idle snapshot and a busy one, as GET /v1/snapshot serialises them, pass the check
    busy = SchedulerSnapshot(tick=3, width=2, active=2, mode="mtp", depth=2, why="ladder", drafts_proposed=4,
                             drafts_accepted=3, accepted_at=(2, 1), proposed_at=(2, 2), finished=(("stop", 1),),
                             joules_per_token=0.5, energy_j=1.0)
    for snap in (SchedulerSnapshot(), busy):
        assert snapshot_problem(snapshot_doc(snap)) is None


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


@pytest.mark.parametrize("interval", ["inf", "1e308", "0.01", "nan"])
def test_an_interval_out_of_range_exits_2(interval):
    # inf overflowed time.sleep after the first frame; below 0.1 s polls the server too hard
    result = CliRunner().invoke(app, ["top", "--url", "http://127.0.0.1:9", "--interval", interval])
    assert result.exit_code == 2 and "--interval" in result.output


def _frame(doc: dict, source: str = "", width: int = 100) -> str:
    from rich.console import Console

    from met.serve.tui import render

    console = Console(width=width, record=True)
    console.print(render(doc, source))
    return console.export_text()


def test_dashboard_prints_text_from_the_server_and_the_url_as_it_is():
    # strings from the snapshot or the URL are text, not rich markup: '[/]' raised MarkupError (a traceback
    # from met top), and an IPv6 URL's '[fe80::1]' was taken for a style and vanished from the title
    doc = {**snapshot_doc(SchedulerSnapshot()), "spec": "[/]", "mode": "[bold]x", "finished": {"[/]": 1}}
    text = _frame(doc, "http://[fe80::1]:8000")
    for words in ("http://[fe80::1]:8000", "spec      [/]", "[bold]x   planned depth 0", "[/] 1"):
        assert words in text, words


def test_dashboard_draws_any_counts_in_a_narrow_terminal():
    # a zero snapshot, a run's worth of huge counts, and per-position counts no met serve sends (accepted over
    # verified: the bar was 20 x the ratio long, a MemoryError at 10**9 of 1): all draw, at 20 columns too
    huge = SchedulerSnapshot(tick=2**62, width=16, active=16, max_batch=16, queued=2**40, mode="mtp", depth=4,
                             why="x" * 500, drafts_proposed=2**62, drafts_accepted=2**61, emitted_tokens=2**62,
                             accepted_at=(2**61,) * 16, proposed_at=(2**62,) * 16, tokens_per_s=1e300,
                             planned_tokens_per_s=1e300, joules_per_token=1e-300, energy_j=1e300,
                             finished=(("stop", 2**62),), failed_ticks=2**40)
    odd = {**snapshot_doc(SchedulerSnapshot()), "accepted_at": [10**9, -3], "proposed_at": [1, 1]}
    for doc in (snapshot_doc(SchedulerSnapshot()), snapshot_doc(huge), odd):
        for width in (20, 100):
            assert "met" in _frame(doc, "http://127.0.0.1:8000", width)
    bars = [line for line in _frame(odd).splitlines() if "100000000" in line]
    assert bars and bars[0].count("█") == 20


def test_dashboard_of_an_idle_tick_under_an_energy_table_shows_no_nan():
    # an idle tick publishes no plan (joules_per_token null) while the run's priced joules stay: the energy
    # line read "nan J/token planned"
    doc = {**snapshot_doc(SchedulerSnapshot(spec="mtp/measured", energy_j=3.5)), "joules_per_token": None}
    text = _frame(doc)
    assert "nan" not in text and "no step planned this tick, 3.5 J as the table prices the steps run" in text
