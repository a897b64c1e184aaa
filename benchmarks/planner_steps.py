"""Where the measured planner's run time goes against a fixed depth; do its steps emit what its plans expect?

This runs the workload of `met bench policies` (its held-out prompts x --max-tokens, one scheduler,
--concurrency requests in flight, the heap settled as met.bench.policies.run_all settles it)
under each --policies policy. It does one warm-up run per policy, then --repeats kept runs,
interleaved, with the order reversed every other repeat. The measured planner plans from the
table that `met bench policies` boots (met.bench.measured_boot.boot_measured, with the same key checks).

A: phases. While they run, the Scheduler's phase methods are wrapped with timers
(`SchedulerPhases`, which restores them on exit). Each policy is wrapped too (`Watched`), to time
its plan and its draft, and the measured planner's state (`TimedState`) times the planner's plans.
The plans made while drafting (its replans) fall inside the policy's draft, and that falls
inside `_run`. `rest` is the wall less _admit, _compact, plan, _run, _postprocess and _publish:
the submits, the inbox, the tick loop. The report gives ms per run: the median over repeats for
each column (so the medians need not add up to the wall's), and, for the planner against each
other policy, the median of the per-repeat differences.

B: expectation. For each step of the measured planner's kept runs, the report takes the
decision's expected tokens (every sequence, bonus included: PlanDecision.expected_tokens), the
tokens its verify emitted (the sum of Outcome.emitted: accepted drafts plus the bonus, past EOS
too) and the seconds the policy's observe is given (draft + verify). Steps are grouped by width,
source and k. Source is the decision's `lookup` or `mixed`; otherwise it is `mtp` if any sequence
drafted, else `plain`; "(shared)" marks a step where some copies came from other requests (the
shared lookup cache). k is the first plan's k. On an `mtp` step the replans made while drafting
may verify deeper or shallower than k (the verified column shows how deep), so the expectation
there is the first plan's. A k = 0 `mtp` step is a probe. A `plain` step with k > 0 is one the clamps left
with no drafts (a request's last token, no KV room), so it emits one token per sequence.

    python3 benchmarks/planner_steps.py   # prints a markdown report; --out FILE also writes it
"""

import argparse
import functools
import os
import platform
import shlex
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import torch

from met.bench import policies as pol
from met.bench.measured_boot import BootError, MeasuredBoot, boot_measured, default_calibration, default_table
from met.engine import heap
from met.engine.identity import box_class, resolve_run
from met.engine.policy_base import Outcome, Policy, StepPlan
from met.engine.requests import Finished, SeqState
from met.engine.runner import Draft, ModelRunner
from met.engine.scheduler import Scheduler
from met.model.recipes import DEFAULT_RECIPE, RecipeError, embedded
from met.speculative.spec_capacity import DEFAULT_POOLS, VerifyPools
from met.speculative.spec_cost import SpecCostState

from report import publish

PHASES = ("_admit", "_compact", "_run", "_postprocess", "_publish")  # the Scheduler's methods timed, in tick order
COLUMNS = ("_admit", "_compact", "plan", "_run", "draft", "replans", "_postprocess", "_publish", "rest", "wall")
PLANNER = "measured"


class SchedulerPhases:
    """Wall seconds in each of the Scheduler's PHASES while entered: its methods wrapped, restored on exit."""

    def __init__(self) -> None:
        self.seconds: Counter[str] = Counter()
        self._saved: dict[str, Callable[..., object]] = {}

    def __enter__(self) -> "SchedulerPhases":
        self._saved = {name: Scheduler.__dict__[name] for name in PHASES}
        for name, method in self._saved.items():
            setattr(Scheduler, name, self._timed(name, method))
        return self

    def __exit__(self, *exc) -> None:
        for name, method in self._saved.items():
            setattr(Scheduler, name, method)

    def _timed(self, name: str, method: Callable[..., object]) -> Callable[..., object]:
        seconds = self.seconds

        @functools.wraps(method)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                seconds[name] += time.perf_counter() - start
        return timed


class TimedState:
    """A SpecCostState whose plans are timed; every other attribute is the state's own."""

    def __init__(self, state: SpecCostState) -> None:
        self._state = state
        self.seconds = 0.0  # in plan, every call

    def __getattr__(self, name: str):
        return getattr(self._state, name)

    def plan(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self._state.plan(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start


class PlannedStep(NamedTuple):
    """One step of the measured planner: its group, the first plan's expected tokens, what it emitted and took."""

    width: int
    source: str  # "lookup", "mixed", "mtp" (some sequence drafted) or "plain"
    k: int  # the first plan's k (replans while drafting may verify another depth)
    expected: float  # the first plan's expected tokens, every sequence, bonus included
    emitted: int  # Outcome.emitted summed: accepted drafts + a bonus per sequence
    verified: int  # the deepest drafts verified
    seconds: float  # draft + verify, as the policy's observe gets them


def planned_step(plan: StepPlan, outcomes: Sequence[Outcome], seconds: float) -> PlannedStep | None:
    """The step as report B counts it; None for a plan without the measured planner's decision."""
    d = plan.decision
    if d is None:
        return None
    source = d.source if d.source in ("lookup", "mixed") else "mtp" if any(plan.depths) else "plain"
    source += " (shared)" if plan.shared else ""  # some copies came from other requests
    return PlannedStep(len(outcomes), source, d.k, d.expected_tokens, sum(o.emitted for o in outcomes),
                       max((o.proposed for o in outcomes), default=0), seconds)


class Watched:
    """A policy passed through unchanged, its plan and draft timed and the measured planner's steps noted."""

    def __init__(self, policy: Policy, state: TimedState | None = None) -> None:
        self.policy = policy
        self.name = policy.name  # the scheduler wires host drafting by name
        self.copies = policy.copies  # and indexes histories (and other requests') for a policy that copies
        self.state = state  # the measured planner's state, to time its replans (None: not the planner)
        self.seconds: Counter[str] = Counter()  # plan, draft, replans (in draft)
        self.steps: list[PlannedStep] = []

    def plan(self, runner: ModelRunner, seqs: Sequence[SeqState]) -> StepPlan:
        start = time.perf_counter()
        try:
            return self.policy.plan(runner, seqs)
        finally:
            self.seconds["plan"] += time.perf_counter() - start

    def draft(self, runner: ModelRunner, seqs: Sequence[SeqState], plan: StepPlan) -> list[Draft]:
        planned = self.state.seconds if self.state is not None else 0.0
        start = time.perf_counter()
        try:
            return self.policy.draft(runner, seqs, plan)
        finally:
            self.seconds["draft"] += time.perf_counter() - start
            if self.state is not None:
                self.seconds["replans"] += self.state.seconds - planned

    def observe(self, plan: StepPlan, outcomes: Sequence[Outcome], seconds: float) -> None:
        step = planned_step(plan, outcomes, seconds)
        if step is not None:
            self.steps.append(step)
        self.policy.observe(plan, outcomes, seconds)


class Group(NamedTuple):
    """The planner's steps of one (width, source, k): per-step means, and the median step."""

    width: int
    source: str
    k: int
    steps: int
    expected: float  # mean per step
    emitted: float  # mean per step
    verified: float  # mean deepest drafts verified
    median_s: float


def groups(steps: Sequence[PlannedStep]) -> list[Group]:
    """The steps by (width, source, k), in that order."""
    by: dict[tuple[int, str, int], list[PlannedStep]] = {}
    for s in steps:
        by.setdefault((s.width, s.source, s.k), []).append(s)
    return [Group(*key, len(ss), statistics.fmean(s.expected for s in ss), statistics.fmean(s.emitted for s in ss),
                  statistics.fmean(s.verified for s in ss), statistics.median(s.seconds for s in ss))
            for key, ss in sorted(by.items())]


def run_phases(phases: Mapping[str, float], watched: Mapping[str, float], wall: float) -> dict[str, float]:
    """One run's seconds by COLUMNS: the scheduler's phases, the policy's plan / draft / replans, the rest, the wall."""
    out = {name: phases.get(name, 0.0) for name in PHASES}
    out |= {name: watched.get(name, 0.0) for name in ("plan", "draft", "replans")}
    out["rest"] = wall - sum(out[name] for name in (*PHASES, "plan"))
    out["wall"] = wall
    return out


def phase_lines(runs: Mapping[str, Sequence[Mapping[str, float]]], rates: Mapping[str, Sequence[float]]) -> list[str]:
    """Report A: each policy's median ms per run by column, and the planner less each other policy, paired by repeat."""
    head = " | ".join(COLUMNS)
    lines = [f"| policy | {head} | tok/s |", "|---|" + "---:|" * (len(COLUMNS) + 1)]
    for name, per in runs.items():
        cells = " | ".join(f"{1000 * statistics.median(r[c] for r in per):.1f}" for c in COLUMNS)
        lines.append(f"| {name} | {cells} | {statistics.median(rates[name]):.1f} |")
    for name, per in runs.items():
        if name == PLANNER or PLANNER not in runs:
            continue
        diffs = " | ".join(f"{1000 * statistics.median(a[c] - b[c] for a, b in zip(runs[PLANNER], per)):+.1f}"
                           for c in COLUMNS)
        paired = statistics.median(a / b for a, b in zip(rates[PLANNER], rates[name]))
        lines.append(f"| {PLANNER} - {name} | {diffs} | x{paired:.3f} |")
    return lines


def expectation_lines(gs: Sequence[Group]) -> list[str]:
    """Report B: a row per group, then all steps together."""
    lines = ["| width | source | k | steps | expected tokens/step | emitted tokens/step | emitted / expected "
             "| verified depth | median step ms |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for g in gs:
        lines.append(f"| {g.width} | {g.source} | {g.k} | {g.steps} | {g.expected:.2f} | {g.emitted:.2f} | "
                     f"{g.emitted / g.expected:.3f} | {g.verified:.2f} | {1000 * g.median_s:.3f} |")
    steps = sum(g.steps for g in gs)
    if steps:
        expected = sum(g.expected * g.steps for g in gs)
        emitted = sum(g.emitted * g.steps for g in gs)
        lines.append(f"| all | | | {steps} | {expected / steps:.2f} | {emitted / steps:.2f} | "
                     f"{emitted / expected:.3f} | | |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default=f"fixed-2,{PLANNER}",
                        help=f"comma-separated, as met bench policies; must include {PLANNER}")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--recipe", default=DEFAULT_RECIPE)
    parser.add_argument("--table", type=Path, help="default: tables/<this box's class>/<recipe>.toml")
    parser.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--dtype", help="model dtype (default: bfloat16 on cuda, float32 on cpu): the table's")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    names = args.policies.split(",")
    if PLANNER not in names:
        parser.error(f"--policies {args.policies!r} does not include {PLANNER}: report B is about its steps")
    if args.concurrency < 1 or args.repeats < 1 or args.prompts < 1 or args.max_tokens < 1:
        parser.error("--concurrency, --repeats, --prompts and --max-tokens must be at least 1")
    try:
        recipe = embedded(args.recipe)
    except RecipeError as exc:  # missing weights or a damaged card
        print(f"error: {exc}", file=sys.stderr)
        return exc.status
    try:
        settings = resolve_run(args.device, args.dtype)
    except ValueError as exc:
        parser.error(str(exc))
    box = box_class(settings.device)
    table = args.table or default_table(box, recipe.name)
    try:
        state = TimedState(boot_measured(recipe, settings, MeasuredBoot(table, default_calibration(table), 0.1,
                                                                        table_option="--table")))
    except BootError as exc:
        print("\n".join(exc.lines), file=sys.stderr)
        return exc.code
    try:
        factories = pol.policy_factories(names, recipe.config.mtp_depth, VerifyPools(DEFAULT_POOLS.tiers), state,
                                         os.environ)
    except ValueError as exc:
        parser.error(str(exc))
    prompts = pol.heldout_workload_prompts(args.prompts)
    if len(prompts) < args.prompts:
        parser.error(f"only {len(prompts)} held-out prompts are available here; pass --prompts {len(prompts)}")
    load = os.getloadavg()[0]
    runner = ModelRunner(recipe.load(getattr(torch, settings.dtype), settings.device), args.concurrency)
    heap.settle()  # as run_all: the collector's full passes scan what the runs allocate, not the model's heap
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    rates: dict[str, list[float]] = {name: [] for name in names}
    steps: list[PlannedStep] = []
    with SchedulerPhases() as phases:
        for name in names:  # warm-up, not kept
            pol.run_once(runner, factories[name](), recipe.id, prompts[: args.concurrency],
                         min(pol.WARMUP_TOKENS, args.max_tokens))
        for repeat in range(args.repeats):
            for name in (names if repeat % 2 == 0 else names[::-1]):
                phases.seconds.clear()
                policy = Watched(factories[name](), state if name == PLANNER else None)
                wall, _, _, sinks = pol.run_once(runner, policy, recipe.id, prompts, args.max_tokens)
                runs[name].append(run_phases(phases.seconds, policy.seconds, wall))
                rates[name].append(sum(s.end.completion_tokens for s in sinks if isinstance(s.end, Finished)) / wall)
                steps += policy.steps
    command = shlex.join(["python3", "benchmarks/planner_steps.py", *(sys.argv[1:] if argv is None else argv)])
    lines = ["# The measured planner's steps: where its run time goes, and its expected tokens against the emitted",
             "", f"`{command}`: {recipe.id} on {settings.device} ({settings.dtype}, {settings.threads} threads), "
             f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, box class {box}; table "
             f"`{table}`; {len(prompts)} prompts x {args.max_tokens} tokens at concurrency {args.concurrency}, "
             f"{args.repeats} repeats, policies {', '.join(names)}; load average {load:.2f} at start.", "",
             "## A: ms per run by phase", "",
             "Medians over repeats; the difference rows are the medians of the per-repeat differences (tok/s: the "
             "paired ratio). draft is inside _run, and replans inside draft; rest is the wall less _admit, "
             "_compact, plan, _run, _postprocess and _publish.", "",
             *phase_lines(runs, rates), "",
             f"## B: the {PLANNER} planner's steps, expected tokens against emitted", "",
             "k and expected tokens are the first plan's (an mtp step's replans may verify another depth: "
             "verified depth is the deepest drafts verified, the mean per step; a plain step with k > 0 is one the "
             "clamps left no drafts); tokens count every sequence, the bonus included; step ms is draft + verify.",
             "",
             *expectation_lines(groups(steps))]
    return publish(lines, args.out)


if __name__ == "__main__":
    sys.exit(main())
