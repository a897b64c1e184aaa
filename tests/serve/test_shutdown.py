"""SIGTERM drains: a request in flight when the signal arrives completes whole, and the process exits 0."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

HERE = Path(__file__).parent
SERVER = """
import sys, torch
sys.path[:0] = [{here!r}, {tests!r}]  # serve_helpers, and random_models beside conftest.py
torch.set_num_threads(1)
from random_models import micro_model
from serve_helpers import MODEL, Slow
from met.engine.runner import ModelRunner
from met.engine.scheduler import Scheduler
from met.serve import server
from met.serve.app import Service, create_app
sched = Scheduler(ModelRunner(micro_model(), 2), Slow(), MODEL + "@test")
app = create_app(Service(sched, (MODEL,)))
code = server.run(app, "127.0.0.1", 0, "warning",
                  on_started=lambda s: print("PORT", server.bound_port(s), flush=True))
print("FINISHED", dict(sched.cell.latest().finished), flush=True)
sys.exit(code)
"""


def test_sigterm_lets_the_stream_in_flight_finish_and_exits_0():
    # 40 tokens at 20 ms a step; SIGTERM after the first chunk: every token still arrives, then [DONE], exit 0
    proc = subprocess.Popen([sys.executable, "-c", SERVER.format(here=str(HERE), tests=str(HERE.parent))], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=os.environ | {"PYTHONUNBUFFERED": "1"})
    try:
        line = proc.stdout.readline()
        assert line.startswith("PORT"), line + proc.stderr.read()
        url = f"http://127.0.0.1:{int(line.split()[1])}/v1/completions"
        body = {"model": "micro-test", "prompt": "hello", "max_tokens": 40, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}
        events = []
        with httpx.stream("POST", url, json=body, timeout=30) as r:
            for raw in r.iter_lines():
                if not raw:
                    continue
                events.append(raw.removeprefix("data: "))
                if len(events) == 1:
                    proc.send_signal(signal.SIGTERM)
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["usage"]["completion_tokens"] == 40
        assert proc.wait(timeout=30) == 0
        assert "FINISHED {'length': 1}" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
