"""Tests for met.speculative.prompt_lookup: the incremental index agrees with brute force; the window adapts."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from met.speculative import ngram
from met.speculative.prompt_lookup import BULK_EXTEND, LookupParams, PromptLookup, next_window


def brute_force(history: list[int], max_ngram: int, min_ngram: int, num_drafts: int,
                lengths: tuple[int, ...] = ()) -> list[int]:
    """Every earlier occurrence of every suffix in range (or of the listed lengths); the longest n, then the latest."""
    best: tuple[int, int] | None = None
    for n in lengths or range(min_ngram, max_ngram + 1):
        for start in range(len(history) - n):  # start + n < len: the occurrence has a continuation
            if history[start : start + n] == history[len(history) - n :]:
                best = max(best or (n, start), (n, start))
    if best is None:
        return []
    n, start = best
    return history[start + n : start + n + num_drafts]


def test_suffix_never_matches_itself() -> None:
    # (1, 2, 3) ends the history and has no earlier occurrence: nothing to propose
    assert PromptLookup(LookupParams(min_ngram=1, max_ngram=3), [1, 2, 3]).propose() == []


def test_final_ngram_finds_previous_occurrence() -> None:
    # (1, 2) ends the history; its earlier occurrence at 0 is followed by [3, 1, 2]
    lookup = PromptLookup(LookupParams(min_ngram=1, max_ngram=2), [1, 2, 3, 1, 2])
    assert lookup.match() == (2, 2)
    assert lookup.propose() == [3, 1, 2]


def test_extend_moves_match_to_latest_occurrence() -> None:
    # after appending [9, 1, 2], (1, 2) last occurred at 3, followed by 9
    lookup = PromptLookup(LookupParams(min_ngram=1, max_ngram=2, initial_window=1), [1, 2, 3, 1, 2])
    lookup.extend([9, 1, 2])
    assert lookup.propose() == [9]


def test_propose_respects_window_and_max_drafts() -> None:
    # window 2 cuts the copy to two tokens; max_drafts=1 cuts it further
    lookup = PromptLookup(LookupParams(min_ngram=1, max_ngram=1, min_window=1, initial_window=2), [1, 5, 6, 7, 1])
    assert lookup.propose() == [5, 6]
    assert lookup.propose(max_drafts=1) == [5]
    assert lookup.copy(10) == [5, 6, 7, 1]


def test_min_ngram_bars_short_matches() -> None:
    # only (1,) recurs, and min_ngram=2 excludes it
    assert PromptLookup(LookupParams(min_ngram=2, max_ngram=3), [1, 2, 3, 1]).propose() == []


def test_index_entries_count_distinct_ngrams_with_continuation() -> None:
    # [1, 2, 1] with n in 1..2: (1,), (2,), (1, 2) have continuations; the final (2, 1) has none yet
    assert PromptLookup(LookupParams(min_ngram=1, max_ngram=2), [1, 2, 1]).index_entries == 3


@pytest.mark.parametrize(
    ("window", "proposed", "accepted", "expected"),
    [
        (4, 4, 4, 8),  # fully accepted copy: double
        (4, 3, 3, 8),  # a copy shorter than the window, fully accepted, still doubles
        (4, 4, 2, 2),  # broken copy: halve
        (4, 4, 0, 2),  # nothing accepted: halve
        (16, 16, 16, 16),  # doubling stops at max_window
        (1, 1, 0, 1),  # halving stops at min_window
        (4, 0, 0, 4),  # nothing proposed: no evidence, no change
    ],
)
def test_next_window(window: int, proposed: int, accepted: int, expected: int) -> None:
    assert next_window(window, proposed, accepted, LookupParams(min_window=1, initial_window=4, max_window=16)) == expected


def test_next_window_rejects_more_accepted_than_proposed() -> None:
    # accepting more drafts than were proposed is a caller bug
    with pytest.raises(ValueError, match="accepted=3"):
        next_window(4, 2, 3, LookupParams())


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_ngram": 0},  # n-grams start at 1
        {"min_ngram": 3, "max_ngram": 2},  # empty range
        {"min_window": 0},  # a window of 0 drafts is no proposer
        {"min_window": 5, "initial_window": 4},  # initial below min
        {"initial_window": 32, "max_window": 16},  # initial above max
        {"max_ngram": 4, "lengths": (1, 5)},  # a listed length outside the range
        {"max_ngram": 4, "lengths": (3, 2)},  # not rising
        {"max_ngram": 4, "lengths": (2, 2)},  # repeated
        {"max_ngram": 4, "lengths": [1, 2]},  # not a tuple
        {"max_ngram": 4, "lengths": (1, True)},  # not whole numbers
    ],
)
def test_params_validate(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        LookupParams(**kwargs)


def test_params_are_frozen() -> None:
    # parameters cannot be changed after validation
    with pytest.raises(AttributeError):
        LookupParams().max_ngram = 9  # type: ignore[misc]


histories = st.lists(st.integers(0, 3), max_size=40)
ranges = st.tuples(st.integers(1, 4), st.integers(0, 3)).map(lambda t: (t[0], t[0] + t[1]))


@given(histories, ranges, st.integers(1, 6))
def test_agrees_with_brute_force_and_ngram(history: list[int], ngram_range: tuple[int, int], num_drafts: int) -> None:
    lo, hi = ngram_range
    lookup = PromptLookup(LookupParams(min_ngram=lo, max_ngram=hi), history)
    expected = brute_force(history, hi, lo, num_drafts)
    assert lookup.copy(num_drafts) == expected
    assert ngram.propose(history, hi, lo, num_drafts) == expected


@given(histories, st.lists(st.integers(0, 5), max_size=8), ranges, st.integers(1, 6))
def test_agrees_after_every_incremental_extend(
    prompt: list[int], cuts: list[int], ngram_range: tuple[int, int], num_drafts: int
) -> None:
    lo, hi = ngram_range
    lookup = PromptLookup(LookupParams(min_ngram=lo, max_ngram=hi))
    history: list[int] = []
    rest = list(prompt)
    for cut in [*cuts, len(rest)]:  # feed in random chunks (including empty ones), checking after each
        chunk, rest = rest[:cut], rest[cut:]
        lookup.extend(chunk)
        history += chunk
        assert lookup.tokens == history
        assert lookup.copy(num_drafts) == brute_force(history, hi, lo, num_drafts)


@given(st.lists(st.integers(0, 4), min_size=BULK_EXTEND + 1, max_size=160), st.lists(st.integers(0, 80), max_size=4),
       ranges, st.integers(1, 6))
def test_bulk_extends_index_as_token_by_token(history: list[int], cuts: list[int], ngram_range: tuple[int, int],
                                              num_drafts: int) -> None:
    """Chunks longer than BULK_EXTEND take the whole-n path; the index must be the one a token at a time builds."""
    lo, hi = ngram_range
    params = LookupParams(min_ngram=lo, max_ngram=hi)
    bulk, single = PromptLookup(params), PromptLookup(params)
    rest, seen = list(history), []
    for cut in [*cuts, len(rest)]:
        chunk, rest = rest[:cut], rest[cut:]
        bulk.extend(chunk)
        for token in chunk:
            single.extend([token])
        seen += chunk
        assert bulk._index == single._index  # every n-gram at the same position, not only the suffix's
        assert bulk.matched_copy(num_drafts) == single.matched_copy(num_drafts)
        assert bulk.copy(num_drafts) == brute_force(seen, hi, lo, num_drafts)


@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20)), max_size=30), st.integers(1, 4), st.integers(0, 3))
def test_window_doubles_on_full_accept_halves_on_break_within_bounds(
    outcomes: list[tuple[int, int]], min_window: int, span: int
) -> None:
    params = LookupParams(min_window=min_window, initial_window=min_window, max_window=min_window << span)
    lookup = PromptLookup(params, [1, 2, 1])
    for a, b in outcomes:
        proposed, accepted = max(a, b), min(a, b)
        before = lookup.window
        lookup.observe(proposed, accepted)
        if proposed == 0:
            assert lookup.window == before
        elif accepted == proposed:
            assert lookup.window == min(params.max_window, before * 2)
        else:
            assert lookup.window == max(params.min_window, before // 2)
        assert params.min_window <= lookup.window <= params.max_window


def test_a_cyclic_copy_goes_on_as_a_loop_where_the_continuation_reaches_the_present() -> None:
    lookup = PromptLookup(LookupParams(min_ngram=1, max_ngram=4), [7, 5, 5, 5])
    assert lookup.matched_copy(3) == (2, [5])  # the docstring's example: (5, 5) last ended at 3
    assert lookup.matched_copy(3, cyclic=True) == (2, [5, 5, 5])
    lookup = PromptLookup(LookupParams(min_ngram=1, max_ngram=4), [1, 2, 3, 9, 1, 2, 3, 9, 1, 2])
    assert lookup.matched_copy(6, cyclic=True) == (4, [3, 9, 1, 2, 3, 9])  # period 4
    assert lookup.copy(6) == [3, 9, 1, 2]  # the proposers' copies stay as they were


@given(st.lists(st.integers(0, 3), min_size=1, max_size=40), st.integers(1, 12))
def test_a_cyclic_copy_extends_the_plain_copy_by_its_own_period(history: list[int], num: int) -> None:
    lookup = PromptLookup(LookupParams(min_ngram=1, max_ngram=4), history)
    n, plain = lookup.matched_copy(num)
    m, cyclic = lookup.matched_copy(num, cyclic=True)
    assert n == m and cyclic[: len(plain)] == plain and len(cyclic) == (num if plain else 0)
    assert all(cyclic[j] == cyclic[j - len(plain)] for j in range(len(plain), len(cyclic)))


@given(histories, st.lists(st.integers(1, 6), min_size=1, max_size=4, unique=True), st.integers(1, 6),
       st.lists(st.integers(0, 50), max_size=3))
def test_listed_lengths_match_the_longest_listed_suffix_at_its_latest_occurrence(
        history: list[int], lengths: list[int], num_drafts: int, cuts: list[int]) -> None:
    listed = tuple(sorted(lengths))
    params = LookupParams(min_ngram=1, max_ngram=6, lengths=listed)
    bulk, single = PromptLookup(params, history), PromptLookup(params)
    for token in history:
        single.extend([token])
    assert bulk._index == single._index
    assert bulk.copy(num_drafts) == brute_force(history, 6, 1, num_drafts, listed)
    found = bulk.match()
    assert found is None or found[0] in listed
