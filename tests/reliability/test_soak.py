"""The serve soak, short: `benchmarks/soak.py --serve` with 8 clients for 4 s on the serve tests' micro model.

A real server process on 127.0.0.1 under good, malformed, oversized, unauthorised and abandoned
requests, drafting with MTP (whose catch-up once ran past the context when a deep sequence and a
new long prompt drafted together) and with prompt lookup (the tenant-scoped shared cache): no 5xx,
no crashed tick, every greedy output equal to its solo greedy output, no KV slot held after the
load drains, shared-lookup tokens within budget, a clean SIGTERM shutdown.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("spec", ["mtp", "prompt-lookup"])
def test_short_soak_holds(tmp_path, spec):
    out = tmp_path / "soak.md"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--serve", "--model", "micro",
                          "--spec", spec, "--clients", "8", "--seconds", "4", "--max-tokens", "24", "--out", str(out)],
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(out.with_suffix(".json").read_text())
    assert set(result["checks"].values()) == {0}, result["checks"]
    assert result["command"].startswith(f"python3 benchmarks/soak.py --serve --model micro --spec {spec} --clients 8")
    statuses = result["requests_by_status"]
    for status in ("200", "400", "401", "404", "413", "hung up"):  # every kind of request was made
        assert statuses.get(status), (status, statuses)
    assert result["good_outputs_compared"] >= 20 and result["differing"] == []
    assert result["kv_slots"]["free_after_drain"] == result["kv_slots"]["max_batch"] == 16
    held = result["shared_lookup"]
    if spec == "prompt-lookup":  # the cache filled up to its budget, no further (MTP does not use it)
        assert 0 < held["tokens_held_after_drain"] <= held["budget"]
    assert "| crashed engine ticks | 0 |" in out.read_text()
