"""Does MTP drafting after a copy step deliver what the measured planner expects of it?

After a step that verified copies (or decoded plainly) a sequence has no MTP confidence, so the
planner's first plan reads the calibration's position priors, fitted on a decode that drafts every
step. A copy step ends where the text stops repeating its history, which may be where the MTP
module is least sure. This runs `met bench policies`' workload at concurrency 1 (its held-out
prompts x --max-tokens, the measured policy on this box's table and calibration: greedy, so one run
says it all) and
groups the steps where MTP drafted by the kind of step before them: how often the first draft was
accepted, the drafts accepted per step, and what the first plan expected at its depth (at width 1,
its expected tokens less the bonus). The priors' first-position rate is given beside. A second
table splits the same steps by the longest recurring suffix of the history when the step was
planned (the copy the planner weighed; 0: none): where a long one is left the planner copies.

    python3 benchmarks/studies/after_copy_acceptance.py   # prints a markdown table; --out FILE also writes it
"""

import argparse
import os
import platform
import sys
from collections import defaultdict
from pathlib import Path

import torch

from met.bench import policies as pol
from met.bench.measured_boot import boot_default
from met.engine.identity import box_class, resolve_run
from met.engine.runner import ModelRunner
from met.model.recipes import embedded
from met.speculative.spec_capacity import DEFAULT_POOLS, VerifyPools

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: report.py
from report import publish


def step_kind(plan) -> str:
    """A step as this study groups it: lookup (copies), mixed, mtp or plain."""
    source = plan.decision.source if plan.decision is not None else None
    return source if source in ("lookup", "mixed") else plan.mode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(1)
    settings = resolve_run("cpu", "float32")
    box = box_class(settings.device, None)
    recipe = embedded("met-tiny-py")
    table, state = boot_default(recipe, settings)
    factory = pol.policy_factories(["measured"], recipe.config.mtp_depth, VerifyPools(DEFAULT_POOLS.tiers), state,
                                   os.environ)["measured"]
    runner = ModelRunner(recipe.load(torch.float32, "cpu"), 1)
    prompts = pol.heldout_workload_prompts(args.prompts)
    groups: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0, 0.0])  # steps, first accepted, accepted, expected
    by_match: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])  # steps, first accepted
    policy, before, match = factory(), ["prefill"], [0]
    observe, plan_step = policy.observe, policy.plan

    def planned(runner, seqs):
        match[0] = seqs[0].proposer.matched_copy(1)[0]
        return plan_step(runner, seqs)

    def noted(plan, outcomes, seconds):
        if step_kind(plan) == "mtp":
            g = groups[before[0]]
            g[0] += 1
            g[1] += outcomes[0].accepted >= 1
            g[2] += outcomes[0].accepted
            g[3] += plan.decision.expected_tokens - 1.0
            m = by_match[before[0], "none" if not match[0] else "1-3" if match[0] < 4 else "4 or more"]
            m[0] += 1
            m[1] += outcomes[0].accepted >= 1
        before[0] = step_kind(plan)
        observe(plan, outcomes, seconds)

    policy.plan, policy.observe = planned, noted
    pol.run_once(runner, policy, recipe.id, prompts, args.max_tokens)
    prior = state.calibration.p_accept(None, 1)
    lines = ["# MTP drafting after a copy step: acceptance against the first plan's expectation", "",
             f"Command: `python3 {' '.join(sys.argv)}`; box class `{box}`, `{platform.platform()}`, torch "
             f"{torch.__version__}, one thread; table `{table}`; {len(prompts)} held-out prompts x {args.max_tokens} "
             f"tokens at concurrency 1, the measured policy. The calibration's prior for a first "
             f"draft: {prior:.3f}.", "",
             "| step before | MTP steps | first draft accepted | drafts accepted per step | the first plan expected |",
             "|---|---:|---:|---:|---:|"]
    for kind, (steps, first, accepted, expected) in sorted(groups.items(), key=lambda kv: -kv[1][0]):
        lines.append(f"| {kind} | {steps} | {first / steps:.3f} | {accepted / steps:.2f} | {expected / steps:.2f} |")
    lines += ["", "| step before | history's match when planned | MTP steps | first draft accepted |",
              "|---|---|---:|---:|"]
    for (kind, length), (steps, first) in sorted(by_match.items(), key=lambda kv: (-groups[kv[0][0]][0], kv[0][1])):
        lines.append(f"| {kind} | {length} | {steps} | {first / steps:.3f} |")
    lines += ["", "Drafts accepted per step count those the step verified: replans made while drafting may stop "
              "short of the first plan's depth, so they bound it from below; the first draft's rate has no such "
              "bound."]
    return publish(lines, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
