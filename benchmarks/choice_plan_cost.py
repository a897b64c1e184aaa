"""What a step's plan costs the scheduler under the choice among drafters against the MTP planner alone.

The scheduler waits for the policy's plan before every step (replans made while drafting fall
inside the draft, so are not counted here). This runs `met bench policies`' workload (its held-out
prompts x --max-tokens, one scheduler, --concurrency requests in flight) under `measured` (the MTP
module's planner) and `mtp+draft-measured` (the choice between it and the draft model's planner),
on one runner holding the draft model, interleaved over --repeats with the order reversed every
other repeat, after a warm-up run of each. Both plan from the tables `met bench policies` boots
(tables/<box class>/met-tiny-py.toml and its .draft-<draft model>.toml, with the same key checks).
It reports, per concurrency, the medians over repeats of microseconds of plan per step, the ratio
of the choice's to the MTP planner's (per repeat, then the median), and the share of the choice's
plans that asked the draft model's planner at all.

    python3 benchmarks/choice_plan_cost.py   # prints a markdown table; --out FILE also writes it
"""

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from met.bench import policies as pol
from met.bench.measured_boot import boot_default
from met.engine.identity import box_class, resolve_run
from met.engine.runner import ModelRunner
from met.model.recipes import embedded
from met.model.sources import draft_model_for
from met.speculative.spec_capacity import DEFAULT_POOLS, VerifyPools

from report import publish

POLICIES = ("measured", "mtp+draft-measured")


class _Counted:
    """A planner's plan passed through, counted."""

    def __init__(self, planner) -> None:
        self.calls, self._plan = 0, planner.plan
        planner.plan = self

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self._plan(*args, **kwargs)


def plan_seconds(runner: ModelRunner, policy, model_id: str, prompts, max_tokens: int) -> tuple[float, int, float]:
    """One run: seconds in the policy's plan, steps, and the share of plans that asked the draft model's planner."""
    spent, plan = [0.0], policy.plan
    asked = _Counted(policy.planners[1]) if hasattr(policy, "planners") else None

    def timed(r, seqs):
        start = time.perf_counter()
        try:
            return plan(r, seqs)
        finally:
            spent[0] += time.perf_counter() - start

    policy.plan = timed
    _, _, recorder, _ = pol.run_once(runner, policy, model_id, prompts, max_tokens)
    steps = len(recorder.steps)
    return spent[0], steps, (asked.calls / steps if asked is not None else 0.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draft-model", default="met-tiny-py-draft")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(1)
    settings = resolve_run("cpu", "float32")
    box = box_class(settings.device, None)
    recipe = embedded("met-tiny-py")
    small = draft_model_for(recipe, args.draft_model)
    (table, mtp), (draft_table, draft) = boot_default(recipe, settings), boot_default(recipe, settings, small)
    factories = pol.policy_factories(POLICIES, recipe.config.mtp_depth, VerifyPools(DEFAULT_POOLS.tiers), mtp,
                                     os.environ, draft_model=True, draft_state=draft)
    model, drafter = recipe.load(torch.float32, "cpu"), small.load(torch.float32, "cpu")
    prompts = pol.heldout_workload_prompts(args.prompts)
    lines = ["# A step's plan under the choice among drafters and under the MTP planner alone", "",
             f"Command: `python3 {' '.join(sys.argv)}`; box class `{box}`, `{platform.platform()}`, torch "
             f"{torch.__version__}, one thread; tables `{table}`, `{draft_table}`; {len(prompts)} held-out prompts "
             f"x {args.max_tokens} tokens, {args.repeats} repeats interleaved; medians over repeats.", "",
             "| concurrency | measured us/step | mtp+draft-measured us/step | choice / measured | plans asking the "
             "draft model's planner |", "|---:|---:|---:|---:|---:|"]
    for c in (int(x) for x in args.concurrency.split(",")):
        runner = ModelRunner(model, c, min(model.cfg.max_seq_len, drafter.cfg.max_seq_len), draft_model=drafter)
        for name in POLICIES:
            plan_seconds(runner, factories[name](), recipe.id, prompts[:c], pol.WARMUP_TOKENS)
        per_step = {name: [] for name in POLICIES}
        asked = []
        for repeat in range(args.repeats):
            for name in POLICIES if repeat % 2 == 0 else POLICIES[::-1]:
                seconds, steps, share = plan_seconds(runner, factories[name](), recipe.id, prompts, args.max_tokens)
                per_step[name].append(seconds / steps * 1e6)
                if name != POLICIES[0]:
                    asked.append(share)
        ratio = statistics.median(b / a for a, b in zip(*per_step.values()))
        a, b = (statistics.median(v) for v in per_step.values())
        lines.append(f"| {c} | {a:.1f} | {b:.1f} | {ratio:.3f} | {statistics.median(asked):.1%} |")
    return publish(lines, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
