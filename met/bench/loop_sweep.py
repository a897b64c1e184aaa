"""The sweep timed inside a running decode: each cell's draft and verify steps as the scheduler runs them.

The window sweep (met.bench.sweep) times one step again and again on a held state. On a CPU its
caches then stay warm for that step alone: on the development box its MTP draft cells came out
10-30% below what the same steps cost inside a decode (its verify cells within a few percent),
which priced speculation too cheaply. Here a cell (n, k) is a short real decode: n held-out
prompts through a Scheduler drafting k every step (k = 0: plain decode), on the engine path a
serve runs, driven by met bench policies' run_once. The draft step is timed around the policy's
draft call; the verify step is the rest of the scheduler's tick, from one plan to the next: the
verify forward and the host work a serve pays once per step whatever its depth (planning,
acceptance bookkeeping, streaming, the snapshot). Plain decode takes more steps per token, so
leaving that work out priced it too cheaply against speculation. Steps narrower than n (a
request ended early), drafting fewer than k (KV room), among the first SKIP_STEPS of a run (the
prompt's MTP catch-up), or the last of a run (no next tick to end it) are not counted; a run's
figure is the mean of its counted steps: a decode pays its total time, slow steps included. At
width 1 on the development box plain decode's slow steps came per step, not per second of work (a
run's mean step 7% over its median, a drafting run's 1-3%: benchmarks/studies/step_statistic.py), so a
run's median step priced plain decode 4-6% low against every depth. The catch-up is measured on
its own: a run's first step drafts after the prompt, so its draft beyond the run's median draft
(a typical draft: the median, so one slow draft does not hide it), over the prompt's rows,
is the cell's catchup_s (the median over repeats), which the planner prices for sequences whose
MTP block is far behind.
The drafter is the model's MTP module, or a draft model (a smaller model of the target's tokenizer
with a KV cache of its own) or an EAGLE-3 head drafting in its place through the same fixed policy:
its first step catches it up on the whole prompt, as the MTP block's does.
A copy verify cell (n, k), at every depth from 1, is such a decode verifying k copies per
sequence every step and drafting nothing (policy_lookup.CopyFixedPolicy: each sequence's history's
matched copy, cycled, else its last tokens), its steps counted and timed as the others' (the host
copy where the draft is); its verify_s is what the planner prices a copy that deep at. Up to the
drafter's depth it is its own decode, not the cell's verify_s: that is the tick after an MTP draft
(the draft's bookkeeping, caches the drafter left cold), and on the Xeon box 5 copies verified
cheaper than the cells' 4 drafts (width 2: 2.77 ms against 3.17; width 4: 4.39 against 4.61).
Runs go as the window sweep's windows do (each repeat, the widths shuffled and a width's cells
back to back, shuffled), and figures are paired the same way (sweep.paired_seconds).

Wall time only: an energy meter needs long windows of one identical step, which the window
sweep keeps; `met bench spec-cost` uses this sweep when the table has no energy source.
"""

import random
import statistics
from collections.abc import Callable, Sequence
from typing import NamedTuple

from met.bench import policies
from met.bench.policies import StepRecord
from met.bench.step_fixture import drafter_of, drafters_of, runner_for
from met.bench.sweep import (SweepParams, SweepResult, Task, iqr, joint_note, paired_seconds, round_figure,
                             task_names, tasks, visit_order)
from met.engine.policy_base import PlainPolicy, Policy
from met.engine.policy_lookup import CopyFixedPolicy
from met.engine.policy_mtp import MtpFixedPolicy
from met.engine.runner import ModelRunner
from met.model.eagle3 import Eagle3Head
from met.model.tokenizer import BYTES, Tokenizer
from met.model.transformer import Transformer
from met.speculative.spec_capacity import VerifyPools
from met.speculative.spec_cost import Cell, VerifyCell

LOOP_TOKENS = 48  # tokens each request decodes in one run
SKIP_STEPS = 2  # a run's first steps carry the prompt's MTP catch-up: not counted


class NothingTimed(RuntimeError):
    """A cell's decode ran no step that could be counted (its requests ended at once, e.g. on EOS)."""


def counted_steps(steps: Sequence[StepRecord], width: int, depth: int) -> list[tuple[float, float]]:
    """(draft, rest of the tick) seconds of each counted step: past the first SKIP_STEPS, width x depth drafts."""
    return [(s.draft_s, max(after.planned_at - s.planned_at - s.draft_s, 1e-9))
            for s, after in zip(steps[SKIP_STEPS:], steps[SKIP_STEPS + 1:])
            if len(s.proposed) == width and all(p == depth for p in s.proposed)]


def catch_up_per_row(steps: Sequence[StepRecord], counted: Sequence[tuple[float, float]], width: int, depth: int,
                     rows: float) -> float | None:
    """The first step's draft beyond the counted steps' median draft, per prompt row (None: not measurable)."""
    if depth == 0 or not steps or not counted or rows <= 0:
        return None
    first = steps[0]
    if len(first.proposed) != width or any(p != depth for p in first.proposed):
        return None
    return max(first.draft_s - statistics.median(d for d, _ in counted), 0.0) / rows


def run_figures(steps: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """A run's (draft, verify) figures: the mean of its counted steps' (a mean, not a median: the module's docstring)."""
    return statistics.fmean(d for d, _ in steps), statistics.fmean(v for _, v in steps)


class CellRun(NamedTuple):
    """One decode of a cell: its counted steps' (draft, verify) seconds and its catch-up per row (None at k = 0)."""

    steps: list[tuple[float, float]]
    catchup_s: float | None


def run_cell(runner: ModelRunner, model_id: str, prompts: Sequence[Sequence[int]], depth: int,
             tokens: int = LOOP_TOKENS, tokenizer: Tokenizer = BYTES, copies: bool = False,
             drafter: str | None = None) -> CellRun:
    """One decode of len(prompts) requests (the runner's width) at a fixed depth: its counted steps and catch-up.

    drafter (mtp, draft or eagle) drafts; None: the runner's draft model or EAGLE-3 head where it has one, else its
    MTP module. copies: verify `depth` copies every step, no drafter pass (a copy verify cell; no catch-up).
    """
    width = runner.cache.max_batch
    if len(prompts) != width:
        raise ValueError(f"{len(prompts)} prompts for a runner of width {width}")
    pools = VerifyPools(((width, depth),))  # no pool clamp: every sequence drafts `depth`
    drafter = drafter or drafter_of(runner)
    policy: Policy = PlainPolicy()
    if depth and copies:
        policy = CopyFixedPolicy(depth, pools)
    elif depth:
        policy = MtpFixedPolicy(depth, runner.model.cfg.mtp_depth if drafter == "mtp" else depth, pools, drafter)
    _, _, recorder, _ = policies.run_once(runner, policy, model_id, prompts, tokens, tokenizer)
    counted = counted_steps(recorder.steps, width, depth)
    if copies:
        return CellRun(counted, None)
    # a prompt's catch-up: the MTP block's, its tokens after the first, then one (an EAGLE-3 head's: each token's
    # features); a draft model's, every token
    rows = statistics.mean(len(p) + (drafter == "draft") for p in prompts)
    return CellRun(counted, catch_up_per_row(recorder.steps, counted, width, depth, rows))


def measure_in_loop(model: Transformer, model_id: str, prompts: Sequence[Sequence[int]], params: SweepParams,
                    on_run: Callable[[int, int, str], None] = lambda done, total, label: None,
                    tokenizer: Tokenizer = BYTES, draft_model: Transformer | None = None,
                    eagle: Eagle3Head | None = None) -> SweepResult:
    """Every cell of the sweep timed in running decodes of `prompts` (at least max(widths) of them).

    `tokenizer` is the model's: its EOS ids end requests and its decoder streams their text.
    draft_model, eagle: it drafts the cells' drafts instead of the MTP module. NothingTimed if a cell's
    decode ends before a step can be counted.
    """
    results = measure_joint_in_loop(model, model_id, prompts, params, on_run, tokenizer, draft_model, eagle,
                                    with_mtp=False)
    return next(iter(results.values()))


def measure_joint_in_loop(model: Transformer, model_id: str, prompts: Sequence[Sequence[int]], params: SweepParams,
                          on_run: Callable[[int, int, str], None] = lambda done, total, label: None,
                          tokenizer: Tokenizer = BYTES, draft_model: Transformer | None = None,
                          eagle: Eagle3Head | None = None, with_mtp: bool = True) -> dict[str, SweepResult]:
    """measure_in_loop for several drafters in one sweep: {kind: its SweepResult}, as sweep.measure_joint.

    Each width's runner holds every drafter (the MTP module with_mtp, the draft model, the EAGLE-3
    head), as a serve choosing among them does; a drafter's cell (n, k >= 1) is a decode it drafts,
    and the plain decode (k = 0) and the copies' decodes are run once and shared by every table.
    """
    if len(prompts) < max(params.widths):
        raise ValueError(f"{len(prompts)} prompts for widths up to {max(params.widths)}")
    longest = max(len(p) for p in prompts[: max(params.widths)])
    deepest = params.deepest_verify
    max_len = longest + LOOP_TOKENS + deepest + 1
    models = [("model", model)] + ([("draft model", draft_model)] if draft_model is not None else [])
    for whose, m in models:
        if max_len > m.cfg.max_seq_len:
            raise ValueError(f"prompts of {longest} tokens + {LOOP_TOKENS} decoded + depth {deepest} + 1 "
                             f"exceed the {whose}'s max_seq_len {m.cfg.max_seq_len}; lower --context-len "
                             "(or --verify-depth)")
    runners = {n: runner_for(model, n, max_len, draft_model=draft_model, eagle=eagle, with_mtp=with_mtp)
               for n in params.widths}
    kinds = drafters_of(runners[params.widths[0]])
    names = task_names(kinds)
    kind_of = dict(zip(names, kinds)) | {"": kinds[0]}
    # a cell's decode times its verify and its draft; a copy's decode its verify
    everything = tasks(params, names)
    runs = [t for t in everything if t.step != "draft"]
    total = len(runs) * (params.repeats + 1)
    done = 0
    for task in runs:  # warm-up: one run per cell, not kept
        _run(runners[task.n], model_id, prompts, task, tokenizer, kind_of[task.drafter])
        done += 1
        on_run(done, total, f"warm-up {_label(task)}")
    windows: dict[Task, list[float]] = {t: [] for t in everything}
    catchups: dict[Task, list[float]] = {}
    counted: dict[Task, int] = {}
    groups = {n: [t for t in runs if t.n == n] for n in runners}
    order = random.Random(params.seed)
    for repeat in range(params.repeats):
        for task in visit_order(groups, order):
            n, k = task.n, task.k
            steps, catchup = _run(runners[n], model_id, prompts, task, tokenizer, kind_of[task.drafter])
            if catchup is not None:
                catchups.setdefault(task, []).append(catchup)
            if not steps:
                copies = " of copies" if task.step == "copy" else ""
                raise NothingTimed(f"the decode{copies} at width {n}, depth {k} ran no full step to time "
                                   "(its requests ended at once)")
            counted[task] = counted.get(task, 0) + len(steps)
            draft, verify = run_figures(steps)
            windows[task].append(verify)
            if task.step == "verify" and k:
                windows[Task(n, k, "draft", task.drafter)].append(draft)
            done += 1
            on_run(done, total, f"repeat {repeat + 1}/{params.repeats} {_label(task)}")
    figures = paired_seconds(windows)
    depths = range(params.max_depth + 1)
    verify_cells = tuple(_verify_cell(Task(n, k, "copy"), windows, figures)
                         for n in params.widths for k in params.copy_depths(n))
    meta = {"method": f"in-loop: each cell a decode of {LOOP_TOKENS} tokens per request through the scheduler "
                      f"at that width and fixed depth, the mean of its full steps (the first {SKIP_STEPS} "
                      "and the last not counted); verify_s is the rest of the scheduler's tick after the draft; "
                      "catchup_s: the first step's draft beyond the median draft, per prompt row, median over repeats",
            "context_len": longest, "repeats": params.repeats,
            "steps_counted_min": min(counted.values()), "steps_counted_max": max(counted.values()),
            "cell_order": f"per repeat, widths shuffled, each width's depths back to back, shuffled "
                          f"(seed {params.seed})",
            "figure": "median over repeats of each run's mean step over the geometric mean of its width's runs "
                      "that repeat, times the median of those means",
            "spread": "interquartile range of the runs' means over repeats, same unit"}
    if verify_cells:
        meta["verify_cells"] = (
            f"depths 1..=min({params.verify_depth}, COPY_POOLS) per width: a decode as a cell's, "
            "verifying k copies per sequence every step (its history's matched copy, cycled, else its last tokens; "
            "no drafter pass), counted and paired as the other cells; verify_s the rest of the tick after the copy")
    if len(kinds) > 1:
        meta["joint_sweep"] = joint_note(kinds)
    results = {}
    for name in names:
        made = tuple(_cell(n, k, windows, figures, catchups.get(Task(n, k, "verify", name if k else "")), name)
                     for n in params.widths for k in depths)
        results[kind_of[name]] = SweepResult(made, meta, verify_cells)
    return results


def _run(runner: ModelRunner, model_id: str, prompts: Sequence[Sequence[int]], task: Task,
         tokenizer: Tokenizer, drafter: str) -> CellRun:
    """The decode of a cell (the drafter's drafts, or plain at k = 0) or of a copy verify cell (copies) on its width's
    runner."""
    return run_cell(runner, model_id, prompts[: task.n], task.k, tokenizer=tokenizer, copies=task.step == "copy",
                    drafter=drafter)


def _label(task: Task) -> str:
    """A run's progress label: a cell's "n=2 k=1" ("n=2 k=1 (mtp)" in a joint sweep), a copy verify cell's "n=1 k=3
    copies"."""
    if task.step == "copy":
        return task.label
    return f"n={task.n} k={task.k}" + (f" ({task.drafter})" if task.drafter else "")


def _cell(n: int, k: int, windows: dict[Task, list[float]], figures: dict[Task, float],
          catchups: list[float] | None, drafter: str = "") -> Cell:
    mine = drafter if k else ""  # the plain decode is every drafter's
    verify, draft = Task(n, k, "verify", mine), Task(n, k, "draft", mine)
    return Cell(n, k, round_figure(figures[verify]), round_figure(figures[draft]) if k else 0.0,
                verify_s_spread=iqr(windows[verify]), draft_s_spread=iqr(windows[draft]) if k else 0.0,
                catchup_s=round_figure(statistics.median(catchups)) if k and catchups else None)


def _verify_cell(task: Task, windows: dict[Task, list[float]], figures: dict[Task, float]) -> VerifyCell:
    return VerifyCell(task.n, task.k, round_figure(figures[task]), verify_s_spread=iqr(windows[task]))
