"""The calibration's carry-over against a fixed-depth decode of the policies benchmark's own prompts.

The measured planner's first plan of a step reads the carry-over: the accepted drafts a step at
depth k is expected to get, by the top-1 log-prob of the sequence's previous first draft. This runs
`met bench policies`' workload (its held-out prompts, through the scheduler) at one fixed depth
and, per carry-over bin of the previous first draft, sets what the calibration expected beside what
the steps got: sequence-steps that drafted the full depth, expected and realized mean accepted
drafts, and the realized mean's standard error.

Greedy decoding is deterministic, so one run is the whole sample; --prompts takes more of the
held-out files (the policies benchmark runs the first 16).

    python3 benchmarks/studies/carryover_check.py [--depth 3] [--concurrency 1] [--prompts 16] [--out FILE]
"""

import argparse
import os
import platform
import statistics
import sys
from pathlib import Path

import torch

from met.bench import policies as pol
from met.bench.measured_boot import default_calibration, default_table
from met.engine.identity import box_class
from met.engine.runner import ModelRunner
from met.model.recipes import embedded
from met.speculative.spec_capacity import DEFAULT_POOLS, VerifyPools
from met.speculative.spec_cost import AcceptanceCalibration

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: report.py
from report import publish


class _Previous:
    """Passes every call to the policy it wraps; notes each full-depth sequence-step and its previous first draft."""

    def __init__(self, policy, depth: int) -> None:
        self.policy, self.name, self.copies, self.depth = policy, policy.name, policy.copies, depth
        self.rows: list[tuple[float | None, int]] = []  # (previous first-draft log-prob, drafts accepted)
        self._previous: list[float | None] = []

    def plan(self, runner, seqs):
        self._previous = [s.confidences[0] if s.confidences else None for s in seqs]
        return self.policy.plan(runner, seqs)

    def draft(self, runner, seqs, plan):
        return self.policy.draft(runner, seqs, plan)

    def observe(self, plan, outcomes, seconds) -> None:
        self.rows += [(p, o.accepted) for p, o in zip(self._previous, outcomes) if o.proposed == self.depth]
        self.policy.observe(plan, outcomes, seconds)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibration", type=Path,
                    help="default: tables/<this box's class>/met-tiny-py.calibration.toml")
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(1)
    path = args.calibration or default_calibration(default_table(box_class("cpu", threads=1), "met-tiny-py"))
    calibration = AcceptanceCalibration.parse(path.read_text())
    recipe = embedded("met-tiny-py")
    model = recipe.load(torch.float32, "cpu")
    prompts = pol.heldout_workload_prompts(args.prompts)
    factory = pol.policy_factories([f"fixed-{args.depth}"], recipe.config.mtp_depth, VerifyPools(DEFAULT_POOLS.tiers),
                                   None, os.environ)[f"fixed-{args.depth}"]
    runner = ModelRunner(model, args.concurrency)
    recorder = _Previous(factory(), args.depth)
    pol.run_once(runner, recorder, recipe.id, prompts, args.max_tokens)
    rows = recorder.rows
    groups: dict[int, list[tuple[float | None, int]]] = {}
    for previous, accepted in rows:
        groups.setdefault(calibration.carry_index(previous), []).append((previous, accepted))
    lines = [f"# The carry-over against fixed depth {args.depth} on the policies benchmark's prompts", "",
             f"Command: `python3 {' '.join(sys.argv)}`; calibration `{path}`; recipe `{recipe.id}`; "
             f"`{platform.platform()}`, torch {torch.__version__}, 1 thread; {len(prompts)} held-out prompts x "
             f"{args.max_tokens} tokens at concurrency {args.concurrency}.", "",
             "Sequence-steps that drafted the full depth, by the carry-over bin of their previous first draft "
             "(none: the sequence's first step, or its last was plain: the position priors).", "",
             "| previous first draft's log-prob, up to | steps | expected accepted | realized | standard error |",
             "|---|---:|---:|---:|---:|"]
    for index in sorted(groups):
        group = groups[index]
        expected = statistics.fmean(calibration.expected_accepted_by_depth((), args.depth, p)[-1] for p, _ in group)
        realized = [a for _, a in group]
        error = statistics.stdev(realized) / len(realized) ** 0.5 if len(realized) > 1 else float("nan")
        upper = f"{calibration.carryover[index].upper:.3f}" if index >= 0 else "none"
        lines.append(f"| {upper} | {len(group)} | {expected:.2f} | {statistics.fmean(realized):.2f} | {error:.2f} |")
    if rows:
        expected = statistics.fmean(calibration.expected_accepted_by_depth((), args.depth, p)[-1] for p, _ in rows)
        lines.append(f"| all | {len(rows)} | {expected:.2f} | {statistics.fmean(a for _, a in rows):.2f} | |")
    return publish(lines, args.out)


if __name__ == "__main__":
    sys.exit(main())
