"""Where a policies run's step time goes, against what the cost table prices per step.

`met bench policies` runs a closed workload (every request submitted at once, 128 tokens each)
through the scheduler. The cost table prices one step at full width from the middle of a decode.
This splits each run's steps (the scheduler's draft + verify seconds, as `policies.md`'s
"tok/s in steps") into three kinds and prices the first with the table:

- full: steps at the run's full width, the MTP block at most 16 rows behind: what a cell prices;
- catch-up: full-width steps whose draft first caught up on a prompt (a request's first draft);
- tail: steps narrower than the concurrency (requests admitted late, or the last ones finishing).

The table's verify figure is a whole scheduler tick (plan to plan); the steps here are draft +
verify, without the tick's host work, so the full steps' "tick ms" column is the one to set beside
the table's cell (the cell of the depth the full steps verified: the pools clamp widths 9..=16 to
one draft; for the measured planner, which mixes depths, the depth of most of its full steps, and
the last column gives the mix). Each configuration runs `--repeats` times, interleaved; medians
per repeat, then the median over repeats.

    python3 benchmarks/studies/step_decomposition.py [--policies off,fixed-1,fixed-3,fixed-4,measured]
    # writes benchmarks/studies/results/step_decomposition.md
"""

import argparse
import platform
import statistics
import sys
from collections import Counter
from functools import partial
from pathlib import Path

import torch

from met.bench import policies
from met.bench.measured_boot import default_calibration, default_table
from met.engine.identity import box_class
from met.engine.policy_base import PlainPolicy
from met.engine.policy_mtp import MtpFixedPolicy, MtpPlannedPolicy
from met.engine.runner import ModelRunner
from met.model.recipes import embedded
from met.speculative.catchup import CATCHUP_SHARED_ROWS
from met.speculative.spec_capacity import DEFAULT_POOLS
from met.speculative.spec_cost import AcceptanceCalibration, CostTable, SpecCostState



class _Behind:
    """Passes every call to the policy it wraps; notes how far behind the MTP block is at each plan."""

    def __init__(self, policy) -> None:
        self.policy, self.name, self.copies, self.rows = policy, policy.name, policy.copies, []

    def plan(self, runner: ModelRunner, seqs):
        self.rows.append(max(runner.mtp_behind(s.slot) for s in seqs))
        return self.policy.plan(runner, seqs)

    def draft(self, runner, seqs, plan):
        return self.policy.draft(runner, seqs, plan)

    def observe(self, plan, outcomes, seconds) -> None:
        self.policy.observe(plan, outcomes, seconds)


def decompose(runner: ModelRunner, policy, model_id: str, prompts: list[tuple[int, ...]], tokens: int) -> dict:
    """One run: seconds and steps of its full, catch-up and tail steps; the full steps' median tick."""
    width = runner.cache.max_batch
    behind = _Behind(policy)
    _, _, recorder, _ = policies.run_once(runner, behind, model_id, prompts, tokens)
    steps = recorder.steps
    parts = {kind: [0.0, 0] for kind in ("full", "catch-up", "tail")}  # seconds, steps
    ticks, depths = [], Counter()
    for i, (step, rows) in enumerate(zip(steps, behind.rows, strict=True)):
        drafted = max(step.proposed) > 0
        caught_up = not drafted or rows <= CATCHUP_SHARED_ROWS  # more rows behind: a prompt's catch-up
        kind = "tail" if len(step.proposed) < width else "full" if caught_up else "catch-up"
        parts[kind][0] += step.step_s
        parts[kind][1] += 1
        if kind == "full" and i + 1 < len(steps):
            ticks.append(steps[i + 1].planned_at - step.planned_at)
            depths[max(step.proposed)] += 1
    return {"parts": parts, "tick": statistics.median(ticks) if ticks else None, "seconds": recorder.seconds,
            "depth": depths.most_common(1)[0][0] if depths else 0, "depths": depths}


def _mix(depths: Counter) -> str:
    """Each depth's share of the full steps, deepest last: "k3 40%, k4 60%"."""
    total = sum(depths.values())
    return ", ".join(f"k{k} {n / total:.0%}" for k, n in sorted(depths.items())) if total else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--policies", default="off,fixed-1,fixed-3",
                    help="off, fixed-1..fixed-4 and measured (the table's planner), comma-separated")
    ap.add_argument("--table", type=Path, help="default: tables/<box_class>/met-tiny-py.toml")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/studies/results/step_decomposition.md"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    recipe = embedded()
    model = recipe.load()
    table_path = args.table or default_table(box_class("cpu", threads=1), recipe.name)
    table = CostTable.parse(table_path.read_text())
    prompts = policies.heldout_workload_prompts(args.prompts)
    known = {"off": PlainPolicy} | {f"fixed-{k}": partial(MtpFixedPolicy, k, 4, DEFAULT_POOLS) for k in range(1, 5)}
    unknown = set(args.policies.split(",")) - set(known) - {"measured"}
    if unknown:
        ap.error(f"unknown policies {sorted(unknown)}; known: {', '.join(known)}, measured")
    if "measured" in args.policies.split(","):  # the planner alone needs the calibration beside the table
        calibration = AcceptanceCalibration.parse(default_calibration(table_path).read_text())
        state = SpecCostState(table, calibration, 0.1, table.key, calibration.drafter)
        known["measured"] = partial(MtpPlannedPolicy, state, 4, DEFAULT_POOLS)
    configs = {name: known[name] for name in args.policies.split(",")}
    results: dict = {}
    for c in (int(x) for x in args.concurrency.split(",")):
        runner = ModelRunner(model, c)
        for name, make in configs.items():  # warm-up
            policies.run_once(runner, make(), recipe.id, prompts[:c], 16)
        for _ in range(args.repeats):
            for name, make in configs.items():
                results.setdefault((c, name), []).append(decompose(runner, make(), recipe.id, prompts, args.max_tokens))
    lines = ["# Step time of a policies run, by kind of step, against the cost table", "",
             f"Command: `python3 {' '.join(sys.argv)}`; table `{table_path}`; `{platform.platform()}`, torch "
             f"{torch.__version__}, 1 thread; {args.prompts} held-out prompts ({policies.PROMPT_BYTES} bytes from byte "
             f"{policies.PROMPT_OFFSET}), "
             f"{args.max_tokens} tokens each, {args.repeats} repeats, medians.", "",
             "| concurrency | policy | step s | full: steps, s | table cell ms (its depth) | full tick ms | "
             "catch-up: steps, s | tail: steps, s | tail share of step s | full steps by depth (all repeats) |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for (c, name), runs in results.items():
        def med(kind: str, i: int) -> float:
            return statistics.median(r["parts"][kind][i] for r in runs)

        cell = table.cell(c, statistics.mode(r["depth"] for r in runs))  # the depth verified (pools clamp)
        ticks = [r["tick"] for r in runs if r["tick"] is not None]
        tick = f"{1e3 * statistics.median(ticks):.2f}" if ticks else "-"
        seconds = statistics.median(r["seconds"] for r in runs)
        lines.append(f"| {c} | {name} | {seconds:.3f} | {med('full', 1):.0f}, {med('full', 0):.3f} | "
                     f"{1e3 * (cell.verify_s + cell.draft_s):.2f} (k={cell.k}) | {tick} | {med('catch-up', 1):.0f}, "
                     f"{med('catch-up', 0):.3f} | {med('tail', 1):.0f}, {med('tail', 0):.3f} | "
                     f"{med('tail', 0) / seconds:.0%} | {_mix(sum((r['depths'] for r in runs), Counter()))} |")
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
