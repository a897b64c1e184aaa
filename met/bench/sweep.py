"""The width x depth sweep: what one verify step and one draft step cost at each (n, k) on this box.

The draft step is the MTP module's, a DFlash block drafter's, or a draft model's (a smaller model of
the target's tokenizer with a KV cache of its own): whichever the table is measured for.

It also times the verify of copies (the verify cells, SweepParams.copy_depths) at every depth from 1
as deep as the measured planner copies: each sequence's last k prompt tokens, no drafter pass (a
verify's cost does not depend on the tokens it scores). Up to max_depth too, not read from the MTP
cells: timed in a decode (met.bench.loop_sweep), a cell's verify carries its draft's bookkeeping and
colder caches, which a copy does not.

For every cell the same step is timed in windows of many identical steps (a StepFixture puts
the state back after each). Windows are sized once per cell after a warm-up, then every cell
gets one window per repeat. Each repeat visits the widths in a new shuffled order and, within a
width, all its steps (verify, draft and copies at every depth) back to back in a new shuffled order.

What the planner compares is depths at one width, so a cell's time is paired with its width's
other steps of the same repeat: each window's cost per step is divided by the geometric mean of
its width's windows in that repeat, the median of those ratios is taken over the repeats, and it
is scaled back by the median of the geometric means. A slowdown shared by a width's back-to-back
windows (a busy neighbour on a shared host, a clock change) cancels instead of ranking one depth
above another. Joules (long windows, one device counter) are plain medians. A cell's spread is the
interquartile range of its raw windows.
"""

import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from met.bench.meters import EnergyReadError, Meter, Reading, WallMeter, device_sync
from met.bench.step_fixture import StepFixture, drafters_of, runner_for
from met.model.config import ModelConfig
from met.model.dflash import DflashDrafter
from met.model.eagle3 import Eagle3Head
from met.model.transformer import Transformer
from met.speculative.spec_capacity import COPY_POOLS
from met.speculative.spec_cost import MAX_DEPTH, Cell, VerifyCell

MAX_STEPS_PER_WINDOW = 100_000  # a step faster than window_s / this is not a step worth timing
T = TypeVar("T")
ENERGY_RETRIES = 2  # a window refused for its energy reading is measured again, twice as long


@dataclass(frozen=True, slots=True)
class SweepParams:
    """What to measure and how long: widths, depths 0..=max_depth (copies 1..=verify_depth), context, repeats, windows."""

    widths: tuple[int, ...] = (1, 2, 4, 8, 16)
    max_depth: int = 4  # the MTP module is trained for 4 recursive drafts
    verify_depth: int = 16  # copies' verify cells at depths 1..=this, as COPY_POOLS allows at each width
    context_len: int = 256  # tokens the first sequence holds when a step is timed; slot i holds i fewer (ragged)
    repeats: int = 5  # windows per cell; the cell's figure is their median
    window_s: float = 0.25  # shortest window (longer where the meter needs it, e.g. NVML's 1 s)
    warmup_s: float = 0.1  # untimed steps per cell before its steps per window are chosen
    seed: int = 0  # the prompts' tokens and the shuffled cell order

    def __post_init__(self) -> None:
        widths = tuple(self.widths)
        if not widths or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in widths):
            raise ValueError(f"widths {widths!r} must be positive whole numbers (e.g. 1,2,4,8,16)")
        if len(set(widths)) != len(widths):
            raise ValueError(f"widths {widths!r} repeat a width")
        object.__setattr__(self, "widths", tuple(sorted(widths)))
        if not 0 <= self.max_depth <= MAX_DEPTH:
            raise ValueError(f"max_depth {self.max_depth} is not in 0..={MAX_DEPTH}")
        if not 0 <= self.verify_depth <= MAX_DEPTH:
            raise ValueError(f"verify_depth {self.verify_depth} is not in 0..={MAX_DEPTH}")
        if self.context_len < 1:
            raise ValueError(f"context_len {self.context_len} must be at least 1 token")
        if self.repeats < 1:
            raise ValueError(f"repeats {self.repeats} must be at least 1")
        if not (self.window_s > 0 and math.isfinite(self.window_s)):
            raise ValueError(f"window_s {self.window_s} must be a positive number of seconds")
        if not (self.warmup_s >= 0 and math.isfinite(self.warmup_s)):
            raise ValueError(f"warmup_s {self.warmup_s} must be >= 0 seconds")

    @property
    def catchup_rows(self) -> int:
        """Catch-up rows the fixture keeps: the deepest draft's, catchup_rows_for(max_depth)."""
        return catchup_rows_for(self.max_depth)

    def copy_depths(self, n: int) -> range:
        """Depths of width n's copy verify cells: 1..=min(verify_depth, COPY_POOLS.max_drafts(n)).

        None without a drafter (max_depth 0: the planner copies only where it drafts) or with
        verify_depth 0. Example: max_depth 4, verify_depth 16: 1..=16 at width 1, 1..=8 at 2, 1..=6
        at 4, 1..=4 at 8, 1..=2 at 16.
        """
        if self.max_depth < 1:
            return range(0)
        return range(1, min(self.verify_depth, COPY_POOLS.max_drafts(n)) + 1)

    @property
    def deepest_copy(self) -> int:
        """The deepest copy verified at any width (0: none)."""
        return max((len(self.copy_depths(n)) for n in self.widths), default=0)  # each run starts at 1

    @property
    def deepest_verify(self) -> int:
        """The deepest verify of the sweep: max_depth, or a copy's deeper."""
        return max(self.max_depth, self.deepest_copy)

    @property
    def cache_len(self) -> int:
        """Tokens a slot must hold: context, the catch-up steps, and the deepest verify."""
        return self.context_len + self.catchup_rows + self.deepest_verify + 1


def catchup_rows_for(depth: int, drafter: str = "mtp") -> int:
    """Catch-up rows before a draft of this depth: what the drafter has yet to take after a step at it that
    accepted every draft.

    The MTP block: depth + 1, every token the step emitted. A batch's catch-up pass is padded to
    its longest row, and in a batch of several some row usually had every draft accepted (at width
    4, 5 rows instead of 2 cost a depth-4 draft step about half as much again on CPU). A single
    stream emits fewer on average (2.8 at depth 4 on the shipped recipe), so at width 1 this prices
    deep drafts a little high. A draft model: DRAFT_MODEL_CATCHUP_ROWS whatever the depth, since it
    fed its own drafts into its cache as it made them and keeps those the verify accepted.
    An EAGLE-3 head is the MTP block's case: it keeps none of its draft rows, so the accepted ones
    come back with the target's features.
    """
    return DRAFT_MODEL_CATCHUP_ROWS if drafter == "draft" else depth + 1


DRAFT_MODEL_CATCHUP_ROWS = 2  # its last draft (never fed) and the bonus token; after a rejection, 1


QUICK = SweepParams(widths=(1, 2), max_depth=2, verify_depth=3, context_len=64, repeats=3, window_s=0.03,
                    warmup_s=0.02)
"""A small sweep for tests and smoke runs: seconds, not minutes."""


@dataclass(frozen=True, slots=True)
class Task:
    """One thing timed: the verify or the draft step of cell (n, k), or the verify of k copies (a verify cell)."""

    n: int
    k: int
    step: str  # "verify" (of the MTP drafts), "draft" or "copy" (the verify of copies: no drafter pass)
    drafter: str = ""  # a joint sweep's drafter whose drafts a verify or draft task (k >= 1) times; "": the one

    @property
    def label(self) -> str:
        """The progress label: "n=1 k=2 verify", "n=1 k=2 draft", "n=1 k=2 copies"; "n=1 k=2 draft (mtp)" in a
        joint sweep."""
        label = f"n={self.n} k={self.k} {'copies' if self.step == 'copy' else self.step}"
        return f"{label} ({self.drafter})" if self.drafter else label


@dataclass(slots=True)
class Series:
    """A task's windows: steps per window and each window's per-step seconds and joules."""

    steps: int = 1
    seconds: list[float] = field(default_factory=list)
    joules: list[float] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class SweepResult:
    """The measured cells, the copies' verify cells, and what the table's [meta] should say about how."""

    cells: tuple[Cell, ...]
    meta: dict[str, object]
    verify_cells: tuple[VerifyCell, ...] = ()


def tasks(params: SweepParams, drafters: Sequence[str] = ("",)) -> list[Task]:
    """Every timed step of the sweep: a verify at each (n, k), a draft at each (n, k >= 1), a copy at each
    copy depth.

    drafters: a joint sweep's drafters (task_names): each gets its own verify and draft at every (n, k >= 1),
    while the plain step (k = 0) and the copies, which no drafter makes, are timed once for all of them.
    """
    found = []
    for n in params.widths:
        found.append(Task(n, 0, "verify"))
        for drafter in drafters:
            for k in range(1, params.max_depth + 1):
                found += [Task(n, k, "verify", drafter), Task(n, k, "draft", drafter)]
        found += [Task(n, k, "copy") for k in params.copy_depths(n)]
    return found


def task_names(kinds: Sequence[str]) -> tuple[str, ...]:
    """The drafter names a sweep's tasks carry: a joint sweep's kinds, or ("",) for a sweep of one drafter."""
    return tuple(kinds) if len(kinds) > 1 else ("",)


def check_fits(cfg: ModelConfig, params: SweepParams, block: int | None = None,
               draft: ModelConfig | None = None, eagle: bool = False) -> None:
    """ValueError, with what to change, when the sweep does not fit the model (block: a DFlash drafter's; draft: a
    draft model's config, whose context must hold the target's too; eagle: an EAGLE-3 head drafts, which covers the
    target's context)."""
    for whose, limit in (("model", cfg.max_seq_len), ("draft model", draft.max_seq_len if draft else None)):
        if limit is not None and params.cache_len > limit:
            raise ValueError(f"context_len {params.context_len} + {params.catchup_rows} catch-up rows + depth "
                             f"{params.deepest_verify} + 1 = {params.cache_len} tokens exceed the {whose}'s "
                             f"max_seq_len {limit}; lower --context-len, --max-depth or --verify-depth")
    if draft is not None or eagle:
        return  # the draft model and the EAGLE-3 head draft as deep as asked
    if block is not None:
        if params.max_depth > block:
            raise ValueError(f"--max-depth {params.max_depth} exceeds the DFlash drafter's block of {block}")
        if params.deepest_copy:
            raise ValueError("a DFlash table prices its block drafter's steps; verify cells price the copies of the "
                             "MTP drafter's planner: pass --verify-depth 0")
    elif params.max_depth and cfg.mtp_depth == 0:
        raise ValueError("the model has no MTP module to draft with; pass --max-depth 0")


def measure(model: Transformer, meter: Meter, params: SweepParams,
            on_window: Callable[[int, int, str], None] = lambda done, total, label: None,
            dflash: DflashDrafter | None = None, draft_model: Transformer | None = None,
            eagle: Eagle3Head | None = None) -> SweepResult:
    """Time every cell of the sweep on `model` with `meter`; `on_window(done, total, label)` reports progress.

    dflash: time its block draft step instead of the MTP one (the verify steps score its drafts);
    draft_model, eagle: likewise, the draft model's or the EAGLE-3 head's draft step.
    """
    results = measure_joint(model, meter, params, on_window, dflash, draft_model, eagle, with_mtp=False)
    return next(iter(results.values()))


def measure_joint(model: Transformer, meter: Meter, params: SweepParams,
                  on_window: Callable[[int, int, str], None] = lambda done, total, label: None,
                  dflash: DflashDrafter | None = None, draft_model: Transformer | None = None,
                  eagle: Eagle3Head | None = None, with_mtp: bool = True) -> dict[str, SweepResult]:
    """Each drafter's cells, timed in one sweep: {kind: its SweepResult}, kinds in step_fixture.DRAFTERS order.

    The drafters are those given, and the model's MTP module with_mtp (or when none is given). One
    runner holds them all, as a serve choosing among them does; each drafter's verify and draft
    cells (k >= 1) are its own, while the plain step (k = 0) and the copies' verify cells are timed
    once and shared: the tables then price a plain step and a copy alike, so a planner choosing
    among the drafters compares their drafts and not two sweeps' noise.
    """
    cfg = model.cfg
    check_fits(cfg, params, dflash.block if dflash is not None else None,
               draft_model.cfg if draft_model is not None else None, eagle is not None)
    if with_mtp and (draft_model is not None or eagle is not None):
        check_fits(cfg, params)  # the MTP module drafts too
    runner = runner_for(model, max(params.widths), params.cache_len, dflash, draft_model, eagle, with_mtp)
    kinds = drafters_of(runner)
    names = task_names(kinds)
    kind_of = dict(zip(names, kinds)) | {"": kinds[0]}
    gen = torch.Generator().manual_seed(params.seed)
    vocab = min(cfg.vocab_size, 256)  # byte tokens: any text's, never BOS/EOS
    prompts = torch.randint(0, vocab, (max(params.widths), params.context_len), generator=gen).tolist()
    # Ragged as a serve's batch is: rows at different positions take the masked attention path, as they do there.
    prompts = [p[: max(1, params.context_len - i)] for i, p in enumerate(prompts)]
    fixture = StepFixture(runner, prompts, params.catchup_rows, kinds[0])
    todo = tasks(params, names)
    window_s = max(params.window_s, meter.min_window_s)
    total = len(todo) * (params.repeats + 1)
    series: dict[Task, Series] = {}
    done = 0
    for task in todo:  # warm up each cell and size its window
        series[task] = Series(_steps_for(fixture, task, params, window_s, kind_of[task.drafter]))
        done += 1
        on_window(done, total, f"warm-up {task.label}")
    groups = {n: [t for t in todo if t.n == n] for n in params.widths}
    order = random.Random(params.seed)
    for repeat in range(params.repeats):
        for task in visit_order(groups, order):
            reading, steps = _window(_step(fixture, task, kind_of[task.drafter]), meter, series[task].steps)
            series[task].seconds.append(reading.seconds / steps)
            if reading.joules is not None:
                series[task].joules.append(reading.joules / steps)
            done += 1
            on_window(done, total, f"repeat {repeat + 1}/{params.repeats} {task.label}")
    seconds = paired_seconds({t: series[t].seconds for t in todo})
    energy = meter.source != "none"
    verify_cells = tuple(_verify_cell(n, k, series, seconds, energy)
                         for n in params.widths for k in params.copy_depths(n))
    steps = [series[t].steps for t in todo]
    meta = {"context_len": params.context_len, "repeats": params.repeats, "window_s": window_s,
            "warmup_s": params.warmup_s, "steps_per_window_min": min(steps), "steps_per_window_max": max(steps),
            "cell_order": f"per repeat, widths shuffled, each width's steps back to back, shuffled "
                          f"(seed {params.seed})",
            "figure": "seconds: median over repeats of window cost / steps over the geometric mean of its width's "
                      "windows that repeat, times the median of those means; joules: median over repeats",
            "spread": "interquartile range of the raw windows over repeats, same unit"}
    if verify_cells:
        meta["verify_cells"] = (
            f"depths 1..=min({params.verify_depth}, COPY_POOLS) per width: the verify of each sequence's last k "
            "prompt tokens (copies, no drafter pass), windowed and paired as the other steps")
    if len(kinds) > 1:
        meta["joint_sweep"] = joint_note(kinds)
    results = {}
    for name in names:
        kind = kind_of[name]
        cells = tuple(_cell(n, k, series, seconds, energy, name)
                      for n in params.widths for k in range(params.max_depth + 1))
        catchup = (f"{DRAFT_MODEL_CATCHUP_ROWS} before a draft of any depth" if kind == "draft" else
                   "depth + 1 before a draft of that depth") + " (all of a step's drafts accepted)"
        results[kind] = SweepResult(cells, {**meta, "catchup_rows": catchup}, verify_cells)
    return results


def joint_note(kinds: Sequence[str]) -> str:
    """The [meta] joint_sweep line of a table measured beside other drafters' (kinds: all of them)."""
    return (f"one sweep timed the drafts of {', '.join(kinds)}; the plain step (k = 0) and the copies' verify cells "
            "were timed once, and every one of their tables holds the same figures for them")


def _step(fixture: StepFixture, task: Task, drafter: str) -> Callable[[], None]:
    """The task's step as a no-argument call (drafts are made once, outside any window; drafter: whose)."""
    if task.step == "draft":
        return lambda: fixture.draft_step(task.n, task.k, catchup_rows_for(task.k, drafter), drafter)
    drafts = fixture.copies(task.n, task.k) if task.step == "copy" else fixture.drafts(task.n, task.k, drafter)
    return lambda: fixture.verify_step(task.n, drafts)


def _steps_for(fixture: StepFixture, task: Task, params: SweepParams, window_s: float, drafter: str) -> int:
    """Warm the cell up for params.warmup_s (at least two steps), then the steps that fill a window."""
    step, warmup_s = _step(fixture, task, drafter), params.warmup_s
    clock = WallMeter(device_sync(str(fixture.runner.device)))  # sizes windows; never gives a figure
    ran, start = 0, time.perf_counter()
    while ran < 2 or time.perf_counter() - start < warmup_s:
        step()
        ran += 1
    probe = max(1, min(ran, 8))
    clock.start()
    for _ in range(probe):
        step()
    per_step = max(clock.stop().seconds / probe, 1e-9)
    return max(3, min(MAX_STEPS_PER_WINDOW, math.ceil(window_s / per_step)))


def _window(step: Callable[[], None], meter: Meter, steps: int) -> tuple[Reading, int]:
    """One measured window of `steps` identical steps (after one untimed step to settle caches)."""
    for attempt in range(ENERGY_RETRIES + 1):
        step()
        meter.start()
        for _ in range(steps):
            step()
        try:
            return meter.stop(), steps
        except EnergyReadError:
            if attempt == ENERGY_RETRIES:
                raise
            steps *= 2
    raise AssertionError("unreachable")


def visit_order(groups: dict[int, list[T]], order: random.Random) -> list[T]:
    """One repeat's visits: the widths shuffled, each width's group (tasks or cells) back to back, shuffled."""
    widths = list(groups)
    order.shuffle(widths)
    visits = []
    for n in widths:
        group = groups[n][:]
        order.shuffle(group)
        visits += group
    return visits


def paired_seconds(windows: dict[Task, list[float]]) -> dict[Task, float]:
    """Each task's figure, paired with the other tasks of its width (window r of each timed back to back).

    See the module docstring. Example: two tasks of one width whose windows are (1, 2) and (2, 4)
    seconds: both repeats have ratios 1/sqrt(2) and sqrt(2) to their geometric means (sqrt(2),
    2sqrt(2)), whose median is 1.5 sqrt(2): figures 1.5 and 3.0.
    """
    figures: dict[Task, float] = {}
    for n in sorted({t.n for t in windows}):
        figures |= _paired_width({t: w for t, w in windows.items() if t.n == n})
    return figures


def _paired_width(windows: dict[Task, list[float]]) -> dict[Task, float]:
    repeats = {len(w) for w in windows.values()}
    if len(repeats) != 1 or not repeats.pop():
        raise ValueError("every task of a width needs the same number of windows, at least one")
    means = [math.exp(statistics.fmean(math.log(w[r]) for w in windows.values()))
             for r in range(len(next(iter(windows.values()))))]
    scale = statistics.median(means)
    return {task: statistics.median(x / m for x, m in zip(w, means)) * scale for task, w in windows.items()}


def _cell(n: int, k: int, series: dict[Task, Series], seconds: dict[Task, float], energy: bool,
          drafter: str = "") -> Cell:
    """The drafter's cell's figures and spreads; at k = 0 nothing is drafted, so its draft costs are exactly 0 (and
    its plain step is every drafter's)."""
    mine = drafter if k else ""
    verify = series[Task(n, k, "verify", mine)]
    draft = series.get(Task(n, k, "draft", mine))
    values: dict[str, float | None] = {
        "verify_s": round_figure(seconds[Task(n, k, "verify", mine)]), "verify_s_spread": iqr(verify.seconds),
        "draft_s": round_figure(seconds[Task(n, k, "draft", mine)]) if draft else 0.0,
        "draft_s_spread": iqr(draft.seconds) if draft else 0.0}
    if energy:
        values |= {"verify_j": _median(verify.joules), "verify_j_spread": iqr(verify.joules),
                   "draft_j": _median(draft.joules) if draft else 0.0,
                   "draft_j_spread": iqr(draft.joules) if draft else 0.0}
    return Cell(n, k, **values)


def _verify_cell(n: int, k: int, series: dict[Task, Series], seconds: dict[Task, float], energy: bool) -> VerifyCell:
    """A copy verify cell's figures and spreads (its verify alone: no draft was made)."""
    task = Task(n, k, "copy")
    verify = series[task]
    joules = {"verify_j": _median(verify.joules), "verify_j_spread": iqr(verify.joules)} if energy else {}
    return VerifyCell(n, k, round_figure(seconds[task]), verify_s_spread=iqr(verify.seconds), **joules)


def _median(values: list[float]) -> float:
    return round_figure(statistics.median(values))


def iqr(values: list[float]) -> float:
    """Interquartile range of repeated measurements (0 for fewer than two)."""
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return round_figure(max(0.0, q3 - q1))


def round_figure(value: float) -> float:
    """Five significant digits: far finer than any window repeats, and a table diff stays readable."""
    return float(f"{value:.5g}")
