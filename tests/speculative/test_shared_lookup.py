"""Tests for met.speculative.shared_lookup: scope isolation, the token budget, oldest-first eviction, brute force."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from met.speculative.shared_lookup import ScopeKey, SharedLookup, SharedLookupParams

BASE = ScopeKey(model="m", tokenizer="t", lora_adapter=None, tenant="a")
# The base scope and four neighbours, each differing from it in exactly one field.
SCOPES = [
    BASE,
    ScopeKey(model="m2", tokenizer="t", lora_adapter=None, tenant="a"),
    ScopeKey(model="m", tokenizer="t2", lora_adapter=None, tenant="a"),
    ScopeKey(model="m", tokenizer="t", lora_adapter="lora", tenant="a"),
    ScopeKey(model="m", tokenizer="t", lora_adapter=None, tenant="b"),
]


def alphabet(scope_no: int) -> range:
    """Scope i draws tokens from its own 3 values, disjoint from every other scope's."""
    return range(10 * scope_no, 10 * scope_no + 3)


def brute_force(held: list[tuple[ScopeKey, list[int]]], scope: ScopeKey, history: list[int], params: SharedLookupParams, k: int) -> list[int]:
    """Longest suffix first; within it the newest request of the scope, then its latest position with a continuation."""
    for n in range(min(params.max_ngram, len(history)), params.min_ngram - 1, -1):
        suffix = history[len(history) - n :]
        for owner, tokens in reversed(held):
            if owner != scope:
                continue
            for after in range(len(tokens) - 1, n - 1, -1):
                if tokens[after - n : after] == suffix:
                    return tokens[after : after + k]
    return []


def test_copies_continuation_from_same_scope() -> None:
    # an earlier request held (1, 2) followed by 3, 4
    shared = SharedLookup(SharedLookupParams(budget_tokens=100, min_ngram=2, max_ngram=3))
    shared.add_request(BASE, [1, 2, 3, 4])
    assert shared.propose(BASE, [9, 1, 2], 2) == [3, 4]


def test_whole_history_may_be_the_suffix() -> None:
    # a 2-token history can match in another request: the occurrence need not be earlier in the same stream
    shared = SharedLookup(SharedLookupParams(budget_tokens=100, min_ngram=2, max_ngram=2))
    shared.add_request(BASE, [1, 2, 3])
    assert shared.propose(BASE, [1, 2], 5) == [3]


def test_newest_request_wins() -> None:
    # both requests hold (1, 2); the newer one's continuation is proposed
    shared = SharedLookup(SharedLookupParams(budget_tokens=100, min_ngram=2, max_ngram=2))
    shared.add_request(BASE, [1, 2, 3])
    shared.add_request(BASE, [1, 2, 4])
    assert shared.propose(BASE, [1, 2], 1) == [4]


def test_ngrams_do_not_span_requests() -> None:
    # (2, 3) only exists across the boundary of two requests, so nothing matches
    shared = SharedLookup(SharedLookupParams(budget_tokens=100, min_ngram=2, max_ngram=2))
    shared.add_request(BASE, [1, 2])
    shared.add_request(BASE, [3, 4])
    assert shared.propose(BASE, [2, 3], 1) == []


@pytest.mark.parametrize("other", SCOPES[1:])
def test_other_scope_sees_nothing(other: ScopeKey) -> None:
    # the same tokens under a scope differing in one field are invisible
    shared = SharedLookup(SharedLookupParams(budget_tokens=100, min_ngram=2, max_ngram=2))
    shared.add_request(BASE, [1, 2, 3])
    assert shared.propose(other, [1, 2], 1) == []
    assert shared.propose(BASE, [1, 2], 1) == [3]


def test_evicts_oldest_across_scopes_within_budget() -> None:
    # budget 8: the third request pushes out the first (another scope's), not the second
    shared = SharedLookup(SharedLookupParams(budget_tokens=8, min_ngram=2, max_ngram=2))
    shared.add_request(SCOPES[1], [1, 2, 3])
    shared.add_request(BASE, [5, 6, 7])
    shared.add_request(BASE, [8, 9, 10])
    assert shared.tokens_held == 6 and shared.requests_held == 2
    assert shared.scope_requests(SCOPES[1]) == 0 and shared.scope_tokens(BASE) == 6
    assert shared.scopes() == [BASE]
    assert shared.propose(SCOPES[1], [1, 2], 1) == []
    assert shared.propose(BASE, [5, 6], 1) == [7]


def test_request_over_budget_is_not_held() -> None:
    # a request larger than the whole budget is refused and evicts nothing
    shared = SharedLookup(SharedLookupParams(budget_tokens=4, min_ngram=2, max_ngram=2))
    assert shared.add_request(BASE, [1, 2, 3])
    assert not shared.add_request(BASE, [1, 2, 3, 4, 5])
    assert not shared.add_request(BASE, [])
    assert shared.tokens_held == 3 and shared.requests_held == 1


def test_eviction_leaves_no_index_entries_behind() -> None:
    # once the only request holding (1, 2) is evicted, its entry goes with it; (7, 8) is all that is left
    shared = SharedLookup(SharedLookupParams(budget_tokens=3, min_ngram=2, max_ngram=2))
    shared.add_request(BASE, [1, 2, 3])
    shared.add_request(SCOPES[4], [7, 8, 9])
    assert shared.index_entries == 1
    assert shared.scopes() == [SCOPES[4]]
    assert shared.propose(BASE, [1, 2], 1) == []


@pytest.mark.parametrize(
    "kwargs",
    [
        {"budget_tokens": 0},  # a budget must hold something
        {"min_ngram": 0},  # n-grams start at 1
        {"min_ngram": 3, "max_ngram": 2},  # empty range
    ],
)
def test_params_validate(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        SharedLookupParams(**kwargs)


def test_scope_key_is_frozen_and_hashable() -> None:
    # scopes key dicts, so they must be immutable values
    assert ScopeKey("m", "t", None, "a") == BASE and hash(ScopeKey("m", "t", None, "a")) == hash(BASE)
    with pytest.raises(AttributeError):
        BASE.tenant = "b"  # type: ignore[misc]


# A stream of finished requests: (scope number, token offsets into its alphabet).
requests = st.lists(
    st.tuples(st.integers(0, len(SCOPES) - 1), st.lists(st.integers(0, 2), min_size=0, max_size=12)),
    max_size=25,
)
params_st = st.builds(
    SharedLookupParams,
    budget_tokens=st.integers(1, 40),
    min_ngram=st.integers(1, 2),
    max_ngram=st.integers(2, 3),
)


def scoped(scope_no: int, offsets: list[int]) -> list[int]:
    """Map small offsets into the scope's own alphabet."""
    return [alphabet(scope_no)[o] for o in offsets]


@given(requests, params_st, st.lists(st.integers(0, 2), max_size=6), st.integers(1, 5))
def test_matches_brute_force_model_with_oldest_first_eviction(
    stream: list[tuple[int, list[int]]], params: SharedLookupParams, query: list[int], k: int
) -> None:
    shared = SharedLookup(params)
    model: list[tuple[ScopeKey, list[int]]] = []  # what should be held, oldest first
    for scope_no, offsets in stream:
        tokens = scoped(scope_no, offsets)
        held = shared.add_request(SCOPES[scope_no], tokens)
        assert held == (0 < len(tokens) <= params.budget_tokens)
        if held:
            model.append((SCOPES[scope_no], tokens))
            while sum(len(t) for _, t in model) > params.budget_tokens:
                model.pop(0)  # oldest first, whatever its scope
        assert shared.tokens_held == sum(len(t) for _, t in model) <= params.budget_tokens
        assert shared.requests_held == len(model)
        for scope in SCOPES:
            assert shared.scope_tokens(scope) == sum(len(t) for s, t in model if s == scope)
            assert shared.scope_requests(scope) == sum(1 for s, _ in model if s == scope)
        for scope_no_q, scope in enumerate(SCOPES):
            history = scoped(scope_no_q, query)
            assert shared.propose(scope, history, k) == brute_force(model, scope, history, params, k)
    # every index entry belongs to a held request: the distinct n-grams with a continuation, per scope
    distinct = {
        (scope, tuple(tokens[after - n : after]))
        for scope, tokens in model
        for after in range(1, len(tokens))
        for n in range(params.min_ngram, min(params.max_ngram, after) + 1)
    }
    assert shared.index_entries == len(distinct)


@given(requests, st.integers(0, len(SCOPES) - 1), st.lists(st.integers(0, 40), max_size=8), st.integers(1, 5))
def test_never_proposes_another_scopes_tokens(
    stream: list[tuple[int, list[int]]], asking: int, history: list[int], k: int
) -> None:
    # the history may hold any scope's tokens (even copies of another scope's text); proposals stay in-scope
    shared = SharedLookup(SharedLookupParams(budget_tokens=60, min_ngram=1, max_ngram=3))
    for scope_no, offsets in stream:
        shared.add_request(SCOPES[scope_no], scoped(scope_no, offsets))
    own = set(alphabet(asking))
    assert set(shared.propose(SCOPES[asking], history, k)) <= own
    for scope_no, offsets in stream:  # replaying another scope's request as the history must find nothing
        if scope_no != asking:
            assert shared.propose(SCOPES[asking], scoped(scope_no, offsets), k) == []


def test_matched_copy_answers_only_a_match_longer_than_asked() -> None:
    shared = SharedLookup(SharedLookupParams(budget_tokens=100, min_ngram=2, max_ngram=4))
    shared.add_request(BASE, [1, 2, 3, 4, 5, 6])
    assert shared.matched_copy(BASE, [9, 2, 3, 4], 2) == (3, [5, 6])  # (2, 3, 4): three tokens
    assert shared.matched_copy(BASE, [9, 2, 3, 4], 2, longer_than=2) == (3, [5, 6])
    assert shared.matched_copy(BASE, [9, 2, 3, 4], 2, longer_than=3) == (0, [])  # the history's own is as long
    assert shared.matched_copy(BASE, [9, 2, 3, 4], 9) == (3, [5, 6])  # the held request ends there
    assert shared.matched_copy(BASE, [9, 2, 3, 4], 0) == (0, [])
    assert shared.matched_copy(SCOPES[4], [9, 2, 3, 4], 2) == (0, [])  # another tenant's tokens: never


def test_a_wider_ngram_range_keeps_the_defaults_index_bound() -> None:
    default = SharedLookupParams()
    wide = SharedLookupParams.index_bound(2, 12)
    assert (wide.min_ngram, wide.max_ngram, wide.ngrams) == (2, 12, tuple(range(2, 13)))
    entries = default.budget_tokens * (default.max_ngram - default.min_ngram + 1)
    assert wide.budget_tokens * 11 <= entries < (wide.budget_tokens + 1) * 11


def test_listed_lengths_are_the_only_ones_indexed_and_matched() -> None:
    shared = SharedLookup(SharedLookupParams(budget_tokens=100, min_ngram=2, max_ngram=6, lengths=(2, 4)))
    shared.add_request(BASE, [1, 2, 3, 4, 5, 6])
    # the history's last 3 tokens (2, 3, 4) recur, but 3 is not listed: matched as its last 2, (3, 4)
    assert shared.matched_copy(BASE, [9, 2, 3, 4], 2) == (2, [5, 6])
    assert shared.matched_copy(BASE, [1, 2, 3, 4], 2) == (4, [5, 6])
    assert shared.matched_copy(BASE, [1, 2, 3, 4], 2, longer_than=3) == (4, [5, 6])
    assert shared.index_entries == 4 + 2  # the 2-grams and 4-grams with a continuation
    with pytest.raises(ValueError, match="lengths"):
        SharedLookupParams(min_ngram=2, max_ngram=4, lengths=(1, 2))
    bound = SharedLookupParams.index_bound(2, 12, (2, 3, 4, 6, 8, 12))
    assert bound.budget_tokens == SharedLookupParams().budget_tokens * 3 // 6 and bound.ngrams == (2, 3, 4, 6, 8, 12)
