"""Prompt lookup's acceptance calibration: per-position accept rates by the length of the history's match.

A prompt-lookup proposal copies what followed the latest earlier occurrence of the history's
longest recurring suffix (met.speculative.prompt_lookup). How far such a copy holds depends on
how long that suffix is: on the held-out code of `met bench spec-cost`'s calibration windows, a
1-token match's first draft was accepted 0.19 of the time, an 8- to 11-token match's 0.80 and its
next three 0.85-0.89 each (met-tiny-py, greedy; `met tables show` prints the bins). The planner prices a copy by its bin's rates
and verifies it only as deep as it pays: its drafts cost a verify slot each and no model pass.

The fit replays prompt lookup over greedy generations offline: at every position of each
generated sequence it matches the history so far (prompt and the tokens generated before it)
and judges the copy against the tokens that followed, as the verify would have. Bins start at
the match lengths of FIT_EDGES and merge, shortest first, until each holds MIN_OUTCOMES judged
first drafts; each bin's rates stop at the first position with fewer (positions past a bin's
rates are never planned). The longest match is LOOKUP_MAX_NGRAM tokens: a match that long is
often inside a run of one repeated token or line (indentation, a rule of dashes, a loop of
greedy text), where the latest earlier occurrence ends a period before the present: its copy goes
on as a loop of that period (cyclic), the run's likely next tokens, judged and planned alike.

Copies from other requests (the tenant's shared lookup cache, met.speculative.shared_lookup) have
bins of their own: the planner weighs one only where its match is longer than the history's own
(a sequence's own text wins a tie), and such a copy holds differently (another file's identifiers
and loops). Their fit replays the same generations in order, each one's shared cache holding the
ones before it, and judges, at every position where the shared match is the longer, what it copies.
"""

from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from met.speculative.prompt_lookup import LookupParams, PromptLookup
from met.speculative.shared_lookup import ScopeKey, SharedLookup, SharedLookupParams
from met.speculative.spec_cost import fields
from met.speculative.spec_cost.errors import TableParseError
from met.speculative.spec_cost.fields import MIN_OUTCOMES

LOOKUP_MAX_NGRAM = 12  # the longest suffix matched; each more n costs a hash lookup per proposal and per token
FIT_EDGES = (1, 2, 3, 4, 6, 8, 12)  # the fit's starting bins: match lengths [1], [2], [3], [4, 5], ..., [12]
FIT_DEPTH = 16  # positions judged per copy
SHARED_MIN_NGRAM = SharedLookupParams().min_ngram  # the shortest match the shared cache copies on (2)
SHARED_FIT_EDGES = FIT_EDGES[FIT_EDGES.index(SHARED_MIN_NGRAM):]  # the shared bins' start: [2], [3], [4, 5], ...


def copy_lengths(longest: int, shortest: int = 1) -> tuple[int, ...]:
    """The n-gram lengths the planner's copy indexes hold, shortest..=longest: the bins' starts (FIT_EDGES).

    A bin's rates hold for every match length in it, so an index needs only each bin's shortest
    length: a recurring 7-token suffix is matched as its last 6 (bin [6, 7]), with the copy of
    that 6-gram's latest occurrence (which the fit judges alike), at 7 index entries a token
    instead of 12.
    """
    return tuple(n for n in FIT_EDGES if shortest <= n <= longest)


def copy_params(longest: int = LOOKUP_MAX_NGRAM) -> LookupParams:
    """The planner's own-history copy index: matches of 1..=longest tokens at copy_lengths."""
    return LookupParams(min_ngram=1, max_ngram=longest, lengths=copy_lengths(longest))


def shared_copy_params(budget_tokens: int | None = None, shortest: int = SHARED_MIN_NGRAM,
                       longest: int = LOOKUP_MAX_NGRAM) -> SharedLookupParams:
    """The shared cache the planner copies from: matches of shortest..=longest tokens at copy_lengths.

    budget_tokens None: the default's index entries (SharedLookupParams.index_bound).
    """
    lengths = copy_lengths(longest, shortest)
    if budget_tokens is None:
        return SharedLookupParams.index_bound(shortest, longest, lengths)
    return SharedLookupParams(budget_tokens, shortest, longest, lengths)


@dataclass(frozen=True, slots=True)
class LookupBin:
    """Copies whose match was min_match..=max_match tokens long: the accept rate of the draft at each position.

    p_accept[j - 1] is the rate of the copy's draft at position j given drafts 1..j-1 were accepted;
    outcomes[j - 1] the judged drafts behind it, each at least MIN_OUTCOMES.
    """

    min_match: int
    max_match: int
    p_accept: tuple[float, ...] | list[float]
    outcomes: tuple[int, ...] | list[int]

    def __post_init__(self) -> None:
        fields.whole(self.min_match, "min_match", 1, LOOKUP_MAX_NGRAM)
        fields.whole(self.max_match, "max_match", self.min_match, LOOKUP_MAX_NGRAM)
        rates, counts = fields.position_rates(self.p_accept, self.outcomes, FIT_DEPTH)
        object.__setattr__(self, "p_accept", rates)
        object.__setattr__(self, "outcomes", counts)


def check_bins(bins: Sequence[LookupBin], first: int = 1, name: str = "lookup") -> None:
    """Bins cover match lengths first..=max_match of the last, in order, without gaps or overlaps."""
    for i, b in enumerate(bins):
        if not isinstance(b, LookupBin):
            raise TableParseError(f"{name}[{i}]", b, "is not a LookupBin")
        start = bins[i - 1].max_match + 1 if i else first
        if b.min_match != start:
            raise TableParseError(f"{name}[{i}].min_match", b.min_match, f"must be {start} (the bins cover match "
                                  f"lengths from {first}, each after the one before)")


def judged_copies(prompt: Sequence[int], generated: Sequence[int], max_ngram: int = LOOKUP_MAX_NGRAM,
                  depth: int = FIT_DEPTH) -> Iterator[tuple[int, list[bool]]]:
    """At each position of `generated`, the match length of a prompt-lookup copy and its judged drafts.

    The copy is the planner's: cyclic where the continuation reaches the present (PromptLookup.matched_copy).
    Judged as a verify judges: drafts 1..a accepted, draft a + 1 rejected, the rest unjudged; a copy
    that runs past the end of `generated` is judged only as far as it goes.
    """
    lookup = PromptLookup(copy_params(max_ngram), prompt)
    for i in range(len(generated)):
        n, copy = lookup.matched_copy(min(depth, len(generated) - i), cyclic=True)
        if judged := _judge(copy, generated[i:]):
            yield n, judged
        lookup.extend(generated[i: i + 1])


def _judge(copy: Sequence[int], truth: Sequence[int]) -> list[bool]:
    """A copy judged against the tokens that came: True while they agree, then one False (if any), then none."""
    judged = []
    for draft, token in zip(copy, truth):
        judged.append(draft == token)
        if draft != token:
            break
    return judged


def judged_shared_copies(streams: Iterable[tuple[Sequence[int], Sequence[int]]], max_ngram: int = LOOKUP_MAX_NGRAM,
                         depth: int = FIT_DEPTH) -> Iterator[tuple[int, list[bool]]]:
    """Copies from earlier streams, judged where their match is longer than the history's own: (match, judged).

    The streams are (prompt, generated) pairs in the order a serve would have finished them: each
    is matched against a shared cache holding the ones before it, as the tenant's shared lookup
    holds finished requests. A shared copy is what followed its match in that earlier stream, never
    cyclic (the stream is whole), judged as `judged_copies` judges.
    """
    shared = SharedLookup(shared_copy_params(1 << 62, longest=max_ngram))
    scope = ScopeKey("fit", "fit", None, "fit")
    for prompt, generated in streams:
        own = PromptLookup(copy_params(max_ngram), prompt)
        history = list(prompt)
        for i in range(len(generated)):
            found = own.match()
            n, copy = shared.matched_copy(scope, history, min(depth, len(generated) - i), found[0] if found else 0)
            if judged := _judge(copy, generated[i:]):
                yield n, judged
            own.extend(generated[i: i + 1])
            history.append(generated[i])
        shared.add_request(scope, [*prompt, *generated])


def fit_lookup(streams: Iterable[tuple[Sequence[int], Sequence[int]]]) -> tuple[LookupBin, ...]:
    """Lookup bins from (prompt, greedy generation) pairs; () when too few copies were judged for one bin."""
    return fit_bins((judged for prompt, generated in streams for judged in judged_copies(prompt, generated)),
                    FIT_EDGES)


def fit_shared_lookup(streams: Sequence[tuple[Sequence[int], Sequence[int]]]) -> tuple[LookupBin, ...]:
    """Shared-copy bins from (prompt, greedy generation) pairs in order (`judged_shared_copies`); () when too few."""
    return fit_bins(judged_shared_copies(streams), SHARED_FIT_EDGES)


def fit_bins(copies: Iterable[tuple[int, list[bool]]], edges: Sequence[int]) -> tuple[LookupBin, ...]:
    """Bins from judged copies (match length, judged drafts): from edges' starts, merged until each holds enough."""
    counts = [[0] * (2 * FIT_DEPTH) for _ in edges]  # per starting bin, per position: judged then accepted
    for n, judged in copies:
        row = counts[bisect_right(edges, n) - 1]
        for j, ok in enumerate(judged):
            row[2 * j] += 1
            row[2 * j + 1] += ok
    merged: list[tuple[int, int, list[int]]] = []
    pending: tuple[int, list[int]] | None = None
    ends = [*edges[1:], LOOKUP_MAX_NGRAM + 1]
    for start, end, row in zip(edges, ends, counts, strict=True):
        first, total = (start, row) if pending is None else (pending[0], [a + b for a, b in zip(pending[1], row)])
        pending = (first, total)
        if total[0] >= MIN_OUTCOMES:
            merged.append((first, end - 1, total))
            pending = None
    if pending is not None and merged:  # a short tail joins the bin before it
        first, _, total = merged[-1]
        merged[-1] = (first, LOOKUP_MAX_NGRAM, [a + b for a, b in zip(total, pending[1])])
    return tuple(LookupBin(lo, hi, *fields.leading_rates(row)) for lo, hi, row in merged)


def copy_accepted_by_depth(bins: Sequence[LookupBin], match: int, length: int, depth: int) -> list[float]:
    """Expected accepted drafts of a copy verified k deep, for k in 0..=depth: the sum of running products.

    match: the copy's match length (its bin); length: the drafts the copy holds. A copy verified
    deeper than it holds, or than its bin has rates for, gains nothing there.
    Example: rates (0.5, 0.5), a copy of 3 drafts: [0, 0.5, 0.75, 0.75] at depth 3.
    """
    rates = lookup_rates(bins, match)[:length]
    totals, total, running = [0.0], 0.0, 1.0
    for j in range(depth):
        if j < len(rates):
            running *= rates[j]
            total += running
        totals.append(total)
    return totals


def lookup_rates(bins: Sequence[LookupBin], match: int) -> tuple[float, ...]:
    """The accept rates by position of a copy whose match was `match` tokens long (() without bins)."""
    if not bins:
        return ()
    i = bisect_right([b.min_match for b in bins], match) - 1
    return bins[max(i, 0)].p_accept
