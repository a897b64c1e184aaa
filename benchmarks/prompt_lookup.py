"""Per-proposal cost of met's prompt_lookup against the ngram reference and HF transformers' prompt-lookup generator.

The history is a realistic token stream: the bytes of this Python's stdlib sources (sorted by
path), as the byte-level met-tiny-py model sees them, so n-grams recur as they do in code. At each
history length L, every step times the three proposers on the same history (interleaved, order
rotated each step), then appends the stream's next token to all three; the table reports medians
over the steps. One run measures everything side by side.

    python3 benchmarks/prompt_lookup.py            # writes benchmarks/results/<box_class>/prompt_lookup.{md,json}
"""

import argparse
import gc
import json
import os
import platform
import shlex
import statistics
import sys
import sysconfig
import time
from pathlib import Path

import torch
import transformers
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

from met.engine.identity import box_class
from met.speculative import ngram
from met.speculative.prompt_lookup import LookupParams, PromptLookup

LENGTHS = [1_024, 8_192, 32_768, 131_072]
MAX_NGRAM = 3  # the same matched n-gram range for all three (HF matches n = MAX_NGRAM..1)
DRAFTS = 8  # the same copy length for all three: prompt_lookup's window is pinned to it
PL_INNER = 20  # prompt_lookup calls per timed sample: one call is ~1 us, near the timer's resolution
TORCH_THREADS = 1  # the proposer runs on the scheduler thread; more threads contend with other load on a small box


def stdlib_stream(num_tokens: int) -> list[int]:
    """Bytes of the stdlib's .py files, sorted by path, concatenated up to num_tokens."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = bytearray()
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        out += path.read_bytes()
        if len(out) >= num_tokens:
            return list(out[:num_tokens])
    raise SystemExit(f"the stdlib under {root} holds only {len(out)} bytes of source; need {num_tokens}")


def timed(call, inner: int = 1) -> tuple[float, object]:
    """Seconds per call of `inner` back-to-back calls, and the last call's result."""
    start = time.perf_counter()
    for _ in range(inner):
        result = call()
    return (time.perf_counter() - start) / inner, result


def measure(stream: list[int], ids: torch.Tensor, length: int, steps: int) -> dict:
    """Time the three proposers at one history length over `steps` steps; return medians and checks."""
    params = LookupParams(min_ngram=1, max_ngram=MAX_NGRAM, min_window=DRAFTS, initial_window=DRAFTS, max_window=DRAFTS)
    build_s, lookup = timed(lambda: PromptLookup(params, stream[:length]))
    history = stream[:length]
    hf = PromptLookupCandidateGenerator(
        num_output_tokens=DRAFTS, max_matching_ngram_size=MAX_NGRAM, max_length=len(stream) + 1
    )
    samples: dict[str, list[float]] = {"prompt_lookup": [], "ngram": [], "transformers": [], "extend": []}
    proposed = same_as_hf = 0
    for step in range(steps):
        end = length + step
        input_ids = ids[:, :end]  # input_ids: [1, end], a view, as HF's generate loop hands it over
        calls = {
            "prompt_lookup": (lambda: lookup.propose(), PL_INNER),
            "ngram": (lambda: ngram.propose(history, MAX_NGRAM, 1, DRAFTS), 1),
            "transformers": (lambda: hf.get_candidates(input_ids)[0], 1),
        }
        names = list(calls)
        names = names[step % 3 :] + names[: step % 3]  # rotate the order so no proposer always runs first
        results = {}
        for name in names:
            call, inner = calls[name]
            seconds, results[name] = timed(call, inner)
            samples[name].append(seconds)
        if results["prompt_lookup"] != results["ngram"]:
            raise SystemExit(f"prompt_lookup and ngram disagree at history length {end}: the index is wrong")
        hf_drafts = results["transformers"][0, end:].tolist()
        proposed += bool(results["prompt_lookup"])
        same_as_hf += hf_drafts == results["prompt_lookup"]
        token = stream[end]
        seconds, _ = timed(lambda: lookup.extend((token,)))
        samples["extend"].append(seconds)
        history.append(token)
    row = {f"{name}_us": statistics.median(values) * 1e6 for name, values in samples.items()}
    row.update(
        history_tokens=length,
        steps=steps,
        build_ms=build_s * 1e3,
        proposed_pct=100 * proposed / steps,
        same_as_transformers_pct=100 * same_as_hf / steps,
    )
    return row


def machine() -> dict:
    """What the figures were measured on."""
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "transformers": transformers.__version__,
        "load_average_at_start": os.getloadavg(),
    }


def render(command: str, info: dict, rows: list[dict], checks: list[dict]) -> str:
    """The results page: command, machine, table, checks."""
    lines = [
        "# prompt_lookup: per-proposal cost against ngram and HF transformers",
        "",
        f"Command: `{command}`",
        "",
        "Machine: " + ", ".join(f"{key} `{value}`" for key, value in info.items()),
        "",
        f"History: bytes of the stdlib's Python sources. Each proposer matches n-grams of 1..{MAX_NGRAM} tokens",
        f"(longest first) and copies up to {DRAFTS} tokens. Cost: median microseconds per proposal over the",
        "steps, the three measured on the same histories, interleaved. `extend` is prompt_lookup's cost to",
        "append one token to its index. HF's generator copies the *first* occurrence and rebuilds input_ids",
        "(torch.cat) on every call; met copies the *latest*, so their drafts can differ. torch runs on",
        f"{TORCH_THREADS} thread, as a proposer on the scheduler thread would: on a small, loaded box more",
        "threads contend with the other load and inflate HF's cost many times over, which would flatter met.",
        "",
        "| history tokens | prompt_lookup us | ngram us | transformers us | transformers / prompt_lookup "
        "| extend us/token | index build ms | steps with a draft % | same draft as HF % |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['history_tokens']:,} | {r['prompt_lookup_us']:.2f} | {r['ngram_us']:.1f} "
            f"| {r['transformers_us']:.1f} "
            f"| {r['transformers_us'] / r['prompt_lookup_us']:,.0f}x | {r['extend_us']:.2f} | {r['build_ms']:.1f} "
            f"| {r['proposed_pct']:.0f} | {r['same_as_transformers_pct']:.0f} |"
        )
    lines += ["", "Checks:", ""]
    lines += [f"- {'PASS' if c['ok'] else 'FAIL'}: {c['what']} (measured {c['value']:.2f})" for c in checks]
    return "\n".join(lines) + "\n"


def main() -> int:
    """Run the benchmark, print the table, write the results; exit 1 if a check fails."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500, help="proposals timed per history length")
    parser.add_argument("--out", type=Path, help="results folder (default: benchmarks/results/<box_class>/)")
    args = parser.parse_args()
    torch.set_num_threads(TORCH_THREADS)
    command = shlex.join(["python3", "benchmarks/prompt_lookup.py", *sys.argv[1:]])
    info = machine() | {"box_class": box_class("cpu", threads=TORCH_THREADS)}
    args.out = args.out or Path(__file__).parent / "results" / info["box_class"]
    stream = stdlib_stream(LENGTHS[-1] + args.steps)
    ids = torch.tensor([stream], dtype=torch.long)  # ids: [1, total tokens]
    rows = []
    gc.disable()  # as timeit does: a collection inside one sample would dwarf a 1 us call
    try:
        for length in LENGTHS:
            rows.append(measure(stream, ids, length, args.steps))
            print(f"measured {length:,} tokens", file=sys.stderr)
    finally:
        gc.enable()
    by_len = {r["history_tokens"]: r for r in rows}
    flat = by_len[131_072]["prompt_lookup_us"] / by_len[1_024]["prompt_lookup_us"]
    speedup = by_len[32_768]["transformers_us"] / by_len[32_768]["prompt_lookup_us"]
    checks = [
        {"what": "prompt_lookup cost at 128k / at 1k <= 2", "value": flat, "ok": flat <= 2},
        {"what": "transformers / prompt_lookup cost at 32k >= 50", "value": speedup, "ok": speedup >= 50},
    ]
    page = render(command, info, rows, checks)
    print(page)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prompt_lookup.md").write_text(page)
    record = {"command": command, "machine": info, "max_ngram": MAX_NGRAM, "drafts": DRAFTS}
    record |= {"rows": rows, "checks": checks}
    (args.out / "prompt_lookup.json").write_text(json.dumps(record, indent=2) + "\n")
    return 0 if all(c["ok"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
