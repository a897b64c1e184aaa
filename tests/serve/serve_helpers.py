"""Helpers of the serve tests: a random micro model and a real uvicorn server on 127.0.0.1 at an ephemeral port."""

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import uvicorn

from met.engine.policy import PolicyConfig, build_policy
from met.engine.policy_base import PlainPolicy
from met.engine.runner import ModelRunner
from met.engine.scheduler import Scheduler
from met.model.transformer import Transformer
from met.serve.app import Service, create_app
from met.serve.auth import KeyRing
from met.serve.server import bound_port

MODEL = "micro-test"


@dataclass
class Running:
    """A server under test: its base URL and the scheduler behind it."""

    url: str
    scheduler: Scheduler
    server: uvicorn.Server
    service: Service


@contextmanager
def serving(model: Transformer, spec: str = "off", max_batch: int = 4, keys: dict[str, str] | None = None,
            policy=None, shared=None) -> Iterator[Running]:
    """Run the app on 127.0.0.1:<ephemeral> in a background thread; stop and drain on exit."""
    runner = ModelRunner(model, max_batch)
    policy = policy or build_policy(PolicyConfig(spec), model.cfg.mtp_depth)
    scheduler = Scheduler(runner, policy, f"{MODEL}@test", shared=shared)
    service = Service(scheduler, (MODEL,), KeyRing(keys or {}))
    app = create_app(service)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(400):
        if server.started:
            break
        threading.Event().wait(0.025)
    assert server.started, "the test server did not start"
    try:
        yield Running(f"http://127.0.0.1:{bound_port(server)}", scheduler, server, service)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


class Slow(PlainPolicy):
    """Plain decode that takes 20 ms a step, so a client can leave (or a server be stopped) mid-request."""

    def draft(self, runner, seqs, plan):
        time.sleep(0.02)
        return super().draft(runner, seqs, plan)


def settled(scheduler: Scheduler, predicate, timeout: float = 2.0):
    """The latest snapshot once predicate(snapshot) holds (a response may reach its client before its snapshot)."""
    deadline = time.monotonic() + timeout
    while not predicate(snap := scheduler.cell.latest()) and time.monotonic() < deadline:
        time.sleep(0.01)
    return snap
