"""The n-gram proposer: copy what followed the latest earlier occurrence of the history's longest recurring suffix.

This is the simple, obviously correct reference that `prompt_lookup` (the indexed, incremental
proposer the engine uses) must agree with. It scans the history on every call, so its cost grows
with the history; use it for tests and as a baseline, not in the decode loop.

Worked example, history [5, 1, 7, 2, 1, 8, 5, 1] with max_ngram=2:
the suffix (5, 1) occurred earlier at index 0, so the proposal starts with what followed it, 7.
With max_ngram=1 the suffix (1,) is matched instead; its latest earlier occurrence is at index 4,
followed by 8.
"""

from collections.abc import Sequence


def check_ngram_range(min_ngram: int, max_ngram: int) -> None:
    """Raise ValueError unless 1 <= min_ngram <= max_ngram."""
    if not 1 <= min_ngram <= max_ngram:
        raise ValueError(
            f"n-gram range [min_ngram={min_ngram}, max_ngram={max_ngram}] is empty or starts below 1; "
            "pass 1 <= min_ngram <= max_ngram"
        )


def latest_match(history: Sequence[int], max_ngram: int, min_ngram: int = 1) -> tuple[int, int] | None:
    """Return (n, position just after the latest earlier occurrence) of the longest recurring suffix, or None."""
    check_ngram_range(min_ngram, max_ngram)
    tokens = list(history)
    length = len(tokens)
    # A suffix of length n needs a different, earlier occurrence, so n <= length - 1.
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        suffix = tokens[length - n :]
        # Start at the latest start that is not the suffix itself and walk back: the first hit is the latest.
        for start in range(length - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                return n, start + n
    return None


def propose(history: Sequence[int], max_ngram: int, min_ngram: int = 1, num_drafts: int = 1) -> list[int]:
    """Return up to num_drafts tokens that followed the latest earlier occurrence of the longest recurring suffix."""
    if num_drafts < 0:
        raise ValueError(f"num_drafts={num_drafts} is negative; pass 0 or more")
    match = latest_match(history, max_ngram, min_ngram)
    if match is None or num_drafts == 0:
        return []
    _, after = match
    return list(history[after : after + num_drafts])
