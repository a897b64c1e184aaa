"""The drafter's acceptance calibration: run the drafter against the target, record and fit every judged draft.

The drafter is the target's MTP module, or a draft model (a smaller model of its tokenizer) or an
EAGLE-3 head drafting in its place: a calibration holds for the drafter it was fitted on, and the planner
refuses it for any other (its DrafterKey). Prompts are windows of the model card's held-out files
by default (code the model never trained on; mid-file, clear of the windows `met bench policies`
runs: `calibration_windows`), or the user's. Each prompt is generated greedily with the drafter's
drafts at a fixed depth; a draft is *judged*
when every draft before it in its chain was accepted, and each judged draft gives one outcome
(its top-1 log-prob, accepted or not, its 1-based position, and the top-1 log-prob of the first
draft of its sequence's step before: the carry-over's input; None on a sequence's first step).
"""

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from met import bounded_read
from met.bench.step_fixture import drafter_of, runner_for
from met.engine.prompts import PromptError, read_jsonl_prompts
from met.engine.runner import Draft, Sampling
from met.model.corpus import calibration_windows
from met.model.eagle3 import Eagle3Head
from met.model.tokenizer import BYTES, Tokenizer
from met.model.transformer import Transformer
from met.speculative.spec_cost import AcceptanceCalibration, DrafterKey
from met.speculative.spec_cost.lookup import fit_lookup, fit_shared_lookup

Outcome = tuple[float | None, bool, int, float | None]  # (top-1 log-prob, accepted, position, previous first's)


@dataclass(frozen=True, slots=True)
class CalibrationParams:
    """How the calibration runs: prompts, their length, tokens generated per prompt, draft depth, batch."""

    prompts: int = 128  # held-out windows (when no prompts are given)
    prompt_bytes: int = 256  # bytes of each prompt (prompts are cut to this)
    new_tokens: int = 128  # tokens generated per prompt
    depth: int = 4  # drafts per step: outcomes are recorded at positions 1..=depth
    batch: int = 16  # sequences per step

    def __post_init__(self) -> None:
        for name in ("prompts", "prompt_bytes", "new_tokens", "depth", "batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"calibration {name} must be at least 1, got {getattr(self, name)}")


QUICK_CALIBRATION = CalibrationParams(prompts=8, prompt_bytes=64, new_tokens=32, depth=2, batch=8)


def read_prompts(path: Path, params: CalibrationParams) -> list[str]:
    """Prompts from a folder (each file's first prompt_bytes bytes) or a JSON Lines file (strings or {"prompt": ...})."""
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file())
        try:  # each file's first prompt_bytes only: a FIFO or a device among them is refused, never read
            prompts = [_head(p, params.prompt_bytes).decode("utf-8", errors="ignore") for p in files]
        except bounded_read.FileRefused as exc:
            raise PromptError(str(exc)) from None
        except OSError as exc:
            raise PromptError(f"{path}: cannot be read ({exc})") from None
        prompts = [p for p in prompts if p]
        if not prompts:
            what = f"{len(files)} files, none with UTF-8 text in its first {params.prompt_bytes} bytes" if files else \
                "no files"
            raise PromptError(f"{path}: the folder holds {what} to use as prompts")
        return prompts
    return read_jsonl_prompts(path, hint=", or pass a folder of text files")


def _head(path: Path, size: int) -> bytes:
    """The first `size` bytes of a regular file."""
    fd = bounded_read.open_regular(path)
    try:
        return os.read(fd, size)
    finally:
        os.close(fd)


def default_prompts(params: CalibrationParams) -> list[str]:
    """Mid-file windows of the held-out files, prompt_bytes each: code the model never trained on."""
    return calibration_windows(params.prompts, params.prompt_bytes)


def judged(draft: Draft, accepted: int, previous: float | None = None) -> Iterator[Outcome]:
    """The outcomes of one verified chain: drafts 1..accepted accepted, the next one rejected, the rest unjudged.

    previous: the top-1 log-prob of the first draft of the sequence's step before this one.
    """
    for position, confidence in enumerate(draft.confidences[: accepted + 1], start=1):
        yield confidence, position <= accepted, position, previous


_PROPOSE = {"mtp": "draft_mtp", "draft": "draft_small", "eagle": "draft_eagle"}  # drafter -> its ModelRunner method


def collect(model: Transformer, prompts: list[list[int]], params: CalibrationParams,
            on_batch: Callable[[int, int], None] = lambda done, total: None,
            generations: list[tuple[list[int], list[int]]] | None = None,
            draft_model: Transformer | None = None, eos_ids: frozenset[int] = BYTES.eos_ids,
            eagle: Eagle3Head | None = None) -> list[Outcome]:
    """Every judged draft of greedy generation over the prompts, `params.batch` at a time, drafted by the model's MTP
    module, by `draft_model` or by `eagle` (an EAGLE-3 head).

    generations: when given, each prompt as the runner saw it and the tokens generated after it are
    appended to it (prompt lookup's calibration replays them). eos_ids: the tokens that end a
    sequence (the model's tokenizer's).
    """
    longest = max(len(p) for p in prompts)
    limit = model.cfg.max_seq_len if draft_model is None else min(model.cfg.max_seq_len, draft_model.cfg.max_seq_len)
    max_len = min(limit, longest + params.new_tokens + params.depth + 1)
    runner = runner_for(model, params.batch, max_len, draft_model=draft_model, eagle=eagle)
    propose = getattr(runner, _PROPOSE[drafter_of(runner)])
    outcomes: list[Outcome] = []
    for start in range(0, len(prompts), params.batch):
        batch = [p[-(max_len - params.depth - 2):] for p in prompts[start: start + params.batch]]
        slots = list(range(len(batch)))
        firsts = runner.prefill(slots, batch, [Sampling()] * len(batch))
        generated = {slot: [first] for slot, first in zip(slots, firsts)}
        previous: dict[int, float | None] = dict.fromkeys(slots)  # each slot's last first-draft log-prob
        live = slots
        while live:
            depths = [max(0, min(params.depth, runner.room(s), params.new_tokens - len(generated[s]) - 1))
                      for s in live]
            drafts = propose(live, depths)
            results = runner.verify(live, drafts)
            still = []
            for slot, draft, result in zip(live, drafts, results):
                outcomes.extend(judged(draft, result.accepted, previous[slot]))
                previous[slot] = draft.confidences[0] if draft.confidences else None
                generated[slot] += result.tokens
                if len(generated[slot]) >= params.new_tokens or eos_ids.intersection(result.tokens) or \
                        runner.room(slot) < 1:
                    runner.release(slot)
                else:
                    still.append(slot)
            live = still
        if generations is not None:
            generations += [(batch[slot], generated[slot]) for slot in slots]
        on_batch(min(start + params.batch, len(prompts)), len(prompts))
    return outcomes


def calibrate(model: Transformer, texts: list[str], drafter: DrafterKey, params: CalibrationParams,
              meta: dict[str, object] | None = None,
              on_batch: Callable[[int, int], None] = lambda done, total: None,
              draft_model: Transformer | None = None, tokenizer: Tokenizer = BYTES,
              eagle: Eagle3Head | None = None) -> AcceptanceCalibration:
    """Fit the drafter's AcceptanceCalibration on greedy generation from `texts` (SpecCostError if too few drafts).

    draft_model, eagle: it drafts instead of the model's MTP module (`drafter` is then its key). tokenizer:
    the model's, which encodes the texts (each cut to prompt_bytes tokens) and ends sequences.
    Prompt lookup's bins are fitted on the same generations (met.speculative.spec_cost.lookup): the
    history's own copies, and other requests' (each generation against the ones before it, in order).
    """
    prompts = [tokenizer.encode(t)[: params.prompt_bytes] or [0] for t in texts]
    generations: list[tuple[list[int], list[int]]] = []
    outcomes = collect(model, prompts, params, on_batch, generations, draft_model, tokenizer.eos_ids, eagle)
    info = {"prompts": len(prompts), "prompt_bytes": params.prompt_bytes, "new_tokens": params.new_tokens,
            "depth": params.depth, "acceptance": "greedy (target argmax)", **(meta or {})}
    return AcceptanceCalibration.fit(outcomes, drafter, info, fit_lookup(generations), fit_shared_lookup(generations))
