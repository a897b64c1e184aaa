"""Offline generation: prompts run to completion through the scheduler `met serve` runs, under one fixed policy.

`met generate`, the model card's acceptance and the benchmarks' peer comparisons drive the same
Scheduler as `met serve` and `met bench policies`, on the calling thread: every prompt is
submitted at once into the runner's slots (continuous batching: a prompt starts when a slot
frees), and the scheduler ticks until the last one finishes. The policy is fixed: `depth` drafts
per step at every width (MTP, a draft model, an EAGLE-3 head, n-gram or prompt lookup), or the
DFlash rung's choice; the clamps (KV room, tokens left) are the serve's. Each request's counts
are the scheduler's SpecStats, one per request, fed from the outcomes the policy observes; its
timings come from the clock the scheduler reads.
"""

import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field

from met.engine.policy_base import Outcome, PlainPolicy, Policy, StepPlan
from met.engine.policy_dflash import DflashPolicy, RunnerDflash
from met.engine.policy_lookup import LookupPolicy
from met.engine.policy_mtp import MtpFixedPolicy
from met.engine.proposer import HOST_MODES, NGRAM_MAX, SPEC_MODES, Proposer
from met.engine.requests import Event, Failed, Finished, Request, SeqState
from met.engine.runner import Draft, ModelRunner, Sampling
from met.engine.scheduler import Scheduler
from met.model.tokenizer import EOS
from met.speculative.dflash_rung import DflashRung
from met.speculative.spec_capacity import VerifyPools
from met.speculative.spec_stats import SpecStats

__all__ = ["NGRAM_MAX", "SPEC_MODES", "Output", "Proposer", "generate", "generate_each"]

EVERY_WIDTH = 1 << 31  # a fixed depth is drafted at every width (offline batches may be far wider than a serve's)


@dataclass
class Output:
    """One prompt's generation, its speculation counts and timings."""

    prompt: list[int]
    tokens: list[int] = field(default_factory=list)  # generated tokens (EOS not included)
    stats: SpecStats = field(default_factory=SpecStats)  # this request's sequence-steps, drafts and acceptance
    decode_s: float = 0.0  # the run's decode wall time, from the first request's first step to the last finish
    finished_s: float = 0.0  # decode wall time from this request's first step until it finished (0: at prefill)
    prefill_s: float = 0.0  # the wall time of the prefill that admitted it (its admission tick until its first step)
    finished_by: str = "length"  # "eos" (an end-of-sequence id) or "length" (max_tokens or a full context)
    gammas: list[int] = field(default_factory=list)  # --spec dflash: each step's verify width K, cut to the block
    capped: int = 0  # --spec dflash: steps whose gamma the drafter's block cut (the rung chose more than it drafts)
    _started: float | None = field(default=None, repr=False)  # clock() at its first step

    @property
    def steps(self) -> int:
        """Verify (or plain decode) steps this sequence took part in."""
        return self.stats.seq_steps

    @property
    def proposed(self) -> int:
        """Drafts verified."""
        return self.stats.proposed

    @property
    def accepted(self) -> int:
        """Drafts accepted; the bonus token is not a draft."""
        return self.stats.accepted

    @property
    def proposed_at(self) -> list[int]:
        """proposed_at[j]: steps that verified a draft j+1."""
        return self.stats.proposed_at

    @property
    def accepted_at(self) -> list[int]:
        """accepted_at[j]: steps whose drafts 1..j+1 were all accepted."""
        return self.stats.accepted_at


def fixed_policy(runner: ModelRunner, spec: str, depth: int, rung: DflashRung | None = None,
                 lookup_min: int = 1) -> Policy:
    """The policy of a fixed --spec and --depth: off, mtp, the draft model, the EAGLE-3 head or a host proposer at
    `depth` drafts, dflash by its rung."""
    if spec == "dflash":
        if runner.dflash is None:
            raise ValueError("--spec dflash needs a runner with a DFlash drafter (ModelRunner(..., dflash=drafter))")
        block = runner.dflash.block  # the rung's gamma at every width, cut to the block: no verify-pool clamp
        return DflashPolicy(RunnerDflash(block), VerifyPools(((EVERY_WIDTH, block),)), rung or DflashRung())
    if spec == "off" or depth == 0:
        return PlainPolicy()
    pools = VerifyPools(((EVERY_WIDTH, depth),))  # no verify-pool clamp: the KV room and tokens left still clamp
    if spec == "mtp":
        return MtpFixedPolicy(depth, depth, pools)  # the MTP module drafts recursively, as deep as asked
    if spec == "draft":
        if runner.draft_model is None:
            raise ValueError("--spec draft needs a runner with a draft model (ModelRunner(..., draft_model=model))")
        return MtpFixedPolicy(depth, depth, pools, "draft")
    if spec == "eagle":
        if runner.eagle is None:
            raise ValueError("--spec eagle needs a runner with an EAGLE-3 head (ModelRunner(..., eagle=head))")
        return MtpFixedPolicy(depth, depth, pools, "eagle")
    if spec in HOST_MODES:
        return LookupPolicy(spec, depth, pools, lookup_min)
    raise ValueError(f"unknown spec mode {spec!r}; choose one of {', '.join(SPEC_MODES)}")


def generate(runner: ModelRunner, prompts: list[list[int]], max_tokens: int, spec: str = "off", depth: int = 3,
             sampling: Sampling | Sequence[Sampling] = Sampling(), stop_at_eos: bool = True,
             eos_ids: Collection[int] = (EOS,), rung: DflashRung | None = None,
             lookup_min: int = 1) -> list[Output]:
    """Generate up to max_tokens per prompt through the scheduler, in the runner's slots, drafting depth per step.

    sampling: one for every prompt, or one per prompt (a seed each, say).
    eos_ids: the tokens that end a sequence (the tokenizer's; the byte tokenizer's EOS by default).
    spec "dflash": the DFlash rung picks each step's depth (gamma) from the batch width and, for a
    single stream, the first-draft accept rate (`rung`, default DflashRung()); `depth` is not used.
    """
    outs: list[Output] = [Output(list(p)) for p in prompts]
    for i, out in generate_each(runner, prompts, max_tokens, spec, depth, sampling, stop_at_eos, eos_ids, rung,
                                lookup_min):
        outs[i] = out
    return outs


def generate_each(runner: ModelRunner, prompts: list[list[int]], max_tokens: int, spec: str = "off",
                  depth: int = 3, sampling: Sampling | Sequence[Sampling] = Sampling(), stop_at_eos: bool = True,
                  eos_ids: Collection[int] = (EOS,), rung: DflashRung | None = None,
                  lookup_min: int = 1) -> Iterator[tuple[int, Output]]:
    """generate's outputs as their requests finish: (prompt index, Output); the decode_s of each is the run's so far."""
    if spec not in SPEC_MODES:
        raise ValueError(f"unknown spec mode {spec!r}; choose one of {', '.join(SPEC_MODES)}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    samplings = [sampling] * len(prompts) if isinstance(sampling, Sampling) else list(sampling)
    if len(samplings) != len(prompts):
        raise ValueError(f"{len(samplings)} samplings for {len(prompts)} prompts")
    clock = time.perf_counter  # read here, so that a test's clock is the scheduler's too
    counted = _Counted(fixed_policy(runner, spec, depth, rung, lookup_min), clock,
                       runner.dflash.block if spec == "dflash" else None)
    ends = frozenset(eos_ids) if stop_at_eos else frozenset()
    scheduler = Scheduler(runner, counted, "generate@offline", clock=clock, tokenizer=_TokenIds(ends))
    sinks = []
    for i, (prompt, s) in enumerate(zip(prompts, samplings)):
        out = counted.outs[str(i)] = Output(list(prompt))
        sinks.append(_Sink(out, clock))
        # the tokenizer's EOS is not the run's: `ends` (none with stop_at_eos False) is what ends a sequence
        scheduler.submit(Request(str(i), tuple(prompt), max_tokens, s, stop_ids=ends, ignore_eos=True), sinks[-1])
    done = set()
    while len(done) < len(sinks):
        counted.tick_started = clock()
        scheduler.tick()
        for i, sink in enumerate(sinks):
            if sink.end is not None and i not in done:
                done.add(i)
                yield i, _finished(sink, counted, clock())


def _finished(sink: "_Sink", counted: "_Counted", now: float) -> Output:
    out, end = sink.out, sink.end
    if isinstance(end, Failed):
        raise RuntimeError(f"generation failed: {end.message}")
    out.tokens = list(end.tokens)
    out.finished_by = "eos" if end.reason == "stop" else "length"
    if out._started is None:  # it finished at prefill: its admission tick was all prefill
        out.prefill_s = sink.at - counted.tick_started
    else:
        out.finished_s = sink.at - out._started
    out.decode_s = now - counted.first_step if counted.first_step is not None else 0.0
    return out


class _Sink:
    """One request's final event, and the clock when it came."""

    __slots__ = ("out", "end", "at", "clock")

    def __init__(self, out: Output, clock: Callable[[], float]) -> None:
        self.out, self.end, self.at, self.clock = out, None, 0.0, clock

    def put(self, event: Event) -> None:
        if isinstance(event, Finished | Failed):
            self.end, self.at = event, self.clock()


class _Counted:
    """Passes every call to the policy it wraps; counts each request's sequence-steps and notes its timings."""

    def __init__(self, policy: Policy, clock: Callable[[], float], block: int | None) -> None:
        self.policy, self.name, self.copies = policy, policy.name, policy.copies
        self.clock, self.block = clock, block
        self.outs: dict[str, Output] = {}
        self.tick_started = 0.0  # clock() when the tick being run began: its admissions' prefill starts there
        self.first_step: float | None = None
        self._seqs: Sequence[SeqState] = ()

    def plan(self, runner: ModelRunner, seqs: Sequence[SeqState]) -> StepPlan:
        now = self.clock()  # the tick's admissions (one batched prefill) are done: their first step starts
        if self.first_step is None:
            self.first_step = now
        for s in seqs:
            out = self.outs[s.request.id]
            if out._started is None:
                out._started, out.prefill_s = now, now - self.tick_started
        self._seqs = seqs
        return self.policy.plan(runner, seqs)

    def draft(self, runner: ModelRunner, seqs: Sequence[SeqState], plan: StepPlan) -> list[Draft]:
        return self.policy.draft(runner, seqs, plan)

    def observe(self, plan: StepPlan, outcomes: Sequence[Outcome], seconds: float) -> None:
        for s, o in zip(self._seqs, outcomes, strict=True):
            out = self.outs[s.request.id]
            out.stats.record_verify([i < o.accepted for i in range(o.proposed)])  # as the scheduler counts it
            if self.block is not None:  # the rung's gamma, which the drafter's block may cut
                out.gammas.append(min(plan.depth, self.block))
                out.capped += plan.depth > self.block
        self.policy.observe(plan, outcomes, seconds)


class _TokenIds:
    """The run's tokenizer as the scheduler sees it: the ids that end a sequence, and no text (callers decode the
    ids they get back, once, as a whole)."""

    name = "ids"

    def __init__(self, eos_ids: frozenset[int]) -> None:
        self.eos_ids = eos_ids
        self.vocab_size = 1 << 62

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        raise NotImplementedError("generate takes token ids")

    def decode(self, tokens: list[int]) -> str:
        return ""

    def stream(self) -> "_NoText":
        return _NoText()


class _NoText:
    """A stream decoder that yields no text: the scheduler's text deltas are not needed offline."""

    __slots__ = ()

    def add(self, token: int) -> str:
        return ""

    def flush(self) -> str:
        return ""
