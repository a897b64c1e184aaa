"""Soak: hostile table files by the thousand (--fuzz N), or a real server on loopback under hostile load (--serve).

Run: python3 benchmarks/soak.py --fuzz 5000 [--out benchmarks/results/<box class>/fuzz.md]
     python3 benchmarks/soak.py --serve [--clients 64] [--seconds 60] [--spec prompt-lookup]
                                [--out benchmarks/results/<box class>/soak.md]

--fuzz N: N mutations of a valid cost table and N of a valid calibration (the strategies of
tests/reliability/table_mutations.py), plus the truncation of each at every byte, each judged by
table_oracle.judge: the library returns a table or raises TableParseError, `met tables check
--no-key` exits 0 or 65 with one line and no traceback, the two agree, and both agree with an
independent validity oracle. Reports the cases by outcome and by mutation; exit 1 if any failed.

--serve: a server process on 127.0.0.1 (benchmarks/soak_serve.py: the app `met serve` runs, two
API keys for two tenants, a shared-lookup budget small enough to be reached) and --clients
concurrent clients for --seconds, mixing good streamed and plain greedy requests with malformed
JSON, bad fields, unknown models, oversized prompts and bodies, wrong and missing keys, and
clients that hang up mid-stream or time out. Every completed greedy output is compared with its
solo greedy output, computed offline with the engine before the load. After the load drains it
reports requests by kind and status, 5xx, crashed engine ticks, differing outputs, KV slots and
shared-lookup tokens still held, and the server's RSS before and after; exit 1 if there was any
5xx or stream error, crashed tick, differing output, leaked slot, request answered other than its
kind must be, shared-lookup tokens over budget, or an unclean shutdown.
"""

import argparse
import asyncio
import json
import platform
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "reliability"))  # the fuzz strategies and judge


def fuzz(cases: int, seed: int) -> dict:
    """`cases` mutations of each valid file (and every truncation), judged; counts by outcome and mutation."""
    import tempfile

    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as seeded
    from table_mutations import mutations, valid_calibration, valid_table
    from table_oracle import judge

    outcomes, kinds, failures = Counter(), Counter(), []
    scratch = Path(tempfile.mkdtemp(prefix="met-fuzz-")) / "case.toml"

    def one(label: str, kind: str, data: bytes) -> None:
        try:
            outcome = judge(scratch, data)
        except AssertionError as exc:
            outcome = "FAILED"
            failures.append({"file": label, "mutation": kind, "bytes": data[:300].decode("latin-1"),
                             "why": str(exc)[:300]})
        outcomes[outcome] += 1
        kinds[f"{label}: {kind}", "accepted" if outcome == "accepted" else "failed" if outcome == "FAILED"
              else "refused"] += 1

    for label, base in (("table", valid_table()), ("calibration", valid_calibration())):
        for end in range(len(base) + 1):
            one(label, "truncate at every byte", base[:end])

        @seeded(seed)
        @settings(max_examples=cases, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(mutations(base))
        def run(case: tuple[str, bytes]) -> None:
            one(label, case[0].split(" ")[0], case[1])

        run()
    by_kind: dict[str, dict[str, int]] = {}
    for (kind, verdict), n in sorted(kinds.items()):
        by_kind.setdefault(kind, {})[verdict] = n
    return {"cases": sum(outcomes.values()), "outcomes": dict(outcomes.most_common()), "by_mutation": by_kind,
            "failures": failures[:20], "failed": len(failures)}


def fuzz_markdown(result: dict, command: str) -> str:
    lines = ["# soak --fuzz: hostile table and calibration files", "", f"Command: `{command}`", "",
             f"{result['cases']} cases; failed (not the documented refusal or acceptance): **{result['failed']}**", "",
             "| outcome | cases |", "|---|---:|"]
    lines += [f"| {o} | {n} |" for o, n in result["outcomes"].items()]
    lines += ["", "| file: mutation | refused | accepted (still valid) | failed |", "|---|---:|---:|---:|"]
    lines += [f"| {k} | {v.get('refused', 0)} | {v.get('accepted', 0)} | {v.get('failed', 0)} |"
              for k, v in result["by_mutation"].items()]
    return "\n".join(lines) + "\n"


def rss_mib(pid: int) -> float:
    """Resident memory of a process, MiB (/proc/PID/status VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def _port(proc: subprocess.Popen, timeout: float) -> int:
    found: list[int] = []

    def read() -> None:
        for line in proc.stdout:
            if line.startswith("port "):
                found.append(int(line.split()[1]))
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout)
    if not found:
        proc.kill()
        raise SystemExit(f"the soak server did not start within {timeout:.0f} s (exit {proc.poll()})")
    return found[0]


def _until_drained(url: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        snap = httpx.get(f"{url}/v1/snapshot", headers={"authorization": "Bearer key-alpha"}, timeout=30).json()
        if (snap["active"] == 0 and snap["queued"] == 0) or time.monotonic() > deadline:
            return snap
        time.sleep(0.1)


def serve_soak(args: argparse.Namespace) -> dict:
    """Start the server, load it, let it drain, read what it still holds, stop it; the result."""
    import torch
    from soak_serve import KEYS, Load, build_model, prompts_for, run_load

    from met.engine.generate import generate
    from met.engine.runner import ModelRunner
    from met.model.tokenizer import decode, encode

    config = {"model": args.model, "dtype": args.dtype, "spec": args.spec, "max_batch": args.max_batch,
              "threads": args.threads, "shared_budget": args.shared_budget}
    proc = subprocess.Popen([sys.executable, str(HERE / "soak_serve.py"), json.dumps(config)],
                            stdout=subprocess.PIPE, text=True)
    try:
        torch.set_num_threads(1)  # the server has the other core; two spinning threads here would slow both
        model, model_id = build_model(config)  # while the server boots: the solo greedy outputs
        runner = ModelRunner(model, 1)
        prompts = prompts_for(runner.max_len, args.max_tokens)
        solo = [decode(generate(runner, [encode(p)], args.max_tokens, "off")[0].tokens) for p in prompts]
        url = f"http://127.0.0.1:{_port(proc, 300)}"
        auth = {"authorization": f"Bearer {next(iter(KEYS))}"}  # with keys configured every path but /health needs one
        before = httpx.get(f"{url}/soak/state", headers=auth, timeout=30).json()
        if (before["model_id"], before["context"]) != (model_id, runner.max_len):  # weights replaced meanwhile
            raise SystemExit(f"the server loaded {before['model_id']}, the solo outputs came from {model_id}")
        key = next(iter(KEYS))
        body = {"model": "soak-model", "prompt": prompts[0], "max_tokens": args.max_tokens, "temperature": 0}
        warm = httpx.post(f"{url}/v1/completions", json=body, headers={"authorization": f"Bearer {key}"}, timeout=300)
        warm.raise_for_status()
        rss_before = rss_mib(proc.pid)
        load = Load(url, prompts, solo, args.max_tokens, before["context"])
        samples: list[tuple[float, float]] = []  # (seconds into the load, server RSS MiB)
        stop = threading.Event()
        t0 = time.monotonic()

        def sample() -> None:
            while not stop.wait(0.5):
                samples.append((time.monotonic() - t0, rss_mib(proc.pid)))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        asyncio.run(run_load(load, args.clients, args.seconds, args.seed))
        load_s = time.monotonic() - t0
        stop.set()
        sampler.join()
        snap = _until_drained(url, 120)
        state = httpx.get(f"{url}/soak/state", headers=auth, timeout=30).json()
        metrics = httpx.get(f"{url}/metrics", headers=auth, timeout=30).text
        rss_after = rss_mib(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            exit_code = proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            exit_code = "killed after 120 s"
    server_codes = {m[0]: int(float(m[1])) for m in re.findall(r'met_http_responses_total\{code="(\d+)"\} (\S+)',
                                                               metrics)}
    t = load.tally
    by_status = Counter()
    for (kind, outcome), n in t.statuses.items():
        by_status[str(outcome)] += n
    five = sum(n for code, n in server_codes.items() if code.startswith("5"))
    leaked = max(state["max_batch"] - state["free_slots"], state["running"], snap["active"])
    checks = {
        "5xx responses": five + sum(n for s, n in by_status.items() if s.startswith("5")),
        "stream errors": t.stream_errors,
        "crashed engine ticks": snap["failed_ticks"],
        "differing outputs": len(t.differing),
        "leaked KV slots": leaked,
        "unexpected responses": len(t.unexpected),
        "shared-lookup tokens over budget": max(0, state["shared_tokens"] - state["shared_budget"]),
        "unclean shutdown": int(exit_code != 0),
    }
    return {
        "config": config | {"clients": args.clients, "seconds": args.seconds, "max_tokens": args.max_tokens,
                            "seed": args.seed, "model_id": model_id},
        "load_seconds": round(load_s, 1),
        "requests": sum(by_status.values()),
        "requests_by_status": dict(by_status.most_common()),
        "requests_by_kind": {f"{k} -> {o}": n for (k, o), n in sorted(t.statuses.items(), key=str)},
        "server_responses_by_code": server_codes,
        "latency_s": {group: _percentiles(xs) for group, xs in t.seconds.items()},
        "finished_by_reason": snap["finished"],
        "good_outputs_compared": t.compared,
        "good_tokens": t.good_tokens,
        "good_tokens_per_s": round(t.good_tokens / load_s, 1),
        "kv_slots": {"max_batch": state["max_batch"], "free_after_drain": state["free_slots"],
                     "running_after_drain": state["running"], "active_in_snapshot": snap["active"]},
        "shared_lookup": {"tokens_held_after_drain": state["shared_tokens"], "budget": state["shared_budget"]},
        "server_rss_mib": {"before": rss_before,
                           "halfway": next((m for t, m in samples if t >= args.seconds / 2), rss_after),
                           "end_of_load": samples[-1][1] if samples else rss_after,
                           "peak": max([m for _, m in samples] + [rss_after]), "after": rss_after},
        "server_exit_code": exit_code,
        "unexpected": [list(u) for u in t.unexpected[:20]],
        "differing": [{"prompt": i, "solo": a, "served": b} for i, a, b in t.differing[:5]],
        "checks": checks,
    }


def _percentiles(xs: list[float]) -> dict:
    xs = sorted(xs)
    if not xs:
        return {}
    return {"n": len(xs), "p50": round(xs[len(xs) // 2], 3), "p99": round(xs[min(len(xs) - 1, len(xs) * 99 // 100)], 3),
            "max": round(xs[-1], 3)}


def serve_markdown(r: dict, command: str) -> str:
    c = r["config"]
    lines = ["# soak --serve: a real server on loopback under a bounded hostile load", "",
             f"Command: `{command}`", "",
             f"Server: {c['model_id']} ({c['dtype'] if c['model'] != 'micro' else 'float64'}), --spec {c['spec']}, "
             f"{c['max_batch']} KV slots, {c['threads']} torch thread(s), shared-lookup budget {c['shared_budget']} "
             f"tokens, two API keys (two tenants). Load: {c['clients']} concurrent clients for {c['seconds']} s "
             f"(drained in {r['load_seconds']} s), good requests greedy with max_tokens {c['max_tokens']}. "
             f"Machine: {platform.platform()}, python {platform.python_version()}.", "",
             "| check (must be 0) | count |", "|---|---:|"]
    lines += [f"| {name} | {n} |" for name, n in r["checks"].items()]
    lines += ["", f"{r['requests']} requests; {r['good_outputs_compared']} completed greedy outputs compared with "
              f"their solo greedy output; {r['good_tokens']} good tokens ({r['good_tokens_per_s']} tok/s).", "",
              "| status / outcome | requests |", "|---|---:|"]
    lines += [f"| {s} | {n} |" for s, n in r["requests_by_status"].items()]
    lat = r["latency_s"]
    lines += ["", "| latency, seconds (client side) | requests | p50 | p99 | max |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {name} | {x.get('n', 0)} | {x.get('p50', '-')} | {x.get('p99', '-')} | {x.get('max', '-')} |"
              for name, x in (("good requests, 200 (queued behind the load)", lat.get("served", {})),
                              ("refused requests, 4xx", lat.get("refused", {})))]
    lines += ["", "| request kind -> status | requests |", "|---|---:|"]
    lines += [f"| {k} | {n} |" for k, n in r["requests_by_kind"].items()]
    kv, sl, rss = r["kv_slots"], r["shared_lookup"], r["server_rss_mib"]
    lines += ["", f"After the load drained: {kv['free_after_drain']} of {kv['max_batch']} KV slots free, "
              f"{kv['running_after_drain']} sequences running; shared lookup holds {sl['tokens_held_after_drain']} "
              f"tokens (budget {sl['budget']}); finished by reason {r['finished_by_reason']}; server RSS "
              f"{rss['before']} MiB before the load, {rss['halfway']} MiB halfway, {rss['end_of_load']} MiB at the "
              f"end (peak {rss['peak']}), {rss['after']} MiB after it drained; exit status after SIGTERM "
              f"{r['server_exit_code']}."]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--fuzz", type=int, metavar="N", help="fuzz N mutations of each valid table file")
    mode.add_argument("--serve", action="store_true", help="soak a real server on loopback")
    ap.add_argument("--clients", type=int, default=64, help="concurrent clients (--serve)")
    ap.add_argument("--seconds", type=float, default=60.0, help="seconds of load (--serve)")
    ap.add_argument("--model", default="met-tiny-py", help="embedded recipe, or 'micro': the serve tests' model")
    ap.add_argument("--dtype", default="float32", help="model dtype of an embedded recipe (met serve's CPU default)")
    ap.add_argument("--spec", default="prompt-lookup", help="drafting: off, mtp, ngram, prompt-lookup")
    ap.add_argument("--max-batch", type=int, default=16, help="KV slots (met serve's default)")
    ap.add_argument("--max-tokens", type=int, default=32, help="max_tokens of the good requests")
    ap.add_argument("--threads", type=int, default=1, help="the server's torch threads")
    ap.add_argument("--shared-budget", type=int, default=4096, help="shared-lookup token budget of the server")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="write the markdown here and the JSON beside it (.json)")
    args = ap.parse_args()
    if not (1 <= args.clients <= 1024 and 0 < args.seconds <= 3600 and (args.fuzz is None or args.fuzz >= 0)):
        ap.error("--clients 1..1024, --seconds up to 3600, --fuzz >= 0")
    command = "python3 benchmarks/soak.py " + shlex.join(sys.argv[1:])
    if args.fuzz is not None:
        result = fuzz(args.fuzz, args.seed)
        text, failed = fuzz_markdown(result, command), result["failed"]
    else:
        result = serve_soak(args)
        text, failed = serve_markdown(result, command), sum(result["checks"].values())
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps({"command": command} | result, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
