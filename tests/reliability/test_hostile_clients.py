"""The hostile run, scaled down: `benchmarks/hostile.py` with 100 slow connections, 2,000 pipelined unread requests,
20 concurrent 4 MiB bodies and 20 absurd tables against a real server process on 127.0.0.1.

/health answers within 1 s through the slow connections and past the connection cap, every slow connection is
closed at its head deadline, 1 MB of headers is a JSON 431, bodies past the budget are refused in OpenAI's shape
with memory bounded, /metrics and /v1/snapshot need the key, and SIGTERM with a stream in flight, a client that
reads nothing and slow connections drains within the stated drain time and exits 0, the stream ended by
[DONE] (finished, or the `shutting_down` chunk). Then the hostile files and tables: no case fails.
"""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_hostile_run_holds_scaled_down(tmp_path):
    out = tmp_path / "hostile.md"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "hostile.py"), "--slowloris", "100",
                          "--pipelined", "2000", "--bodies", "20", "--tables", "20", "--connections", "64",
                          "--drain-s", "8", "--head-timeout-s", "4", "--out", str(out)],
                         capture_output=True, text=True, timeout=900)
    report = json.loads(out.with_suffix(".json").read_text()) if out.with_suffix(".json").exists() else {}
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-3000:]
    totals = report["totals"]
    assert totals["cases"] == 8 and totals["failed"] == totals["unexpected_5xx"] == totals["crashes"] == \
        totals["lost"] == 0, totals
    drain = next(c for c in report["cases"] if c["case"].startswith("SIGTERM"))
    assert drain["exit"] == 0 and drain["drained_s"] <= 9.0 and drain["stream_end"][-1] == "[DONE]"
    assert "| crashes | 0 |" in out.read_text()
