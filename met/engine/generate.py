"""Offline generation: a static batch of prompts run to completion under one fixed drafting policy."""

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from met.engine.proposer import NGRAM_MAX, SPEC_MODES, Proposer
from met.engine.runner import Draft, ModelRunner, Sampling
from met.engine.tick_counters import count_chain
from met.model.tokenizer import EOS
from met.speculative.dflash_rung import DflashRung

__all__ = ["NGRAM_MAX", "SPEC_MODES", "Output", "Proposer", "generate"]


@dataclass
class Output:
    """One prompt's generation and its speculation counts."""

    prompt: list[int]
    tokens: list[int] = field(default_factory=list)  # generated tokens (EOS not included)
    steps: int = 0  # verify (or plain decode) steps this sequence took part in
    proposed: int = 0  # drafts verified
    accepted: int = 0  # drafts accepted; the bonus token is not a draft
    accepted_at: list[int] = field(default_factory=list)  # accepted[j]: steps whose draft j+1 was accepted
    proposed_at: list[int] = field(default_factory=list)  # proposed[j]: steps that verified a draft j+1
    decode_s: float = 0.0  # the batch's decode wall time (every sequence of the batch gets the same)
    finished_s: float = 0.0  # decode wall time until this sequence finished (0: it finished at prefill)
    prefill_s: float = 0.0
    finished_by: str = "length"
    gammas: list[int] = field(default_factory=list)  # --spec dflash: each step's verify width K, cut to the block
    capped: int = 0  # --spec dflash: steps whose gamma the drafter's block cut (the rung chose more than it drafts)


def generate(runner: ModelRunner, prompts: list[list[int]], max_tokens: int, spec: str = "off", depth: int = 3,
             sampling: Sampling | Sequence[Sampling] = Sampling(), stop_at_eos: bool = True,
             eos_ids: Collection[int] = (EOS,), rung: DflashRung | None = None,
             lookup_min: int = 1) -> list[Output]:
    """Generate up to max_tokens per prompt, all prompts as one batch, drafting depth tokens per step.

    sampling: one for every prompt, or one per prompt (a seed each, say).
    eos_ids: the tokens that end a sequence (the tokenizer's; the byte tokenizer's EOS by default).
    spec "dflash": the DFlash rung picks each step's depth (gamma) from the batch width and, for a
    single stream, the first-draft accept rate (`rung`, default DflashRung()); `depth` is not used.
    """
    if spec not in SPEC_MODES:
        raise ValueError(f"unknown spec mode {spec!r}; choose one of {', '.join(SPEC_MODES)}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    if spec == "dflash" and runner.dflash is None:
        raise ValueError("--spec dflash needs a runner with a DFlash drafter (ModelRunner(..., dflash=drafter))")
    samplings = [sampling] * len(prompts) if isinstance(sampling, Sampling) else list(sampling)
    if len(samplings) != len(prompts):
        raise ValueError(f"{len(samplings)} samplings for {len(prompts)} prompts")
    outs = [Output(p) for p in prompts]
    proposers = [Proposer(spec, p, min_ngram=lookup_min) for p in prompts]
    slot_of = list(range(len(prompts)))  # prompt i's KV slot; sequences move down as others finish
    t0 = time.perf_counter()
    firsts = runner.prefill(slot_of, prompts, samplings)
    prefill_s = time.perf_counter() - t0
    live = []  # prompts still generating, in slot order
    for i, first in enumerate(firsts):
        outs[i].prefill_s = prefill_s
        proposers[i].observe(0, 0, [first])  # the first token is history the proposers match against
        if not _emit(outs[i], [first], max_tokens, stop_at_eos, eos_ids):
            live.append(i)
        else:
            runner.release(slot_of[i])
    rung = (rung or DflashRung()) if spec == "dflash" else None
    t0 = time.perf_counter()
    while live:
        live = _compact(runner, live, slot_of)
        slots = [slot_of[i] for i in live]
        if rung is not None:
            chosen = rung.gamma_for(len(live))
            depth = min(chosen, runner.dflash.block)
        want = [max(0, min(depth, max_tokens - len(outs[i].tokens) - 1, runner.room(s))) for i, s in zip(live, slots)]
        if spec == "off":
            drafts = [Draft([], []) for _ in live]
        elif spec == "mtp":
            drafts = runner.draft_mtp(slots, want)
        elif spec == "dflash":
            drafts = runner.draft_dflash(slots, want)
        else:
            drafts = [proposers[i].host_draft(k) for i, k in zip(live, want)]
        results = runner.verify(slots, drafts)
        if rung is not None:
            drafted = [r for d, r in zip(drafts, results) if d.tokens]
            rung.observe(len(live), len(drafted), sum(r.accepted > 0 for r in drafted))
        still = []
        for i, s, d, r in zip(live, slots, drafts, results):
            o = outs[i]
            o.steps += 1
            o.proposed += len(d.tokens)
            o.accepted += r.accepted
            if rung is not None:
                o.gammas.append(depth)
                o.capped += chosen > depth
            count_chain(o.proposed_at, o.accepted_at, len(d.tokens), r.accepted)
            proposers[i].observe(len(d.tokens), r.accepted, r.tokens)
            if _emit(o, r.tokens, max_tokens, stop_at_eos, eos_ids) or runner.room(s) < 0:
                o.finished_s = time.perf_counter() - t0
                runner.release(s)
            else:
                still.append(i)
        live = still
    decode_s = time.perf_counter() - t0
    for o in outs:
        o.decode_s = decode_s
    return outs


def _compact(runner: ModelRunner, live: list[int], slot_of: list[int]) -> list[int]:
    """Keep the live sequences in slots 0..n-1 (ModelRunner.compact); the live prompts in slot order."""
    moved = runner.compact([slot_of[i] for i in live])
    for i in live:
        slot_of[i] = moved.get(slot_of[i], slot_of[i])
    return sorted(live, key=lambda i: slot_of[i])


def _emit(o: Output, tokens: list[int], max_tokens: int, stop_at_eos: bool, eos_ids: Collection[int]) -> bool:
    """Append emitted tokens up to the limit or EOS; True when the sequence is finished."""
    for t in tokens:
        if stop_at_eos and t in eos_ids:
            o.finished_by = "eos"
            return True
        o.tokens.append(t)
        if len(o.tokens) >= max_tokens:
            o.finished_by = "length"
            return True
    return False
