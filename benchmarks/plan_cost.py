"""What the measured planner's own arithmetic costs per call, on the shipped table and calibration.

The planner runs in Python on the scheduler's thread: a first plan before each step (outside the
step's draft + verify seconds) and a replan after each MTP pass but the last (inside the draft).
This times both with SpecCostState.plan at widths 1, 4 and 16, every sequence with a previous
first draft, caught up, 100 tokens left: the best of 5 rounds of --calls calls, in microseconds.
Called again and again like that, the planner runs with warm caches; in the scheduler's loop each
call follows a model forward. So it then runs `met bench policies`' workload at concurrency 1
(its 16 held-out prompts x 128 tokens, the measured policy, --loop-runs runs after a warm-up) and
times every plan the policy makes there: the mean per call, and plans per step. And the measured policy's
whole plan (the capacity clamps and the copies it weighs as well) on snapshots of a run at concurrency 16.

    python3 benchmarks/plan_cost.py   # prints a markdown table; --out FILE also writes it
"""

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import torch

from met.bench import policies as pol
from met.bench.measured_boot import default_calibration, default_table
from met.engine.identity import box_class
from met.engine.requests import Request
from met.engine.runner import ModelRunner
from met.engine.scheduler import Scheduler
from met.model.recipes import embedded
from met.speculative.spec_capacity import DEFAULT_POOLS, VerifyPools
from met.speculative.spec_cost import AcceptanceCalibration, CostTable, SpecCostState
from met.speculative.spec_cost.plan import PlanSeq

from report import publish


def best_us(call, calls: int, rounds: int = 5) -> float:
    """The fastest of `rounds` rounds of `calls` calls, per call, in microseconds."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


class _Timed:
    """A SpecCostState as the measured policy uses it, timing each plan."""

    def __init__(self, state: SpecCostState) -> None:
        self.state, self.table = state, state.table
        self.calls, self.seconds = 0, 0.0

    def plan(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self.state.plan(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start
            self.calls += 1


def in_loop(state: SpecCostState, runs: int) -> tuple[float, float, float]:
    """Mean microseconds per plan, plans per step and the share of steps that drafted: the measured policy at c = 1."""
    torch.set_num_threads(1)
    recipe = embedded("met-tiny-py")
    model = recipe.load(torch.float32, "cpu")
    prompts = pol.heldout_workload_prompts(16)
    timed = _Timed(state)
    factory = pol.policy_factories(["measured"], recipe.config.mtp_depth, VerifyPools(DEFAULT_POOLS.tiers), timed,
                                   os.environ)["measured"]
    runner = ModelRunner(model, 1)
    pol.run_once(runner, factory(), recipe.id, prompts[:1], 32)  # warm-up
    timed.calls, timed.seconds, steps, drafting = 0, 0.0, 0, 0
    for _ in range(runs):
        _, _, recorder, _ = pol.run_once(runner, factory(), recipe.id, prompts, 128)
        steps += sum(recorder.shapes.values())
        drafting += sum(n for (_, _, k), n in recorder.shapes.items() if k)
    return timed.seconds / timed.calls * 1e6, timed.calls / steps, drafting / steps


class _Dropped:
    """A request's sink that keeps nothing: only the plans are timed."""

    def put(self, event) -> None:
        pass


def policy_plan_us(state: SpecCostState, width: int, ticks: tuple[int, ...] = (5, 20, 40)) -> list[tuple[int, float]]:
    """The measured policy's whole plan (clamps, copies weighed, SpecCostState.plan), per call in microseconds, on
    snapshots of a run of the policies workload at concurrency `width`: after each of `ticks` scheduler ticks,
    the best of 7 rounds of 300 plans of the sequences running then. (width running, us) per snapshot."""
    torch.set_num_threads(1)
    recipe = embedded("met-tiny-py")
    runner = ModelRunner(recipe.load(torch.float32, "cpu"), width)
    policy = pol.policy_factories(["measured"], recipe.config.mtp_depth, VerifyPools(DEFAULT_POOLS.tiers), state,
                                  os.environ)["measured"]()
    scheduler = Scheduler(runner, policy, recipe.id)
    for i, prompt in enumerate(pol.heldout_workload_prompts(16)):
        scheduler.submit(Request(str(i), tuple(prompt), 128), _Dropped())
    out = []
    for tick in range(1, max(ticks) + 1):
        scheduler.tick()
        if tick in ticks and scheduler.running:
            seqs = sorted(scheduler.running, key=lambda s: s.slot)
            out.append((len(seqs), best_us(lambda: policy.plan(runner, seqs), 300, rounds=7)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", type=Path, help="default: tables/<this box's class>/met-tiny-py.toml")
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--loop-runs", type=int, default=2, help="runs of the policies workload (0: skip)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    table_path = args.table or default_table(box_class("cpu", threads=1), "met-tiny-py")
    table = CostTable.parse(table_path.read_text())
    calibration = AcceptanceCalibration.parse(default_calibration(table_path).read_text())
    state = SpecCostState(table, calibration, 0.1, table.key, calibration.drafter)
    lines = ["# The measured planner's arithmetic per call", "",
             f"Command: `python3 {' '.join(sys.argv)}`; table `{table_path}`; `{platform.platform()}`, "
             f"Python {platform.python_version()}; best of 5 rounds of {args.calls} calls.", "",
             "| width | first plan us | replan after one draft us |", "|---:|---:|---:|"]
    for width in (1, 4, 16):
        first_seqs = [PlanSeq(previous=-0.3, behind=2, remaining=100)] * width
        again_seqs = [PlanSeq([-0.3], -0.3)] * width
        first = best_us(lambda: state.plan(first_seqs, table.kmax), args.calls)
        again = best_us(lambda: state.plan(again_seqs, table.kmax, 1), args.calls)
        lines.append(f"| {width} | {first:.1f} | {again:.1f} |")
    snapshots = policy_plan_us(state, 16)
    lines += ["", "The measured policy's whole plan (`MtpPlannedPolicy.plan`: the clamps, the copies weighed and "
              "the plan above) on snapshots of the policies workload at concurrency 16 (after 5, 20 and 40 ticks; "
              "best of 7 rounds of 300 calls): " + ", ".join(f"{us:.1f} us at width {n}" for n, us in snapshots)
              + "."]
    if args.loop_runs > 0:
        per_call, per_step, drafted = in_loop(state, args.loop_runs)
        lines += ["", f"In the scheduler's loop (`met bench policies`' 16 prompts x 128 tokens at concurrency 1, the "
                  f"measured policy, {args.loop_runs} runs): {per_call:.1f} us per plan, first plans and replans "
                  f"together; {per_step:.2f} plans per step, {drafted:.0%} of the steps drafting."]
    return publish(lines, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
