"""`met serve` options it checks before the model loads: --log-level (2) and whether it can listen on --host:--port (69)."""

import socket

import pytest
from fastapi import FastAPI
from typer.testing import CliRunner

from met.cli import app
from met.model.recipes import Recipe
from met.serve import server


@pytest.fixture
def no_load(monkeypatch):
    """Any model load or server start fails the test: these errors come before both."""
    monkeypatch.setattr(Recipe, "load", lambda *a, **k: pytest.fail("the model must not load"))
    monkeypatch.setattr("met.serve.server.run", lambda *a, **k: pytest.fail("the server must not start"))


@pytest.fixture
def listening():
    """A port of 127.0.0.1 another server already listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_unknown_log_level_exits_2_naming_the_levels(no_load):
    # uvicorn's KeyError was exit 1 with a traceback after the model loaded
    r = CliRunner().invoke(app, ["serve", "--spec", "off", "--log-level", "bogus"])
    assert r.exit_code == 2 and "'bogus' is not one of critical, error, warning, info, debug, trace" in r.output


def test_log_level_is_passed_to_uvicorn(micro_embedded, monkeypatch):
    # a valid level, in any case, reaches server.run
    levels = []
    monkeypatch.setattr("met.serve.server.run", lambda app, host, port, level: levels.append(level) or 0)
    r = CliRunner().invoke(app, ["serve", "--model", "micro-t", "--spec", "off", "--port", "0", "--log-level", "DEBUG"])
    assert r.exit_code == 0, r.output
    assert levels == ["DEBUG"]


@pytest.mark.parametrize("host, words", [
    ("256.1.1.1", "cannot listen on 256.1.1.1:0: the host does not resolve"),  # no such address
    ("192.0.2.1", "cannot listen on 192.0.2.1:0: not an address of this machine; pass --host"),  # TEST-NET-1
])
def test_a_host_it_cannot_listen_on_exits_69(micro_embedded, no_load, host, words):
    # was uvicorn's own status 3, after the model loaded
    r = CliRunner().invoke(app, ["serve", "--model", "micro-t", "--spec", "off", "--host", host, "--port", "0"])
    assert r.exit_code == 69 and words in r.output, r.output


def test_a_port_in_use_exits_69_before_the_model_loads(micro_embedded, no_load, listening):
    # another server holds the port: say so with host:port and what to do, in milliseconds not after a load
    r = CliRunner().invoke(app, ["serve", "--model", "micro-t", "--spec", "off", "--port", str(listening)])
    assert r.exit_code == 69, r.output
    assert f"error: cannot listen on 127.0.0.1:{listening}: the address is already in use" in r.output
    assert "pass another --port" in r.output


def test_a_port_taken_while_the_model_loads_is_a_bind_error(listening):
    # check_bind passed, then another server took the port: uvicorn's exit 3 becomes BindError (69 in the command)
    with pytest.raises(server.BindError, match=f"127.0.0.1:{listening}: the address is already in use"):
        server.run(FastAPI(), "127.0.0.1", listening, "critical")


def test_check_bind_accepts_a_free_port_and_leaves_it_free():
    # port 0 and loopback always bind; the check holds nothing afterwards
    server.check_bind("127.0.0.1", 0)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server.check_bind("127.0.0.1", port)
    with socket.socket() as again:
        again.bind(("127.0.0.1", port))


def test_lookup_min_ngram_reaches_the_scheduler(micro_embedded, monkeypatch):
    # --lookup-min-ngram sets the shortest match of the serve's proposers and of its shared cache
    from met.serve.app import Service

    built, build = [], Service.build
    monkeypatch.setattr(Service, "build", lambda *a, **k: built.append(build(*a, **k)) or built[-1])
    monkeypatch.setattr("met.serve.server.run", lambda *a, **k: 0)
    r = CliRunner().invoke(app, ["serve", "--model", "micro-t", "--spec", "prompt-lookup", "--port", "0",
                                 "--lookup-min-ngram", "3"])
    assert r.exit_code == 0, r.output
    assert built[0].scheduler.min_ngram == 3 and built[0].scheduler.shared.params.min_ngram == 3
    r = CliRunner().invoke(app, ["serve", "--spec", "prompt-lookup", "--lookup-min-ngram", "0"])
    assert r.exit_code == 2 and "--lookup-min-ngram" in r.output


def test_dflash_serve_verifies_the_rungs_widths(micro_embedded, monkeypatch, tmp_path):
    # --spec dflash with a 16-token drafter: a single stream drafts the rung's 16 (the MTP pools verified 4)
    from types import SimpleNamespace

    from met.engine.proposer import Proposer
    from met.engine.requests import QueueSink, Request, SeqState
    from met.engine.textstream import TextStream
    from met.model.dflash import DflashConfig, DflashDrafter, save_drafter
    from met.serve.app import Service

    _, recipe = micro_embedded
    save_drafter(DflashDrafter(DflashConfig.for_target(recipe.config, block=16, ffn_dim=64)),
                 tmp_path / "block16.safetensors", recipe.id)
    built, build = [], Service.build
    monkeypatch.setattr(Service, "build", lambda *a, **k: built.append(build(*a, **k)) or built[-1])
    monkeypatch.setattr("met.serve.server.run", lambda *a, **k: 0)
    r = CliRunner().invoke(app, ["serve", "--model", "micro-t", "--spec", "dflash", "--port", "0",
                                 "--drafter", str(tmp_path / "block16.safetensors")])
    assert r.exit_code == 0, r.output
    policy = built[0].scheduler.policy
    seq = SeqState(Request("a", (1, 2, 3), 100), QueueSink(), 0, Proposer("off", (1, 2, 3)), TextStream())
    plan = policy.plan(SimpleNamespace(length=lambda slot: 3, max_len=128), [seq])
    assert (plan.depths, plan.why) == ((16,), "dflash:single")


def test_dflash_serve_refuses_the_mtp_lift(micro_embedded, no_load):
    # --lift-wide-tier lifts the MTP pools; --spec dflash sizes its own, so the pair is a bad option, before a load
    r = CliRunner().invoke(app, ["serve", "--model", "micro-t", "--spec", "dflash", "--lift-wide-tier"])
    assert r.exit_code == 2 and "--lift-wide-tier" in r.output and "DFlash rung" in r.output, r.output


@pytest.mark.parametrize(("dtype", "spec", "warned"), [("bfloat16", "prompt-lookup", True),
                                                        ("bfloat16", "off", False), ("float32", "prompt-lookup", False)])
def test_the_boot_lines_warn_of_speculation_in_half_precision(micro_embedded, monkeypatch, dtype, spec, warned):
    # bf16's verify rounds otherwise than a one-token step: greedy text can change (measured on an H200)
    monkeypatch.setattr("met.serve.server.run", lambda *a, **k: 0)
    r = CliRunner().invoke(app, ["serve", "--model", "micro-t", "--spec", spec, "--dtype", dtype, "--port", "0"])
    assert r.exit_code == 0, r.output
    assert (f"warning: --spec {spec} in bfloat16: greedy text can differ" in r.stderr) is warned
