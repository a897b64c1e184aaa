"""What the cyclic collector's full passes cost a run of `met bench policies`' workload, with the heap settled and not.

After the model loads, the heap holds torch, the modules and the weights' Python objects; a full
(generation 2) pass of the collector scans all of them, and steps that allocate (the measured
planner's history index, its records) trigger such passes. met settles the heap at boot
(met.engine.heap.settle: collect, then gc.freeze()). This runs the policies benchmark's workload
(its held-out prompts x --max-tokens, one scheduler, --concurrency requests in flight) under each
--policies policy, alternately with the heap frozen and unfrozen (gc.unfreeze() puts boot's
objects back), interleaved over --repeats, and reports per policy and heap: tokens/s (median),
the collector's passes per run by generation and the seconds they took, and the frozen/unfrozen
tok/s ratio paired by repeat.

    python3 benchmarks/studies/gc_pause.py   # prints a markdown table; --out FILE also writes it
"""

import argparse
import gc
import os
import platform
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch

from met.bench import policies as pol
from met.bench.measured_boot import MeasuredBoot, boot_measured, default_calibration, default_table
from met.engine.heap import settle
from met.engine.identity import box_class, resolve_run
from met.engine.runner import ModelRunner
from met.model.recipes import embedded
from met.speculative.spec_capacity import DEFAULT_POOLS, VerifyPools

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: report.py
from report import publish


class Passes:
    """The collector's passes and their seconds, by generation, while counting."""

    def __init__(self) -> None:
        self.count: Counter[int] = Counter()
        self.seconds: Counter[int] = Counter()
        self._start = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.count[info["generation"]] += 1
            self.seconds[info["generation"]] += time.perf_counter() - self._start

    def reset(self) -> None:
        self.count.clear()
        self.seconds.clear()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="measured,fixed-2", help="comma-separated, as met bench policies")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    names = args.policies.split(",")
    recipe = embedded("met-tiny-py")
    settings = resolve_run(None, None)
    state = None
    if "measured" in names:
        table = default_table(box_class(settings.device), recipe.name)
        state = boot_measured(recipe, settings, MeasuredBoot(table, default_calibration(table), 0.1, "auto", None))
    factories = pol.policy_factories(names, recipe.config.mtp_depth, VerifyPools(DEFAULT_POOLS.tiers), state,
                                     os.environ, None)
    prompts = pol.heldout_workload_prompts(args.prompts)
    runner = ModelRunner(recipe.load(getattr(torch, settings.dtype), settings.device), args.concurrency)
    for name in names:  # warm-up
        pol.run_once(runner, factories[name](), recipe.id, prompts[: args.concurrency], 16)
    passes = Passes()
    rates: dict[tuple[str, bool], list[float]] = {}
    counts: dict[tuple[str, bool], Counter] = {}
    seconds: dict[tuple[str, bool], Counter] = {}
    frozen = 0
    for repeat in range(args.repeats):
        for heap in ((True, False) if repeat % 2 == 0 else (False, True)):
            if heap:
                frozen = settle()
            else:
                gc.unfreeze()
            for name in (names if repeat % 2 == 0 else names[::-1]):
                passes.reset()
                wall, _, _, sinks = pol.run_once(runner, factories[name](), recipe.id, prompts, args.max_tokens)
                rates.setdefault((name, heap), []).append(sum(s.end.completion_tokens for s in sinks) / wall)
                counts.setdefault((name, heap), Counter()).update(passes.count)
                seconds.setdefault((name, heap), Counter()).update(passes.seconds)
    gc.unfreeze()
    lines = ["# The collector's passes during the policies workload, heap settled (frozen) and not",
             "", f"`{' '.join(['python3', *sys.argv])}`: met-tiny-py on {settings.device} ({settings.dtype}, "
             f"{settings.threads} threads), {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; "
             f"{len(prompts)} prompts x {args.max_tokens} tokens at concurrency {args.concurrency}, {args.repeats} "
             f"repeats; {frozen} objects frozen by settle().", "",
             "| policy | heap | tok/s (median) | passes per run (gen 0 / 1 / 2) | their ms per run (gen 0 / 1 / 2) | frozen / unfrozen, "
             "paired median |", "|---|---|---:|---|---|---:|"]
    for name in names:
        for heap in (True, False):
            c, s = counts[name, heap], seconds[name, heap]
            per = " / ".join(f"{c[g] / args.repeats:.1f}" for g in range(3))
            ms = " / ".join(f"{1000 * s[g] / args.repeats:.1f}" for g in range(3))
            paired = ""
            if heap:
                paired = f"{statistics.median(a / b for a, b in zip(rates[name, True], rates[name, False])):.3f}"
            lines.append(f"| {name} | {'frozen' if heap else 'unfrozen'} | {statistics.median(rates[name, heap]):.1f} "
                         f"| {per} | {ms} | {paired} |")
    return publish(lines, args.out)


if __name__ == "__main__":
    sys.exit(main())
