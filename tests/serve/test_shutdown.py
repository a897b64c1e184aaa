"""SIGTERM drains: a request in flight when the signal arrives completes whole, and the process exits 0; a second Ctrl-C
ends what is left with a 503 and exits 130."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
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


def test_a_second_ctrl_c_during_the_drain_ends_every_request_with_a_503_and_exits_130():
    # 2 slots, 3 streams of 100 tokens at 20 ms a step and a plain request: Ctrl-C starts the drain, a second
    # Ctrl-C ends them all now; each stream gets an error chunk and [DONE] (was: connections cut mid-chunk), the
    # plain request a 503, the log no traceback (was 5) and the exit status is 130 (was 0, as a whole drain)
    proc = subprocess.Popen([sys.executable, "-c", SERVER.format(here=str(HERE), tests=str(HERE.parent))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=os.environ | {"PYTHONUNBUFFERED": "1"})
    try:
        line = proc.stdout.readline()
        assert line.startswith("PORT"), line + proc.stderr.read()
        url = f"http://127.0.0.1:{int(line.split()[1])}/v1/completions"
        body = {"model": "micro-test", "prompt": "hello", "max_tokens": 100, "temperature": 0}
        got: dict[int, object] = {}

        def stream(i: int) -> None:
            with httpx.stream("POST", url, json=body | {"stream": True}, timeout=30) as r:
                got[i] = [raw.removeprefix("data: ") for raw in r.iter_lines() if raw]

        def plain() -> None:
            got[3] = httpx.post(url, json=body, timeout=30)

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(3)] + [threading.Thread(target=plain)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        for t in threads:
            t.join(30)
        for i in range(3):
            assert got[i][-1] == "[DONE]", got[i][-3:]
            assert json.loads(got[i][-2])["error"]["code"] == "shutting_down", got[i][-2]
        assert got[3].status_code == 503 and got[3].json()["error"]["code"] == "shutting_down"
        assert proc.wait(timeout=30) == 130
        err = proc.stderr.read()
        assert "Traceback" not in err and "ended 4 requests in flight" in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
