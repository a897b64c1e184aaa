"""Cross-request prompt lookup: a bounded n-gram index over recent finished requests, split into isolated scopes.

A sequence whose own history has no match may copy the continuation of the same n-gram from what
earlier requests of its scope held. A scope is (model, tokenizer, LoRA adapter, tenant): tokens
are only comparable under one model and tokenizer, an adapter changes what follows what, and a
tenant must never see another tenant's text. Each scope has its own index, so a lookup can only
ever reach its own scope's tokens.

The budget is the total number of tokens held across all scopes. Eviction is oldest request
first, across scopes (one global arrival order): the budget bounds host memory, which all scopes
share, and a per-scope quota would leave memory idle while one tenant is busy. A request longer
than the whole budget is not held. Evicting a request removes every index entry that points into
it; since it is its scope's oldest, no entry could fall back to an older occurrence.

Matching: the longest suffix n-gram of the caller's history (n in [min_ngram, max_ngram], or
the params' listed lengths) whose latest occurrence with a continuation lies in the newest held
request of the scope containing it, at its latest position; the proposal is that request's tokens
after it. Requests are separate streams: an n-gram never spans two requests.

The scheduler thread owns an instance; there is no lock.
"""

from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import count, repeat

from met.speculative.prompt_lookup import check_lengths, longest_suffix, ngram_lengths


@dataclass(frozen=True, slots=True)
class ScopeKey:
    """Who may share tokens: requests that agree on all four fields."""

    model: str
    tokenizer: str
    lora_adapter: str | None  # None: the base model
    tenant: str


@dataclass(frozen=True, slots=True)
class SharedLookupParams:
    """Token budget over all scopes and the n-gram range matched."""

    budget_tokens: int = 1 << 20  # total tokens held across scopes (~100 B of index per token and n)
    min_ngram: int = 2  # across requests a single shared token is too weak evidence to copy on
    max_ngram: int = 4
    lengths: tuple[int, ...] = ()  # the n indexed and matched, rising, within the range; (): every n in it

    @property
    def ngrams(self) -> tuple[int, ...]:
        """The n-gram lengths indexed, rising."""
        return ngram_lengths(self.lengths, self.min_ngram, self.max_ngram)

    @classmethod
    def index_bound(cls, min_ngram: int, max_ngram: int, lengths: tuple[int, ...] = ()) -> "SharedLookupParams":
        """An n-gram range (or its listed lengths) with the budget that bounds its index as the default's.

        Index entries are tokens x lengths indexed: the measured planner's six lengths (2 to 12) get
        half the default's tokens, so that host memory holds the same number of index entries.
        """
        default = cls()
        entries = default.budget_tokens * len(default.ngrams)
        return cls(max(1, entries // len(ngram_lengths(lengths, min_ngram, max_ngram))), min_ngram, max_ngram, lengths)

    def __post_init__(self) -> None:
        if self.budget_tokens < 1:
            raise ValueError(f"budget_tokens={self.budget_tokens}; pass a budget of at least 1 token")
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(
                f"n-gram range [min_ngram={self.min_ngram}, max_ngram={self.max_ngram}] is empty or starts below 1; "
                "pass 1 <= min_ngram <= max_ngram"
            )
        check_lengths(self.lengths, self.min_ngram, self.max_ngram)


class SharedLookup:
    """Recent requests' tokens, indexed per scope, under one global token budget."""

    __slots__ = ("params", "_ngrams", "_ids", "_held", "_order", "_index", "_scope_tokens", "_scope_requests",
                 "_tokens_held")

    def __init__(self, params: SharedLookupParams | None = None) -> None:
        self.params = params if params is not None else SharedLookupParams()
        self._ngrams = self.params.ngrams  # the lengths indexed, rising: asked on every match
        self._ids = count()
        self._held: dict[int, tuple[ScopeKey, tuple[int, ...]]] = {}  # request id -> (scope, tokens)
        self._order: deque[int] = deque()  # request ids, oldest first, all scopes
        # scope -> n-gram -> (request id, position just after its latest occurrence with a continuation)
        self._index: dict[ScopeKey, dict[tuple[int, ...], tuple[int, int]]] = {}
        self._scope_tokens: dict[ScopeKey, int] = {}
        self._scope_requests: dict[ScopeKey, int] = {}
        self._tokens_held = 0

    @property
    def tokens_held(self) -> int:
        """Tokens held across all scopes (never more than the budget)."""
        return self._tokens_held

    @property
    def requests_held(self) -> int:
        """Requests held across all scopes."""
        return len(self._order)

    @property
    def index_entries(self) -> int:
        """Distinct (scope, n-gram) entries indexed; bounded by tokens held x n-gram range."""
        return sum(len(index) for index in self._index.values())

    def scopes(self) -> list[ScopeKey]:
        """Scopes that hold at least one request."""
        return list(self._scope_requests)

    def scope_tokens(self, scope: ScopeKey) -> int:
        """Tokens held for one scope."""
        return self._scope_tokens.get(scope, 0)

    def scope_requests(self, scope: ScopeKey) -> int:
        """Requests held for one scope."""
        return self._scope_requests.get(scope, 0)

    def add_request(self, scope: ScopeKey, tokens: Iterable[int]) -> bool:
        """Hold a finished request's prompt + output under its scope, evicting oldest first; False if not held."""
        held = tuple(tokens)
        if not 0 < len(held) <= self.params.budget_tokens:
            return False
        while self._tokens_held + len(held) > self.params.budget_tokens:
            self._evict_oldest()
        rid = next(self._ids)
        self._held[rid] = (scope, held)
        self._order.append(rid)
        self._tokens_held += len(held)
        self._scope_tokens[scope] = self._scope_tokens.get(scope, 0) + len(held)
        self._scope_requests[scope] = self._scope_requests.get(scope, 0) + 1
        index = self._index.setdefault(scope, {})
        for n in self._lengths(len(held)):  # later positions and newer requests overwrite: latest wins
            index.update(zip(self._grams(held, n), zip(repeat(rid), range(n, len(held)))))
        return True

    def match(self, scope: ScopeKey, history: Sequence[int],
              longer_than: int = 0) -> tuple[int, tuple[int, ...], int] | None:
        """(n, held request's tokens, position after the match) for the longest suffix found, or None.

        longer_than: only a match longer than this (the measured planner passes its history's own).
        """
        index = self._index.get(scope)
        if not index:
            return None
        found = longest_suffix(index, history, self._ngrams, len(history), longer_than)
        if found is None:
            return None
        n, (rid, after) = found
        return n, self._held[rid][1], after

    def matched_copy(self, scope: ScopeKey, history: Sequence[int], num_drafts: int,
                     longer_than: int = 0) -> tuple[int, list[int]]:
        """(n, up to num_drafts tokens that followed it) for the longest suffix match longer than `longer_than`.

        (0, []) when there is none (or num_drafts < 1). The measured planner asks with its history's
        own match length, so that only a longer match from another request is weighed against it.
        """
        found = self.match(scope, history, longer_than) if num_drafts > 0 else None
        if found is None:
            return 0, []
        n, tokens, after = found
        return n, list(tokens[after: after + num_drafts])

    def propose(self, scope: ScopeKey, history: Sequence[int], num_drafts: int) -> list[int]:
        """Return up to num_drafts tokens that followed the history's suffix in the scope's held requests."""
        return self.matched_copy(scope, history, num_drafts)[1]

    def _lengths(self, size: int) -> list[int]:
        """The n-gram lengths a request of `size` tokens is indexed at (an n-gram needs a token after it)."""
        return [n for n in self._ngrams if n < size]

    @staticmethod
    def _grams(tokens: tuple[int, ...], n: int) -> Iterator[tuple[int, ...]]:
        """The n-grams of tokens that have a continuation, in order of position (n shifted slices zipped, in C)."""
        end = len(tokens)
        return zip(*[tokens[i: end - n + i] for i in range(n)])

    def _evict_oldest(self) -> None:
        rid = self._order.popleft()
        scope, tokens = self._held.pop(rid)
        index = self._index[scope]
        for n in self._lengths(len(tokens)):
            for key in self._grams(tokens, n):
                hit = index.get(key)
                if hit is not None and hit[0] == rid:
                    del index[key]
        self._tokens_held -= len(tokens)
        self._scope_tokens[scope] -= len(tokens)
        self._scope_requests[scope] -= 1
        if self._scope_requests[scope] == 0:
            del self._scope_tokens[scope], self._scope_requests[scope], self._index[scope]
