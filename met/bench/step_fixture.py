"""A StepFixture: sequences held in a fixed state so the same draft or verify step can be timed again and again.

A step changes the runner's state (cache lengths, the pending token, the MTP catch-up rows, a
draft model's or EAGLE-3 head's cache length and the rows it has yet to take), so timing many identical steps
needs the state put back before each one. The fixture saves each slot's state once and restores
it before every step; the KV entries a step writes are rewritten identically by the next
repetition, and a step's cost does not depend on them.
"""

from dataclasses import dataclass, field

import torch

from met.engine.runner import Draft, ModelRunner, Sampling
from met.model.dflash import DflashDrafter
from met.model.eagle3 import Eagle3Head
from met.model.transformer import Transformer

GREEDY = Sampling()
DRAFTERS = ("mtp", "dflash", "draft", "eagle")  # the MTP module, a DFlash block drafter, a draft model, an EAGLE-3 head


def runner_for(model: Transformer, width: int, max_len: int | None, dflash: DflashDrafter | None = None,
               draft_model: Transformer | None = None, eagle: Eagle3Head | None = None,
               with_mtp: bool = False) -> ModelRunner:
    """A runner drafting with the drafter given (none: the model's MTP module, which it then alone tracks).

    with_mtp: it tracks the MTP module beside the draft model or EAGLE-3 head, as a serve choosing among them does
    (a joint sweep's runner).
    """
    mtp = with_mtp or (dflash is None and draft_model is None and eagle is None)
    return ModelRunner(model, width, max_len, track_mtp=mtp, dflash=dflash, draft_model=draft_model, eagle=eagle)


def drafters_of(runner: ModelRunner) -> tuple[str, ...]:
    """Every drafter a runner from runner_for drafts with, in the order of DRAFTERS ("mtp" for a runner with none).

    For a runner of one drafter that is drafter_of's; a joint sweep's runner has several, and its cells name which.
    """
    found = (("mtp", runner.track_mtp and runner.dflash is None), ("dflash", runner.dflash is not None),
             ("draft", runner.draft_model is not None), ("eagle", runner.eagle is not None))
    return tuple(kind for kind, present in found if present) or ("mtp",)


def drafter_of(runner: ModelRunner) -> str:
    """Which drafter a runner from runner_for drafts with: dflash, draft, eagle or mtp."""
    if runner.dflash is not None:
        return "dflash"
    return "draft" if runner.draft_model is not None else "eagle" if runner.eagle is not None else "mtp"


@dataclass(frozen=True, slots=True)
class SlotState:
    """What a step changes in one slot: cache lengths, the pending token, the MTP catch-up rows and the draft
    model's."""

    length: int
    mtp_length: int
    pending: int
    catchup_h: torch.Tensor | None = field(compare=False)  # [rows, dim]; None: no rows (compared apart: a tensor)
    catchup_tok: tuple[int, ...]
    draft_length: int = 0  # the draft model's cache length (0 without one)
    draft_behind: tuple[int, ...] = ()  # the tokens its next draft step catches up on
    eagle_length: int = 0  # the EAGLE-3 head's cache length (0 without one)
    eagle_behind: tuple[torch.Tensor, ...] = ()  # the target feature rows its next draft step catches up on
    eagle_tok: tuple[int, ...] = ()  # the token after each of them


class StepFixture:
    """Sequences of `context_len` tokens in slots 0..width-1, put back into one saved state before every step.

    Built as a real decode would leave them: prefill, one MTP catch-up pass, then `catchup_rows`
    plain decode steps, so the MTP block has up to that many rows to catch up on before a draft (as
    after a step that emitted that many tokens); a draft step names how many of them it gets.
    drafter "dflash": the runner's DFlash block drafter makes the drafts instead (its step reads the
    state and changes none of it); "draft": the runner's draft model, which catches up on the prompt
    as the MTP block does and then has the same rows to take. `copies` gives drafts no drafter made,
    for the copies' verify cells. A runner with several drafters (a joint sweep's) has every one of
    them caught up and put back; `drafts` and `draft_step` name the one drafting (default: `drafter`).
    """

    def __init__(self, runner: ModelRunner, prompts: list[list[int]], catchup_rows: int = 1,
                 drafter: str = "mtp") -> None:
        if catchup_rows < 1:
            raise ValueError(f"catchup_rows must be at least 1 (the bonus token's row), got {catchup_rows}")
        if drafter not in DRAFTERS:
            raise ValueError(f"drafter must be one of {', '.join(DRAFTERS)}, got {drafter!r}")
        if drafter == "draft" and runner.draft_model is None:
            raise ValueError("drafter 'draft' needs a runner with a draft model (ModelRunner(..., draft_model=...))")
        if drafter == "eagle" and runner.eagle is None:
            raise ValueError("drafter 'eagle' needs a runner with an EAGLE-3 head (ModelRunner(..., eagle=...))")
        self.runner = runner
        self.drafter = drafter
        self.slots = list(range(len(prompts)))
        self.prompts = [list(p) for p in prompts]
        for slot in self.slots:
            runner.release(slot)
        runner.prefill(self.slots, prompts, [GREEDY] * len(prompts))
        if runner.track_mtp:
            runner.draft_mtp(self.slots, [1] * len(self.slots))  # the MTP block catches up on the prompt
        if runner.draft_model is not None:
            runner.draft_small(self.slots, [1] * len(self.slots))  # and the draft model, in its own cache
        if runner.eagle is not None:
            runner.draft_eagle(self.slots, [1] * len(self.slots))  # and the EAGLE-3 head, in its own
        for _ in range(catchup_rows):
            runner.verify(self.slots, [Draft([], []) for _ in self.slots])
        self.saved = [self.state(slot) for slot in self.slots]
        self._drafts: dict[tuple[str, int], list[Draft]] = {}

    def state(self, slot: int) -> SlotState:
        """The slot's state now (what restore puts back)."""
        seq, cache, small = self.runner.seqs[slot], self.runner.cache, self.runner.draft_model
        drafted = (small.cache.lengths[slot], tuple(small.behind[slot])) if small is not None else (0, ())
        head = self.runner.eagle
        headed = ((head.cache.lengths[slot], tuple(head.behind[slot]), tuple(head.behind_tok[slot]))
                  if head is not None else ())
        tokens = tuple(seq.catchup_tokens(self.runner.device).tolist()) if seq.catchup_ids else ()
        return SlotState(cache.lengths[slot], cache.mtp_lengths[slot], seq.pending,
                         seq.catchup_rows() if seq.catchup_h else None, tokens, *drafted, *headed)

    def restore(self, width: int, rows: int | None = None) -> None:
        """Put slots 0..width-1 back into the saved state, with only the last `rows` catch-up rows pending.

        rows None: all of them. A step's cost does not depend on the MTP block's (or the draft model's)
        cached entries for the rows left out (they were never computed), only on how many rows it
        catches up on.
        """
        cache, small = self.runner.cache, self.runner.draft_model
        for slot in range(width):
            state, seq = self.saved[slot], self.runner.seqs[slot]
            keep = len(state.catchup_tok) if rows is None else min(rows, len(state.catchup_tok))
            cache.lengths[slot] = state.length
            cache.mtp_lengths[slot] = state.mtp_length + len(state.catchup_tok) - keep
            seq.pending = state.pending
            seq.catchup_h = [state.catchup_h[len(state.catchup_tok) - keep :]] if keep else []
            tokens = state.catchup_tok[len(state.catchup_tok) - keep :]
            # as a greedy verify leaves them: on the device (the fixture's sequences are greedy)
            seq.catchup_ids = [torch.tensor(tokens, device=self.runner.device)] if keep else []
            if small is not None:
                behind = len(state.draft_behind) if rows is None else min(rows, len(state.draft_behind))
                small.cache.lengths[slot] = state.draft_length + len(state.draft_behind) - behind
                small.behind[slot] = list(state.draft_behind[len(state.draft_behind) - behind :])
                small.fed[slot] = []
            if (head := self.runner.eagle) is not None:  # as the MTP block: the last `rows` feature rows wait
                behind = len(state.eagle_tok) if rows is None else min(rows, len(state.eagle_tok))
                head.cache.lengths[slot] = state.eagle_length + len(state.eagle_tok) - behind
                head.behind[slot] = list(state.eagle_behind[len(state.eagle_behind) - behind :])
                head.behind_tok[slot] = list(state.eagle_tok[len(state.eagle_tok) - behind :])
                head.fed[slot] = 0

    def drafts(self, width: int, depth: int, drafter: str | None = None) -> list[Draft]:
        """The drafts the drafter (None: the fixture's) proposes from the saved state (made once, cached): what a
        verify step scores."""
        if depth == 0:
            return [Draft([], []) for _ in range(width)]
        key = (drafter or self.drafter, depth)
        if key not in self._drafts:
            self.restore(len(self.slots))
            self._drafts[key] = self._draft(self.slots, depth, key[0])
        return [Draft(list(d.tokens), list(d.confidences)) for d in self._drafts[key][:width]]

    def copies(self, width: int, depth: int) -> list[Draft]:
        """Drafts no drafter made: each sequence's last `depth` prompt tokens (cycled where the prompt is shorter),
        without confidences, as prompt lookup copies from a history (a verify costs the same whatever it scores)."""
        tails = [p[-depth:] for p in self.prompts[:width]]
        return [Draft([tail[j % len(tail)] for j in range(depth)], []) for tail in tails]

    def verify_step(self, width: int, drafts: list[Draft]) -> None:
        """One verify step of the first `width` sequences (a plain decode step when the drafts are empty)."""
        self.restore(width)
        self.runner.verify(self.slots[:width], drafts)

    def draft_step(self, width: int, depth: int, rows: int | None = None, drafter: str | None = None) -> None:
        """One draft step (MTP, the DFlash block, the draft model or the EAGLE-3 head: `drafter`, None the
        fixture's) of depth `depth` for the first `width` sequences.

        rows: catch-up rows the MTP block (or the draft model) gets first (None: every saved one).
        """
        self.restore(width, rows)
        self._draft(self.slots[:width], depth, drafter or self.drafter)

    def _draft(self, slots: list[int], depth: int, drafter: str) -> list[Draft]:
        if drafter == "dflash":
            return self.runner.draft_dflash(slots, [depth] * len(slots))
        if drafter == "draft":
            return self.runner.draft_small(slots, [depth] * len(slots))
        if drafter == "eagle":
            return self.runner.draft_eagle(slots, [depth] * len(slots))
        return self.runner.draft_mtp(slots, [depth] * len(slots))
