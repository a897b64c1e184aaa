"""`met bench policies`' run: one workload through the scheduler under each drafting policy, interleaved.

Every policy is driven through the same engine path a serve uses, in-process and without HTTP:
a fresh Scheduler (fresh policy state and shared lookup cache) over one ModelRunner per
concurrency, every request submitted at once into `concurrency` slots, so that many are in
flight until the queue runs dry; the calling thread ticks it until the last request finishes.
A run's tokens/s is its completion tokens over the wall seconds from the first submit to the
last finish (prefill, admission and streaming included, the same for every policy).
Runs go repeat by repeat, each concurrency in turn, the policies in order within it, the order
reversed every other repeat (A B C C B A A B C ...): a drift of the box's speed falls on every
policy alike, and a steady one favours no policy for running first. One short warm-up run per
policy and concurrency comes first and is not kept. The draft-* policies draft with a draft model
(a smaller model of the recipe's tokenizer) in the MTP module's place, through the same policies:
its runners hold it beside the model for every policy, so every policy's runs pay the same
bookkeeping and only the draft-* ones draft with it. The eagle-* policies do the same with an
EAGLE-3 head. A choice (`<choice>-measured`, as met serve --spec <choice>: mtp+draft-measured,
mtp+eagle-measured, draft+eagle-measured, mtp+draft+eagle-measured) plans every step with each
drafter's measured planner and runs the best plan.
"""

import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from met.engine import heap
from met.engine.policy import CHOICES, DRAFT_DEPTH, choice_drafters
from met.engine.policy_choice import DrafterChoicePolicy
from met.engine.policy_base import Outcome, PlainPolicy, Policy, StepPlan, drafter_width
from met.engine.policy_dflash import DflashPolicy, RunnerDflash
from met.engine.policy_lookup import LookupPolicy
from met.engine.policy_mtp import MtpFixedPolicy, MtpLadderPolicy, MtpPlannedPolicy
from met.engine.requests import Delta, Event, Failed, Finished, Request, SeqState
from met.engine.runner import Draft, ModelRunner
from met.engine.scheduler import Scheduler
from met.model.corpus import heldout_code
from met.model.dflash import DflashDrafter
from met.model.eagle3 import Eagle3Head
from met.model.tokenizer import BYTES, Tokenizer, encode
from met.model.transformer import Transformer
from met.speculative.spec_capacity import VerifyPools
from met.speculative.spec_cost import SpecCostState

FIXED_DEPTHS = (1, 2, 3, 4)
POLICIES = ("off", *(f"fixed-{k}" for k in FIXED_DEPTHS), "static", "prompt-lookup", "measured")  # the default set
CHOICE_POLICY = "mtp+draft-measured"  # both measured planners, the better plan each step (met serve --spec mtp+draft)
# A choice among measured planners: `<serve --spec choice>-measured` (met.engine.policy.CHOICES), one rule for all
CHOICE_POLICIES = tuple(f"{spec}-measured" for spec in CHOICES)
# the draft model's, as the MTP ones, and the choice between it and MTP
DRAFT_POLICIES = (*(f"draft-fixed-{k}" for k in FIXED_DEPTHS), "draft-measured", CHOICE_POLICY)
EAGLE_POLICIES = (*(f"eagle-fixed-{k}" for k in FIXED_DEPTHS), "eagle-measured")  # an EAGLE-3 head's, likewise
# run only when named: the recipe's DFlash block drafter (met serve --spec dflash), the choices naming an EAGLE-3
# head; the draft-* ones also by default when a draft model is given (met serve --spec draft --draft-model), the
# eagle-* ones and the choice among every drafter given when a head is (met serve --spec eagle --drafter FOLDER)
OPTIONAL_POLICIES = ("dflash", *DRAFT_POLICIES, *EAGLE_POLICIES, *CHOICE_POLICIES[1:])
OWN_DRAFTERS = {"draft": "a draft model (--draft-model NAME|PATH)", "eagle": "an EAGLE-3 head (--eagle FOLDER)"}
CHOICES = POLICIES + OPTIONAL_POLICIES  # every name --policies takes
LOOKUP_DEPTH = 4  # prompt lookup's most drafts per step: the serve's --lookup-depth default
WARMUP_TOKENS = 8  # tokens per request of the warm-up run (enough for every step kind to run)
PROMPT_OFFSET, PROMPT_BYTES = 1024, 256  # from byte 1024 of each held-out file: the calibration saw the openings

PolicyFactory = Callable[[], Policy]  # a fresh policy (fresh gate, rung, windows) for each run
Progress = Callable[[int, int, str], None]  # (runs done, runs in all, the last run's label)


def heldout_workload_prompts(count: int) -> list[tuple[int, ...]]:
    """The workload's prompts: up to `count` held-out code files, PROMPT_BYTES from the first line start after
    PROMPT_OFFSET, as byte tokens (fewer where fewer files are long enough)."""
    return [tuple(encode(t)) for t in heldout_code(count, PROMPT_OFFSET, PROMPT_BYTES)]


@dataclass(frozen=True, slots=True)
class Workload:
    """The prompts (token ids), tokens per request, concurrencies and repeats every policy runs."""

    prompts: tuple[tuple[int, ...], ...]
    max_tokens: int
    concurrencies: tuple[int, ...]
    repeats: int

    def __post_init__(self) -> None:
        if not self.prompts or any(not p for p in self.prompts):
            raise ValueError("the workload needs at least one prompt, and no prompt may be empty")
        if self.max_tokens < 1:
            raise ValueError(f"max tokens must be at least 1, got {self.max_tokens}")
        if not self.concurrencies or any(c < 1 for c in self.concurrencies):
            raise ValueError(f"concurrencies must be positive, got {self.concurrencies}")
        if len(set(self.concurrencies)) != len(self.concurrencies):
            raise ValueError(f"concurrencies {self.concurrencies} repeat one")
        if self.repeats < 1:
            raise ValueError(f"repeats must be at least 1, got {self.repeats}")


def policy_drafters(name: str) -> tuple[str, ...]:
    """The recursive drafters a policy drafts with: ("draft",) for draft-fixed-2, ("mtp", "eagle") for
    mtp+eagle-measured, ("mtp",) for the MTP ones; () for off, prompt-lookup and dflash."""
    if name in CHOICE_POLICIES:
        return choice_drafters(name.removesuffix("-measured"))
    if name in ("off", "prompt-lookup", "dflash"):
        return ()
    kind = name.partition("-")[0]
    return (kind,) if kind in OWN_DRAFTERS else ("mtp",)


def policy_factories(names: Sequence[str], num_drafts: int, pools: VerifyPools, cost_state: SpecCostState | None,
                     environ: Mapping[str, str], dflash_block: int | None = None, draft_model: bool = False,
                     draft_state: SpecCostState | None = None, eagle: bool = False,
                     eagle_state: SpecCostState | None = None) -> dict[str, PolicyFactory]:
    """A factory per policy name (POLICIES, OPTIONAL_POLICIES), built as the serve builds its policies.

    ValueError naming the problem. dflash_block: the block of the DFlash drafter the runners hold
    (policy dflash needs one); its verify pools are the DFlash rung's, not `pools`, as in the serve.
    draft_model: whether the runners hold a draft model (the draft-* policies need one; it drafts at
    most DRAFT_DEPTH, as the serve's default --draft-depth); draft_state: its table and calibration
    (draft-measured needs them); eagle, eagle_state: the same of an EAGLE-3 head (eagle-*). A choice
    needs the state of every drafter it names.
    """
    states = {"mtp": cost_state, "draft": draft_state, "eagle": eagle_state}
    held = {"mtp": num_drafts >= 1, "draft": draft_model, "eagle": eagle}
    depths = {"mtp": num_drafts, "draft": DRAFT_DEPTH, "eagle": DRAFT_DEPTH}
    out: dict[str, PolicyFactory] = {}
    for name in names:
        if name in CHOICE_POLICIES:
            out[name] = _choice_factory(name, pools, states, held, depths)
        elif name in DRAFT_POLICIES or name in EAGLE_POLICIES:
            out[name] = _own_factory(name, pools, states, held)
        elif name == "off":
            out[name] = PlainPolicy
        elif name.startswith("fixed-") and name in POLICIES:
            depth = int(name.removeprefix("fixed-"))
            MtpFixedPolicy(depth, num_drafts, pools)  # refuses a depth the model cannot draft, now
            out[name] = lambda depth=depth: MtpFixedPolicy(depth, num_drafts, pools)
        elif name == "static":
            out[name] = lambda: MtpLadderPolicy(num_drafts, pools, environ)
        elif name == "prompt-lookup":
            out[name] = lambda: LookupPolicy("prompt-lookup", LOOKUP_DEPTH, pools)
        elif name == "measured":
            if cost_state is None:
                raise ValueError("policy 'measured' needs the cost table and calibration")
            out[name] = lambda: MtpPlannedPolicy(cost_state, num_drafts, pools)
        elif name == "dflash":
            if dflash_block is None:
                raise ValueError("policy 'dflash' needs the recipe's DFlash drafter (met model train --drafter dflash)")
            out[name] = lambda: DflashPolicy(RunnerDflash(dflash_block))
        else:
            raise ValueError(f"unknown policy {name!r}; choose from {', '.join(CHOICES)}")
        if num_drafts < 1 and policy_drafters(name) == ("mtp",):
            raise ValueError(f"policy {name!r} drafts with MTP, but the model has no MTP module")
    return out


def _own_factory(name: str, pools: VerifyPools, states: Mapping[str, SpecCostState | None],
                 held: Mapping[str, bool]) -> PolicyFactory:
    """A draft-* or eagle-* policy: the MTP policy of the same name drafting with the runners' draft model or
    EAGLE-3 head, which drafts at most DRAFT_DEPTH (measured: from its own table and calibration)."""
    kind, _, rest = name.partition("-")
    if not held[kind]:
        raise ValueError(f"policy {name!r} drafts with {OWN_DRAFTERS[kind]}; give one")
    if rest == "measured":
        if (state := states[kind]) is None:
            raise ValueError(f"policy {name!r} needs the {_WHOSE[kind]}'s cost table and calibration")
        return lambda: MtpPlannedPolicy(state, DRAFT_DEPTH, pools, kind)
    depth = int(rest.removeprefix("fixed-"))
    return lambda: MtpFixedPolicy(depth, DRAFT_DEPTH, pools, kind)


_WHOSE = {"mtp": "MTP module", "draft": "draft model", "eagle": "EAGLE-3 head"}


def _choice_factory(name: str, pools: VerifyPools, states: Mapping[str, SpecCostState | None],
                    held: Mapping[str, bool], depths: Mapping[str, int]) -> PolicyFactory:
    """A choice: each drafter's measured planner, the best plan of each step run (met serve --spec <choice>)."""
    drafters = policy_drafters(name)
    for d in drafters:
        if not held[d]:
            what = "a model with an MTP module" if d == "mtp" else OWN_DRAFTERS[d]
            raise ValueError(f"policy {name!r} chooses among {', '.join(_WHOSE[x] for x in drafters)}: it drafts "
                             f"with {what}; give one")
        if states[d] is None:
            raise ValueError(f"policy {name!r} needs the {_WHOSE[d]}'s cost table and calibration")
    return lambda: DrafterChoicePolicy([MtpPlannedPolicy(states[d], depths[d], pools, d) for d in drafters])


@dataclass(frozen=True, slots=True)
class Output:
    """One request's result: its text, its generated token ids and any failure."""

    text: str
    tokens: tuple[int, ...] | None  # EOS not included; None: the request ended at prefill, before any step saw it
    failure: str | None = None


@dataclass(frozen=True, slots=True)
class Run:
    """One policy at one concurrency in one repeat: time, tokens, speculation counts, priced steps, outputs."""

    policy: str
    concurrency: int
    repeat: int
    tokens: int  # completion tokens of every request
    seconds: float  # wall seconds from the first submit to the last finish
    proposed: int  # drafts verified
    accepted: int  # drafts accepted (the bonus token is not a draft)
    verify_seq_steps: int  # sequence-steps that verified at least one draft
    emitted_in_verify: int  # tokens those sequence-steps emitted: accepted drafts + one bonus each
    proposed_at: tuple[int, ...]  # per draft position: sequence-steps that verified a draft there
    accepted_at: tuple[int, ...]  # of those, how many had drafts 0..=i all accepted
    # (mode, width, deepest drafts verified, sequences the drafter drafted for, how many steps): a mixed
    # step's copies are verified but not drafted, so its draft is priced at the drafted width
    steps: tuple[tuple[str, int, int, int, int], ...]
    step_tokens: int  # tokens emitted by decode/verify steps (the first token of each request comes from prefill)
    step_seconds: float  # wall seconds of those steps' draft + verify (no prefill, admission or streaming)
    outputs: tuple[Output, ...]  # per prompt, in workload order


class StepRecord(NamedTuple):
    """One step as the recorder saw it: drafts verified per sequence, the draft call's and the step's seconds."""

    proposed: tuple[int, ...]
    draft_s: float
    step_s: float  # the scheduler's draft + verify wall time
    planned_at: float  # perf_counter when the scheduler asked for the step's plan: one per tick


class _Recorder:
    """Passes every call to the policy it wraps; notes each step's shape, timing and the sequences it saw."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.name = policy.name  # the scheduler wires host drafting by name
        self.copies = policy.copies  # and indexes histories (and other requests') for a policy that copies
        self.shapes: Counter = Counter()
        self.seen: dict[str, SeqState] = {}
        self.steps: list[StepRecord] = []
        self._draft_s = 0.0
        self._drafted = 0  # sequences the step's drafter drafted for, as the scheduler prices the step
        self._planned_at = 0.0

    @property
    def seconds(self) -> float:
        """The scheduler's draft + verify wall time of every step."""
        return sum(s.step_s for s in self.steps)

    def plan(self, runner: ModelRunner, seqs: Sequence[SeqState]) -> StepPlan:
        self._planned_at = time.perf_counter()
        for s in seqs:
            self.seen.setdefault(s.request.id, s)
        return self.policy.plan(runner, seqs)

    def draft(self, runner: ModelRunner, seqs: Sequence[SeqState], plan: StepPlan) -> list[Draft]:
        start = time.perf_counter()
        drafts = self.policy.draft(runner, seqs, plan)
        self._draft_s = time.perf_counter() - start
        self._drafted = drafter_width(drafts)
        return drafts

    def observe(self, plan: StepPlan, outcomes: Sequence[Outcome], seconds: float) -> None:
        self.shapes[plan.mode, len(outcomes), max((o.proposed for o in outcomes), default=0), self._drafted] += 1
        self.steps.append(StepRecord(tuple(o.proposed for o in outcomes), self._draft_s, seconds, self._planned_at))
        self.policy.observe(plan, outcomes, seconds)


class _Sink:
    """Collects one request's text and its final event on the scheduler's (the calling) thread."""

    __slots__ = ("parts", "end", "done")

    def __init__(self, done: list[int]) -> None:
        self.parts: list[str] = []
        self.end: Finished | Failed | None = None
        self.done = done  # shared by a run's sinks: [requests ended]

    def put(self, event: Event) -> None:
        if isinstance(event, Delta):
            self.parts.append(event.text)
            return
        if isinstance(event, Finished):
            self.parts.append(event.text)
        self.end = event
        self.done[0] += 1


def run_once(runner: ModelRunner, policy: Policy, model_id: str, prompts: Sequence[Sequence[int]],
             max_tokens: int, tokenizer: Tokenizer = BYTES) -> tuple[float, Scheduler, _Recorder, list[_Sink]]:
    """Every prompt through a fresh scheduler over `runner` (its slots are the concurrency); wall seconds and all."""
    recorder = _Recorder(policy)
    scheduler = Scheduler(runner, recorder, model_id, tokenizer=tokenizer)
    done = [0]
    sinks = [_Sink(done) for _ in prompts]
    t0 = time.perf_counter()
    for i, (prompt, sink) in enumerate(zip(prompts, sinks)):
        scheduler.submit(Request(str(i), tuple(prompt), max_tokens), sink)
    for _ in range(len(prompts) * (max_tokens + 1) + 16):  # each busy tick emits a token to every running request
        if done[0] == len(sinks):
            break
        scheduler.tick()
    return time.perf_counter() - t0, scheduler, recorder, sinks


def measure_run(runner: ModelRunner, name: str, factory: PolicyFactory, model_id: str, workload: Workload,
                repeat: int) -> Run:
    """One kept run of a policy at the runner's concurrency, with its counts and outputs."""
    seconds, sched, recorder, sinks = run_once(runner, factory(), model_id, workload.prompts, workload.max_tokens)
    outputs = []
    for i, sink in enumerate(sinks):
        seq = recorder.seen.get(str(i))
        tokens = tuple(seq.generated) if seq is not None else None
        failure = (sink.end.message if isinstance(sink.end, Failed) else
                   "the request never finished: the scheduler stopped emitting its tokens" if sink.end is None else None)
        outputs.append(Output("".join(sink.parts), tokens, failure))
    s = sched.stats
    return Run(name, runner.cache.max_batch, repeat,
               sum(k.end.completion_tokens for k in sinks if isinstance(k.end, Finished)), seconds,
               s.proposed, s.accepted, s.verify_seq_steps, s.emitted, tuple(s.proposed_at), tuple(s.accepted_at),
               tuple(sorted((*shape, n) for shape, n in recorder.shapes.items())), s.step_streamed,
               recorder.seconds, tuple(outputs))


def run_all(model: Transformer, model_id: str, factories: Mapping[str, PolicyFactory], workload: Workload,
            progress: Progress | None = None, dflash: DflashDrafter | None = None,
            draft_model: Transformer | None = None, eagle: Eagle3Head | None = None) -> list[Run]:
    """Warm-up, then every policy at every concurrency, interleaved over the repeats (see the module's docstring).

    dflash: the block drafter the runners hold for policy dflash (None: no runner has one);
    draft_model: the draft model they hold for the draft-* policies (its context bounds theirs); eagle:
    the EAGLE-3 head they hold for the eagle-* ones. A choice's runners hold every drafter it names.
    """
    context = model.cfg.max_seq_len if draft_model is None else min(model.cfg.max_seq_len, draft_model.cfg.max_seq_len)
    runners = {c: ModelRunner(model, c, context, dflash=dflash, draft_model=draft_model, eagle=eagle)
               for c in workload.concurrencies}
    heap.settle()  # as met serve: the collector's full passes scan what the runs allocate, not the model's heap
    total = len(factories) * len(runners) * (workload.repeats + 1)
    done = 0
    for c, runner in runners.items():
        warm = workload.prompts[: max(1, c)]
        for name, factory in factories.items():
            run_once(runner, factory(), model_id, warm, min(WARMUP_TOKENS, workload.max_tokens))
            done += 1
            if progress:
                progress(done, total, f"warm-up {name} c={c}")
    runs = []
    for repeat in range(workload.repeats):
        order = list(factories.items())
        if repeat % 2:
            order.reverse()
        for c, runner in runners.items():
            for name, factory in order:
                runs.append(measure_run(runner, name, factory, model_id, workload, repeat))
                done += 1
                if progress:
                    progress(done, total, f"repeat {repeat + 1}/{workload.repeats} {name} c={c}")
    return runs
