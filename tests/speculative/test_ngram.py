"""Tests for met.speculative.ngram: literal cases and agreement with a brute-force reference."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from met.speculative.ngram import latest_match, propose


def brute_force(history: list[int], max_ngram: int, min_ngram: int, num_drafts: int) -> list[int]:
    """Every earlier occurrence of every suffix in range; keep the longest n, then the latest start."""
    best: tuple[int, int] | None = None
    for n in range(min_ngram, max_ngram + 1):
        suffix = history[len(history) - n :] if n <= len(history) else None
        for start in range(len(history) - n):  # start + n < len: the occurrence has a continuation
            if history[start : start + n] == suffix:
                best = max(best or (n, start), (n, start))
    if best is None:
        return []
    n, start = best
    return history[start + n : start + n + num_drafts]


@pytest.mark.parametrize(
    ("history", "max_ngram", "min_ngram", "num_drafts", "expected"),
    [
        ([], 3, 1, 1, []),  # empty history: nothing to match
        ([4], 3, 1, 1, []),  # one token: its suffix has no earlier occurrence
        ([1, 2, 3], 3, 1, 1, []),  # no token recurs
        ([1, 2, 1], 3, 1, 1, [2]),  # (1,) occurred at 0, followed by 2
        ([5, 1, 7, 2, 1, 8, 5, 1], 2, 1, 1, [7]),  # (5, 1) beats the later (1,) because it is longer
        ([5, 1, 7, 2, 1, 8, 5, 1], 1, 1, 1, [8]),  # capped at 1: latest earlier (1,) is at 4, followed by 8
        ([1, 2, 1, 3, 1], 1, 1, 1, [3]),  # the latest earlier occurrence wins over the first
        ([1, 2, 3, 1], 3, 2, 1, []),  # min_ngram=2 bars the 1-gram match
        ([1, 2, 3, 4, 1, 2], 2, 1, 3, [3, 4, 1]),  # several drafts copy the continuation
        ([1, 2, 3, 4, 1, 2], 2, 1, 10, [3, 4, 1, 2]),  # the copy stops at the end of the history
        ([7, 7, 7], 2, 1, 4, [7]),  # overlapping occurrence: (7, 7) at 0, continuation runs to the end
        ([1, 2, 1, 2], 2, 1, 0, []),  # zero drafts asked: none proposed
    ],
)
def test_literal_cases(history: list[int], max_ngram: int, min_ngram: int, num_drafts: int, expected: list[int]) -> None:
    assert propose(history, max_ngram, min_ngram, num_drafts) == expected


def test_latest_match_reports_length_and_position() -> None:
    # (5, 1) matched with n=2; it occurred at 0, so its continuation starts at 2
    assert latest_match([5, 1, 7, 2, 1, 8, 5, 1], 2) == (2, 2)


def test_accepts_tuples() -> None:
    # any sequence works, and the result is a list
    assert propose((1, 2, 1), 2, 1, 2) == [2, 1]


@pytest.mark.parametrize(("max_ngram", "min_ngram"), [(0, 1), (2, 3), (3, 0)])
def test_rejects_empty_ngram_range(max_ngram: int, min_ngram: int) -> None:
    # an empty or non-positive n-gram range is a caller bug, said with the values
    with pytest.raises(ValueError, match="min_ngram"):
        propose([1, 2, 1], max_ngram, min_ngram)


def test_rejects_negative_drafts() -> None:
    # a negative draft count is a caller bug
    with pytest.raises(ValueError, match="num_drafts"):
        propose([1, 2, 1], 2, 1, -1)


histories = st.lists(st.integers(0, 3), max_size=40)
ranges = st.tuples(st.integers(1, 4), st.integers(0, 3)).map(lambda t: (t[0] + t[1], t[0]))


@given(histories, ranges, st.integers(0, 6))
def test_agrees_with_brute_force(history: list[int], ngram_range: tuple[int, int], num_drafts: int) -> None:
    max_ngram, min_ngram = ngram_range
    assert propose(history, max_ngram, min_ngram, num_drafts) == brute_force(history, max_ngram, min_ngram, num_drafts)
