"""Host drafts for one sequence: the n-gram and prompt-lookup proposers over its own history, with a fallback.

Both read the history through prompt_lookup's incremental index, at a constant cost per step
however long the history: `ngram` copies a fixed depth (the proposals of `ngram.propose`, its
reference, which scans the history: 159 us a proposal at 1,024 tokens of stdlib source against
1.4 us, `python3 benchmarks/prompt_lookup.py`), `prompt-lookup` up to its adaptive window.

The fallback (the scheduler passes the tenant-scoped shared lookup) is asked only when the
sequence's own history has no match, so a sequence's own text always wins over other requests'.
"""

from collections.abc import Callable, Sequence

from met.engine.runner import Draft
from met.speculative.prompt_lookup import LookupParams, PromptLookup
from met.speculative.spec_cost.lookup import copy_params

SPEC_MODES = ("off", "mtp", "draft", "ngram", "prompt-lookup", "dflash", "eagle")  # draft: the runner's draft model;
# eagle: its EAGLE-3 head
HOST_MODES = ("ngram", "prompt-lookup")  # modes whose drafts come from the history, not a model
NGRAM_MAX = 4  # longest suffix the n-gram proposers match

Fallback = Callable[[Sequence[int], int], list[int]]  # (history, most drafts) -> drafts
SharedCopy = Callable[[Sequence[int], int, int], tuple[int, list[int]]]  # (history, most, longer than) -> (n, copy)


class Proposer:
    """Drafts for one sequence from a host proposer over its history (prompt + emitted tokens)."""

    def __init__(self, mode: str, prompt: Sequence[int], fallback: Fallback | None = None, min_ngram: int = 1,
                 copy_ngram: int = 0, shared: SharedCopy | None = None):
        """min_ngram: the shortest suffix match that proposes drafts (--lookup-min-ngram; 1..NGRAM_MAX).

        copy_ngram: in a mode that drafts with a model, index the history anyway, matching suffixes
        of 1..copy_ngram tokens (at the lengths lookup.copy_lengths lists), so that the measured
        planner can weigh copies (`matched_copy`) against drafts; 0: no index. shared: where the
        planner's `shared_copy` asks the tenant's shared lookup cache (the scheduler wires it); None: none.
        """
        if mode not in SPEC_MODES:
            raise ValueError(f"unknown spec mode {mode!r}; choose one of {', '.join(SPEC_MODES)}")
        self.mode = mode
        self.history = list(prompt)
        self.fallback = fallback
        self.shared = shared
        params = None
        if mode in HOST_MODES:
            params = LookupParams(min_ngram=min_ngram, max_ngram=NGRAM_MAX)
        elif copy_ngram:
            params = copy_params(copy_ngram)  # the lengths the calibration's bins start at
        self.lookup = PromptLookup(params, prompt) if params is not None else None
        self.own = True  # whether the last draft came from this sequence's own history

    def host_draft(self, depth: int) -> Draft:
        """Up to depth drafts from the history, else from the fallback; confidences are unknown (0 log-prob)."""
        if self.lookup is None:
            return Draft([], [])
        if self.mode == "ngram":
            toks = self.lookup.copy(depth) if depth > 0 else []  # a fixed depth: no window
        else:
            toks = self.lookup.propose(depth) if depth > 0 else []
        self.own = bool(toks)
        if not toks and self.fallback is not None and depth > 0:
            toks = self.fallback(self.history, depth)
        toks = list(toks[:depth])
        return Draft(toks, [0.0] * len(toks))

    def matched_copy(self, depth: int) -> tuple[int, list[int]]:
        """The length of the history's longest recurring suffix and up to depth tokens that followed it ((0, []): none).

        Own history only, whatever the window: the measured planner chooses how deep to verify it. A
        continuation that reaches the present goes on as a loop of itself (PromptLookup.matched_copy's
        cyclic), as the calibration's copies (met.speculative.spec_cost.lookup) do.
        """
        return self.lookup.matched_copy(depth, cyclic=True) if self.lookup is not None else (0, [])

    def shared_copy(self, depth: int, longer_than: int) -> tuple[int, list[int]]:
        """The shared cache's match for the history, only if longer than longer_than, and up to depth tokens after it.

        (0, []) when there is none or no shared cache is wired. The planner passes its own match's
        length: the sequence's own text wins unless another request's match is longer.
        """
        return self.shared(self.history, depth, longer_than) if self.shared is not None and depth > 0 else (0, [])

    def observe(self, proposed: int, accepted: int, emitted: list[int]) -> None:
        """Record a verify step's outcome and extend the history."""
        self.history.extend(emitted)
        if self.lookup is not None:
            # the copy window tracks the sequence's own matches; a fallback copy says nothing of them
            self.lookup.observe(proposed if self.own else 0, accepted if self.own else 0)
            self.lookup.extend(emitted)
