"""Tests for the static MTP draft ladder."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from met.speculative.ladder import mtp_ladder_drafts


@pytest.mark.parametrize(
    ("width", "num_drafts", "expected"),
    [
        (1, 3, 3),  # a single stream verifies every MTP draft
        (8, 3, 3),  # the last full-ladder width
        (9, 3, 1),  # one past it: one draft
        (64, 2, 1),  # wide batches: one draft
        (4, 0, 0),  # no MTP heads: nothing to draft at any width
        (32, 0, 0),  # ... including wide ones (never above num_drafts)
    ],
)
def test_ladder_literals(width: int, num_drafts: int, expected: int) -> None:
    assert mtp_ladder_drafts(width, num_drafts) == expected


@pytest.mark.parametrize(("width", "num_drafts"), [(0, 2), (-1, 2), (4, -1)])
def test_ladder_rejects_bad_input(width: int, num_drafts: int) -> None:
    # an empty step or a negative head count is a caller bug, not a depth
    with pytest.raises(ValueError):
        mtp_ladder_drafts(width, num_drafts)


@given(st.integers(1, 512), st.integers(0, 8))
def test_ladder_shape(width: int, num_drafts: int) -> None:
    # never above num_drafts; full ladder up to width 8, at most one draft beyond
    d = mtp_ladder_drafts(width, num_drafts)
    assert 0 <= d <= num_drafts
    assert d == (num_drafts if width <= 8 else min(1, num_drafts))


@given(st.integers(1, 511), st.integers(0, 8))
def test_ladder_never_grows_with_width(width: int, num_drafts: int) -> None:
    # a wider batch never gets more drafts than a narrower one
    assert mtp_ladder_drafts(width + 1, num_drafts) <= mtp_ladder_drafts(width, num_drafts)
