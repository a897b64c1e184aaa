"""Prompt-lookup decoding: an incremental n-gram index over one sequence's history and its adaptive copy window.

The index maps every n-gram of the history (n in [min_ngram, max_ngram]) to the position just
after its latest occurrence that has a continuation. The n-gram ending at the very end of the
history is only entered once the next token arrives, so looking up the history's own suffix finds
its latest *earlier* occurrence, never itself. A proposal therefore costs at most
max_ngram - min_ngram + 1 hash lookups (one per n, longest first) whatever the history's length,
and `extend` costs O(new tokens x n-gram range).

The proposal is the continuation of that occurrence, up to a window that doubles after a fully
accepted copy and halves after a broken one, within [min_window, max_window]. Proposals equal
`ngram.propose(history, max_ngram, min_ngram, window)`.

Params may list the lengths indexed (`lengths`): the measured planner's copies index only the
lengths its calibration's bins start at (1, 2, 3, 4, 6, 8, 12), so a 7-token recurring suffix
is matched as its last 6 (the same bin) at a little over half the index work; such an index
matches the longest listed length, and its proposals are no longer `ngram.propose`'s.

Worked example, params min_ngram=1, max_ngram=2, history [1, 2, 3, 1, 2]:
the index holds (1,)->4, (2,)->2, (3,)->3, (1, 2)->2, (2, 3)->3, (3, 1)->4; the final (2,) and
(1, 2), which have no continuation yet, are not entered. The suffix (1, 2) maps to 2, so with window 4 the proposal is
history[2:6] = [3, 1, 2].
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

V = TypeVar("V")  # what an index maps an n-gram to

BULK_EXTEND = 32  # tokens from which `extend` builds the keys a whole n at a time (a prompt; a step appends a few)


@dataclass(frozen=True, slots=True)
class LookupParams:
    """N-gram range matched against the history, and the bounds of the adaptive copy window."""

    min_ngram: int = 1  # a 1-token match is weak evidence, but a draft costs only a verify slot
    max_ngram: int = 4  # longer suffixes are tried first; more n costs one more lookup each
    min_window: int = 1  # the window never falls below this many drafts
    initial_window: int = 4  # drafts offered before any copy was observed
    max_window: int = 16  # doubling stops here; the verify capacity clamps further anyway
    lengths: tuple[int, ...] = ()  # the n indexed and matched, rising, within the range; (): every n in it

    @property
    def ngrams(self) -> tuple[int, ...]:
        """The n-gram lengths indexed, rising (as SharedLookupParams.ngrams)."""
        return ngram_lengths(self.lengths, self.min_ngram, self.max_ngram)

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(
                f"n-gram range [min_ngram={self.min_ngram}, max_ngram={self.max_ngram}] is empty or starts below 1; "
                "pass 1 <= min_ngram <= max_ngram"
            )
        check_lengths(self.lengths, self.min_ngram, self.max_ngram)
        if not 1 <= self.min_window <= self.initial_window <= self.max_window:
            raise ValueError(
                f"window bounds min_window={self.min_window}, initial_window={self.initial_window}, "
                f"max_window={self.max_window} are out of order; pass 1 <= min_window <= initial_window <= max_window"
            )


def check_lengths(lengths: tuple[int, ...], lo: int, hi: int) -> None:
    """n-gram lengths rising strictly within [lo, hi] (empty: every length in it); ValueError otherwise."""
    if not isinstance(lengths, tuple) or any(isinstance(n, bool) or not isinstance(n, int) for n in lengths):
        raise ValueError(f"n-gram lengths {lengths!r} are not a tuple of whole numbers")
    if any(not lo <= n <= hi for n in lengths) or any(a >= b for a, b in zip(lengths, lengths[1:])):
        raise ValueError(f"n-gram lengths {lengths} do not rise strictly within [{lo}, {hi}]")


def ngram_lengths(lengths: tuple[int, ...], lo: int, hi: int) -> tuple[int, ...]:
    """The n-gram lengths an index holds: `lengths`, or every one in [lo, hi] when it is empty."""
    return lengths or tuple(range(lo, hi + 1))


def longest_suffix(index: Mapping[tuple[int, ...], V], history: Sequence[int], lengths: tuple[int, ...],
                      longest: int, longer_than: int = 0) -> tuple[int, V] | None:
    """(n, index entry) for the longest of `lengths`, at most `longest` and more than `longer_than`, whose
    suffix of `history` the index holds; None if none. PromptLookup's and SharedLookup's match, both."""
    tail = tuple(history[-lengths[-1]:])  # one copy; each n's suffix is a slice of it
    size = min(len(tail), longest)
    for n in reversed(lengths):
        if n <= longer_than:
            break
        if n <= size:
            hit = index.get(tail[len(tail) - n:])
            if hit is not None:
                return n, hit
    return None


def next_window(window: int, proposed: int, accepted: int, params: LookupParams) -> int:
    """Double the window after a fully accepted copy, halve it after a broken one, within the params' bounds."""
    if not 0 <= accepted <= proposed:
        raise ValueError(f"accepted={accepted} drafts of proposed={proposed}; pass 0 <= accepted <= proposed")
    if proposed == 0:
        return window  # nothing was copied, so there is no evidence either way
    if accepted == proposed:
        return min(params.max_window, window * 2)
    return max(params.min_window, window // 2)


class PromptLookup:
    """One sequence's history, its n-gram index, and its copy window."""

    __slots__ = ("params", "_tokens", "_index", "_window", "_lengths")

    def __init__(self, params: LookupParams | None = None, tokens: Iterable[int] = ()) -> None:
        self.params = params if params is not None else LookupParams()
        self._lengths = self.params.ngrams
        self._tokens: list[int] = []
        # n-gram -> position just after its latest occurrence that has a continuation (< len(history))
        self._index: dict[tuple[int, ...], int] = {}
        self._window = self.params.initial_window
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    @property
    def tokens(self) -> list[int]:
        """The history (prompt + accepted tokens), oldest first; a copy."""
        return list(self._tokens)

    @property
    def window(self) -> int:
        """The current copy window: the most drafts `propose` offers."""
        return self._window

    @property
    def index_entries(self) -> int:
        """Number of distinct n-grams indexed."""
        return len(self._index)

    def extend(self, tokens: Iterable[int]) -> None:
        """Append tokens to the history, entering each n-gram that now has a continuation.

        The n-grams ending at position e (before history[e]) gain their continuation when history[e]
        arrives: each e of the new tokens enters them, later e overwriting earlier. A long extend (a
        prompt) builds each n's keys in one pass (zip of n shifted slices, no Python loop per token);
        a step's few tokens slice one tuple of the last max_ngram tokens per position.
        """
        history, index, lengths = self._tokens, self._index, self._lengths
        start = len(history)
        history.extend(tokens)
        end = len(history)
        if end - start > BULK_EXTEND:
            for n in lengths:
                first = max(start, n)  # an n-gram ending at e needs e >= n tokens before it
                if first < end:
                    grams = zip(*[history[first - n + i : end - n + i] for i in range(n)])
                    index.update(zip(grams, range(first, end)))
            return
        hi = lengths[-1]
        for e in range(start, end):
            tail = tuple(history[max(0, e - hi) : e])
            size = len(tail)
            for n in lengths:
                if n > size:
                    break
                index[tail[size - n :]] = e

    def match(self) -> tuple[int, int] | None:
        """Return (n, position just after the latest earlier occurrence) of the longest recurring suffix, or None."""
        return longest_suffix(self._index, self._tokens, self._lengths, len(self._tokens) - 1)

    def copy(self, num_tokens: int) -> list[int]:
        """Return up to num_tokens tokens of the match's continuation, ignoring the window."""
        return self.matched_copy(num_tokens)[1]

    def matched_copy(self, num_tokens: int, cyclic: bool = False) -> tuple[int, list[int]]:
        """The match's length and up to num_tokens tokens of its continuation, ignoring the window; (0, []) if none.

        cyclic: a continuation that runs into the present goes on as a loop of itself. The latest earlier
        occurrence of a suffix inside a run (spaces, a repeated line) ends a period p before the end, so
        its continuation holds only p tokens: the run's next tokens, if it goes on, repeat those p.
        Example: history [7, 5, 5, 5]: the suffix (5, 5) last occurred ending at 3, so the continuation
        is [5], and cyclic copies of 3 are [5, 5, 5].
        """
        found = self.match()
        if found is None or num_tokens <= 0:
            return 0, []
        n, after = found
        copied = self._tokens[after : after + num_tokens]
        if cyclic:
            period = len(copied)  # < num_tokens only when the continuation reached the present
            copied += [copied[j % period] for j in range(period, num_tokens)]
        return n, copied

    def propose(self, max_drafts: int | None = None) -> list[int]:
        """Return the match's continuation, up to the window (and max_drafts, the verify capacity, if given)."""
        limit = self._window if max_drafts is None else min(self._window, max_drafts)
        return self.copy(limit)

    def observe(self, proposed: int, accepted: int) -> None:
        """Update the window from how many of the proposed drafts the verifier accepted."""
        self._window = next_window(self._window, proposed, accepted, self.params)
