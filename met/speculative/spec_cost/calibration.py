"""The drafter's acceptance calibration: P(accept | top-1 log-prob), per-position priors, the carry-over, chains."""

import math
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Self

from met.speculative.spec_cost import fields
from met.speculative.spec_cost.fields import MIN_OUTCOMES
from met.speculative.spec_cost.errors import SpecCostError, TableParseError
from met.speculative.spec_cost.keys import SCHEMA, DrafterKey
from met.speculative.spec_cost.lookup import SHARED_MIN_NGRAM, LookupBin, check_bins, copy_accepted_by_depth


MAX_POSITION = 1 << 10  # draft positions in a chain; far deeper than any drafter drafts
ROUNDING = 1e-4  # a float32 log_softmax can put a top-1 log-prob a hair above 0; up to this is 0
# The fit's starting bins, as top-1 probabilities: bin i holds log-probs in (log P[i-1], log P[i]].
# Adjacent bins are then merged until each holds MIN_OUTCOMES; the last bin always ends at 0.
FIT_EDGES = tuple(p / 20 for p in range(1, 19)) + (0.95, 0.975, 0.99, 1.0)


@dataclass(frozen=True, slots=True)
class ConfidenceBin:
    """Drafts whose top-1 log-prob is at most `upper` (and above the previous bin's): their accept rate."""

    upper: float
    p_accept: float
    outcomes: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "upper", fields.number(self.upper, "upper"))
        if self.upper > 0.0:
            raise TableParseError("upper", self.upper, "is not a log-probability (<= 0)")
        object.__setattr__(self, "p_accept", fields.probability(self.p_accept, "p_accept"))
        fields.whole(self.outcomes, "outcomes", MIN_OUTCOMES, 1 << 62)


@dataclass(frozen=True, slots=True)
class PositionPrior:
    """The accept rate of the draft at `position` (1-based) in a chain, whatever its confidence."""

    position: int
    p_accept: float
    outcomes: int

    def __post_init__(self) -> None:
        fields.whole(self.position, "position", 1, MAX_POSITION)
        object.__setattr__(self, "p_accept", fields.probability(self.p_accept, "p_accept"))
        fields.whole(self.outcomes, "outcomes", MIN_OUTCOMES, 1 << 62)


@dataclass(frozen=True, slots=True)
class CarryBin:
    """The next step's accept rates after a step whose first draft had a top-1 log-prob of at most `upper`.

    p_accept[j - 1] is the rate of the next step's draft at position j (conditional on its chain so
    far, like every rate here), outcomes[j - 1] the judged drafts behind it, each at least
    MIN_OUTCOMES. Positions past the list take the position priors.
    """

    upper: float
    p_accept: tuple[float, ...] | list[float]
    outcomes: tuple[int, ...] | list[int]

    def __post_init__(self) -> None:
        object.__setattr__(self, "upper", fields.number(self.upper, "upper"))
        if self.upper > 0.0:
            raise TableParseError("upper", self.upper, "is not a log-probability (<= 0)")
        rates, counts = fields.position_rates(self.p_accept, self.outcomes, MAX_POSITION)
        object.__setattr__(self, "p_accept", rates)
        object.__setattr__(self, "outcomes", counts)


@dataclass(frozen=True, slots=True)
class AcceptanceCalibration:
    """How likely a draft is to be accepted, from the drafter's top-1 log-probability for it.

    Fitted on one drafter. Every probability rests on >= MIN_OUTCOMES outcomes. An outcome is a
    draft that was judged, i.e. every draft before it in its chain was accepted, so each rate is
    conditional on the chain so far and a chain's expected accepted length is the sum of the
    running products: p1 + p1*p2 + p1*p2*p3 + ... (accepted drafts only; the bonus not counted).

    A draft with a confidence uses its bin (bins rise with confidence); one without uses the
    prior of its position, else of the deepest measured position before it, else the overall rate.

    The carry-over answers a question asked before any draft of a step exists: given the top-1
    log-prob of the previous step's first draft, how likely is this step's draft at each position
    to be accepted? A draft's confidence says much about that draft and less about the next step's
    (after a first draft under log-prob -1, accepted itself about 0.4 of the time, the next
    step's first draft was accepted about 0.65 of the time: benchmarks/studies/confidence_carryover.py),
    so it is fitted on its own, on consecutive steps of the same sequences. Its bins are not
    forced to rise with confidence. A calibration without it answers with the position priors.

    `lookup` (optional) is prompt lookup's: accept rates by position for copies from the history,
    by the length of the match they copy from (met.speculative.spec_cost.lookup), fitted on the
    same greedy generations. With it the measured planner may verify a copy instead of drafting;
    without it (a calibration written before it existed) the planner drafts only with the drafter.
    `shared_lookup` (optional) has the same rates for copies from other requests (the tenant's shared
    lookup cache), by their match length from SHARED_MIN_NGRAM, judged only where that match was
    longer than the history's own; without it the planner copies from each sequence's own history only.
    """

    drafter: DrafterKey
    p_overall: float  # the accept rate over every outcome at every position
    outcomes: int  # every judged draft the calibration was fitted on
    bins: tuple[ConfidenceBin, ...] | Iterable[ConfidenceBin] = ()
    position_priors: tuple[PositionPrior, ...] | Iterable[PositionPrior] = ()
    meta: Mapping[str, object] = field(default_factory=dict)
    carryover: tuple[CarryBin, ...] | Iterable[CarryBin] = ()
    lookup: tuple[LookupBin, ...] | Iterable[LookupBin] = ()
    shared_lookup: tuple[LookupBin, ...] | Iterable[LookupBin] = ()
    _uppers: list[float] = field(init=False, repr=False, compare=False)  # the bins' uppers, for bisect
    _positions: list[int] = field(init=False, repr=False, compare=False)  # the priors' positions, for bisect
    _carry_uppers: list[float] = field(init=False, repr=False, compare=False)  # the carry-over bins' uppers
    _carried: dict[int, tuple[float, ...]] = field(init=False, repr=False, compare=False)  # per carry bin, made once
    # per ask: (match, length, depth, shared) -> expected accepted drafts by depth
    _copied: dict[tuple[int, int, int, bool], tuple[float, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.drafter, DrafterKey):
            raise TableParseError("drafter", self.drafter, "is not a DrafterKey")
        object.__setattr__(self, "p_overall", fields.probability(self.p_overall, "overall.p_accept"))
        fields.whole(self.outcomes, "overall.outcomes", MIN_OUTCOMES, 1 << 62)
        bins, priors, carry = tuple(self.bins), tuple(self.position_priors), tuple(self.carryover)
        _check_uppers("bins", bins, ConfidenceBin)
        for i in range(1, len(bins)):
            if bins[i].p_accept < bins[i - 1].p_accept:
                raise TableParseError(f"bins[{i}].p_accept", bins[i].p_accept, f"is below bins[{i - 1}].p_accept "
                                      f"({bins[i - 1].p_accept}); the rate never falls as confidence rises")
        for i, prior in enumerate(priors):
            if not isinstance(prior, PositionPrior):
                raise TableParseError(f"position_priors[{i}]", prior, "is not a PositionPrior")
            if i and prior.position <= priors[i - 1].position:
                raise TableParseError(f"position_priors[{i}].position", prior.position,
                                      f"is not after position_priors[{i - 1}].position ({priors[i - 1].position})")
        _check_uppers("carryover", carry, CarryBin)
        lookup, shared = tuple(self.lookup), tuple(self.shared_lookup)
        check_bins(lookup)
        check_bins(shared, SHARED_MIN_NGRAM, "shared_lookup")
        counted = (("bins", sum(b.outcomes for b in bins)), ("position_priors", sum(p.outcomes for p in priors)),
                   ("carryover", sum(sum(c.outcomes) for c in carry)))
        for name, total in counted:
            if total > self.outcomes:
                raise TableParseError(name, None, f"count more outcomes than the overall outcomes ({self.outcomes})",
                                      show_value=False)
        object.__setattr__(self, "bins", bins)
        object.__setattr__(self, "position_priors", priors)
        object.__setattr__(self, "carryover", carry)
        object.__setattr__(self, "lookup", lookup)
        object.__setattr__(self, "shared_lookup", shared)
        object.__setattr__(self, "meta", MappingProxyType(fields.meta(self.meta)))
        object.__setattr__(self, "_uppers", [b.upper for b in bins])
        object.__setattr__(self, "_positions", [p.position for p in priors])
        object.__setattr__(self, "_carry_uppers", [c.upper for c in carry])
        object.__setattr__(self, "_carried", {})
        object.__setattr__(self, "_copied", {})

    @classmethod
    def fit(cls, outcomes: Iterable[tuple], drafter: DrafterKey, meta: Mapping[str, object] | None = None,
            lookup: Iterable[LookupBin] = (), shared_lookup: Iterable[LookupBin] = ()) -> Self:
        """Fit from judged drafts (lookup, shared_lookup: prompt lookup's bins, fitted apart); SpecCostError if too few.

        A judged draft is (top-1 log-prob or None, accepted, 1-based position), optionally with a
        fourth value: the top-1 log-prob of the first draft of its sequence's previous step (None:
        there was none). Drafts with that value fit the carry-over.
        """
        rows = [_outcome(row, i) for i, row in enumerate(outcomes)]
        if len(rows) < MIN_OUTCOMES:
            raise SpecCostError(f"a calibration needs at least {MIN_OUTCOMES} judged drafts, got {len(rows)}; "
                                "run more prompts through met bench spec-cost")
        accepted = sum(row[1] for row in rows)
        bins = _monotone(_merge_small(_by_confidence([(c, ok, 1) for c, ok, _, _ in rows if c is not None], 1)))
        by_position: dict[int, list[int]] = {}
        for _, ok, position, _ in rows:
            slot = by_position.setdefault(position, [0, 0])
            slot[0] += 1
            slot[1] += ok
        priors = [PositionPrior(pos, a / n, n) for pos, (n, a) in sorted(by_position.items()) if n >= MIN_OUTCOMES]
        carried = [(prev, ok, pos) for _, ok, pos, prev in rows if prev is not None]
        carry = []
        if carried:
            deepest = max(pos for _, _, pos in carried)
            carry = [_carry_bin(u, counts) for u, counts in _merge_small(_by_confidence(carried, deepest))]
        return cls(drafter, accepted / len(rows), len(rows),
                   [ConfidenceBin(u, a / n, n) for u, (n, a) in bins], priors, meta or {}, carry, lookup, shared_lookup)

    def p_accept(self, confidence: float | None, position: int) -> float:
        """P(accept) of the draft at `position` (1-based) with top-1 log-prob `confidence` (None: unknown)."""
        if isinstance(position, bool) or not isinstance(position, int) or position < 1:
            raise ValueError(f"position {position!r} is not a 1-based whole number")
        if confidence is not None and not confidence <= ROUNDING:  # also refuses NaN, binned or not
            raise ValueError(f"confidence {confidence!r} is not a log-probability (<= 0); pass log p, not p")
        if confidence is not None and self.bins:
            i = bisect_left(self._uppers, confidence)
            return self.bins[min(i, len(self.bins) - 1)].p_accept
        i = bisect_left(self._positions, position + 1) - 1  # the prior at position, else the deepest before it
        return self.position_priors[i].p_accept if i >= 0 else self.p_overall

    def p_carried(self, previous: float | None, position: int) -> float:
        """P(accept) of a step's draft at `position` after a step whose first draft had top-1 log-prob `previous`.

        The carry-over's rate where it has one; else (no previous draft, no carry-over, or a
        position past its bin's) the position's prior.
        """
        index = self.carry_index(previous)
        if index >= 0 and position <= len(rates := self.carryover[index].p_accept):
            return rates[position - 1]
        return self.p_accept(None, position)

    def carry_index(self, previous: float | None) -> int:
        """The carry-over bin a previous first draft's log-prob falls in; -1 where none applies (the priors do)."""
        if previous is None or not self.carryover:
            return -1
        if not previous <= ROUNDING:  # also refuses NaN
            raise ValueError(f"previous confidence {previous!r} is not a log-probability (<= 0)")
        return min(bisect_left(self._carry_uppers, previous), len(self.carryover) - 1)

    def _carried_rates(self, previous: float | None, depth: int) -> tuple[float, ...]:
        """p_carried(previous, j) for j in 1..=depth, or further: made once per carry-over bin, as deep as asked.

        The planner asks on every plan of every step (at depths up to its kmax); the answer depends
        only on the bin `previous` falls in, so each bin's rates are kept, as deep as the deepest ask.
        """
        index = self.carry_index(previous)
        rates = self._carried.get(index, ())
        if len(rates) < depth:
            rates = tuple(self.p_carried(previous, j) for j in range(1, depth + 1))
            self._carried[index] = rates
        return rates

    def expected_accepted(self, chain: Sequence[float | None]) -> float:
        """Expected accepted drafts of a chain (its drafts' confidences in order): the sum of running products."""
        return self.expected_accepted_by_depth(chain, len(chain))[-1]

    def expected_accepted_by_depth(self, chain: Sequence[float | None], depth: int,
                                   previous: float | None = None) -> list[float]:
        """expected_accepted of the chain's first k drafts for every k in 0..=depth, in one pass.

        Drafts past the end of `chain` have no confidence: the carry-over of `previous` (the
        previous step's first-draft log-prob; None: none) applies, which is the position priors
        when it is None. Example: priors 0.5 everywhere and no confidences give [0, 0.5, 0.75] at depth 2.
        """
        known = len(chain)
        carried = self._carried_rates(previous, depth) if depth > known else ()
        totals, total, running = [0.0], 0.0, 1.0
        for j in range(depth):
            running *= self.p_accept(chain[j], j + 1) if j < known else carried[j]
            total += running
            totals.append(total)
        return totals

    def copy_accepted_by_depth(self, match: int, length: int, depth: int, shared: bool = False) -> tuple[float, ...]:
        """Expected accepted drafts of a prompt-lookup copy verified k deep, k in 0..=depth (all 0 without its bins).

        match: the length of the history's match the copy follows; length: the drafts it holds;
        shared: a copy from another request (`shared_lookup`'s bins), else from the history (`lookup`'s).
        Made once per (match, length, depth, shared): the planner asks for every sequence on every
        step, and the answers are few (match lengths up to 12, copies and depths up to its copy depth).
        """
        key = (match, length, depth, shared)
        totals = self._copied.get(key)
        if totals is None:
            bins = self.shared_lookup if shared else self.lookup
            totals = tuple(copy_accepted_by_depth(bins, match, length, depth)) if bins else (0.0,) * (depth + 1)
            self._copied[key] = totals
        return totals

    def to_toml(self) -> str:
        """The calibration as TOML text; parse(to_toml()) gives back an equal calibration."""
        doc = {"schema": SCHEMA, "drafter": {"kind": self.drafter.kind, "name": self.drafter.name,
                                             "digest": self.drafter.digest},
               "overall": {"p_accept": self.p_overall, "outcomes": self.outcomes}, "meta": dict(self.meta)}
        arrays = {"bins": [{"upper": b.upper, "p_accept": b.p_accept, "outcomes": b.outcomes} for b in self.bins],
                  "position_priors": [{"position": p.position, "p_accept": p.p_accept, "outcomes": p.outcomes}
                                      for p in self.position_priors],
                  "carryover": [{"upper": c.upper, "p_accept": list(c.p_accept), "outcomes": list(c.outcomes)}
                                for c in self.carryover],
                  **{name: [{"min_match": b.min_match, "max_match": b.max_match, "p_accept": list(b.p_accept),
                             "outcomes": list(b.outcomes)} for b in bins]
                     for name, bins in (("lookup", self.lookup), ("shared_lookup", self.shared_lookup))}}
        return fields.dump(doc, arrays)

    @classmethod
    def parse(cls, text: str) -> Self:
        """Parse and validate a calibration's TOML text; raises only TableParseError, whatever the text."""
        return cls.from_doc(fields.load(text))

    @classmethod
    def from_doc(cls, doc: Mapping) -> Self:
        """Validate a calibration TOML has been parsed into (parse's second half: a reader that parsed it once)."""
        if "schema" in doc:
            fields.schema(doc, SCHEMA)
        if "key" in doc and "drafter" not in doc:  # say what the file is, not that [key] is unknown here
            raise TableParseError("key", None, "belongs to a cost table: this file is a cost table, not a drafter's "
                                  "calibration", show_value=False)
        fields.shape(doc, "", ("schema", "drafter", "overall"),
                     ("bins", "position_priors", "meta", "carryover", "lookup", "shared_lookup"))
        drafter = _part(doc, "drafter", ("kind", "name", "digest"), DrafterKey)
        overall = fields.table(doc, "overall", "")
        try:
            fields.shape(overall, "", ("p_accept", "outcomes"))
        except TableParseError as exc:
            raise exc.within("overall") from None
        bins = _parts(doc, "bins", ("upper", "p_accept", "outcomes"), ConfidenceBin)
        priors = _parts(doc, "position_priors", ("position", "p_accept", "outcomes"), PositionPrior)
        carry = _parts(doc, "carryover", ("upper", "p_accept", "outcomes"), CarryBin)
        lookup, shared = (_parts(doc, name, ("min_match", "max_match", "p_accept", "outcomes"), LookupBin)
                          for name in ("lookup", "shared_lookup"))
        return cls(drafter, overall["p_accept"], overall["outcomes"], bins, priors, doc.get("meta", {}), carry, lookup,
                   shared)


def _check_uppers(name: str, bins: tuple, kind: type) -> None:
    """Bins by log-prob: each a `kind`, uppers strictly rising, the last exactly 0 (they cover every log-prob)."""
    for i, b in enumerate(bins):
        if not isinstance(b, kind):
            raise TableParseError(f"{name}[{i}]", b, f"is not a {kind.__name__}")
        if i and b.upper <= bins[i - 1].upper:
            raise TableParseError(f"{name}[{i}].upper", b.upper, f"is not above {name}[{i - 1}].upper "
                                  f"({bins[i - 1].upper}); bins go in rising confidence")
    if bins and bins[-1].upper != 0.0:
        raise TableParseError(f"{name}[{len(bins) - 1}].upper", bins[-1].upper,
                              "must be 0.0 in the last bin (the bins cover every log-prob)")


def _part(doc: Mapping, key: str, names: tuple[str, ...], make: type) -> object:
    raw = fields.table(doc, key, "")
    try:
        fields.shape(raw, "", names)
        return make(**raw)
    except TableParseError as exc:
        raise exc.within(key) from None


def _parts(doc: Mapping, key: str, names: tuple[str, ...], make: type) -> list:
    if key not in doc:
        return []
    made = []
    for i, raw in enumerate(fields.tables(doc, key, "")):
        try:
            fields.shape(raw, "", names)
            made.append(make(**raw))
        except TableParseError as exc:
            raise exc.within(f"{key}[{i}]") from None
    return made


def _outcome(row: object, i: int) -> tuple[float | None, bool, int, float | None]:
    if not isinstance(row, tuple | list) or len(row) not in (3, 4):
        raise TableParseError(f"outcomes[{i}]", row, "is not (confidence, accepted, position[, previous])")
    confidence, accepted, position, previous = (*row, None) if len(row) == 3 else row
    confidence = _log_prob(confidence, f"outcomes[{i}].confidence")
    if not isinstance(accepted, bool):
        raise TableParseError(f"outcomes[{i}].accepted", accepted, "is not a bool")
    fields.whole(position, f"outcomes[{i}].position", 1, MAX_POSITION)
    return confidence, accepted, position, _log_prob(previous, f"outcomes[{i}].previous")


def _log_prob(value: object, field: str) -> float | None:
    """None, or a finite log-probability (up to ROUNDING above 0, taken as it is)."""
    if value is None:
        return None
    result = fields.number(value, field)
    if result > ROUNDING:
        raise TableParseError(field, value, "is not a log-probability (<= 0)")
    return result


Counts = tuple[int, ...]  # per position 1..P: outcomes then accepted, (n1, a1, n2, a2, ...)


def _by_confidence(rows: list[tuple[float, bool, int]], positions: int) -> list[tuple[float, Counts]]:
    """The fit's starting bins over (log-prob, accepted, position) rows: (upper, counts) of each non-empty bin."""
    edges = [math.log(p) for p in FIT_EDGES[:-1]]
    grid = [[0] * (2 * positions) for _ in FIT_EDGES]
    for confidence, ok, position in rows:
        if position <= positions:
            slot = grid[bisect_left(edges, confidence)]
            slot[2 * position - 2] += 1
            slot[2 * position - 1] += ok
    return [(upper, tuple(counts)) for upper, counts in zip([*edges, 0.0], grid, strict=True) if counts[0]]


def _merge_small(bins: list[tuple[float, Counts]]) -> list[tuple[float, Counts]]:
    """Merge adjacent (upper, counts) bins, left to right, until each has MIN_OUTCOMES at position 1."""
    merged: list[tuple[float, Counts]] = []
    pending: tuple[float, Counts] | None = None
    for upper, counts in bins:
        pending = (upper, counts if pending is None else _plus(pending[1], counts))
        if pending[1][0] >= MIN_OUTCOMES:
            merged.append(pending)
            pending = None
    if pending is not None and merged:  # a short tail joins the bin before it, or is dropped if there is none
        merged[-1] = (pending[0], _plus(merged[-1][1], pending[1]))
    if merged:
        merged[-1] = (0.0, merged[-1][1])  # the last bin reaches log-prob 0
    return merged


def _plus(a: Counts, b: Counts) -> Counts:
    return tuple(x + y for x, y in zip(a, b, strict=True))


def _monotone(bins: list[tuple[float, Counts]]) -> list[tuple[float, Counts]]:
    """Pool adjacent violators of (upper, (outcomes, accepted)) bins until the rate never falls as confidence rises."""
    pooled: list[tuple[float, Counts]] = []
    for upper, counts in bins:
        pooled.append((upper, counts))
        # a_prev / n_prev > a / n, compared exactly in integers
        while len(pooled) > 1 and pooled[-2][1][1] * pooled[-1][1][0] > pooled[-1][1][1] * pooled[-2][1][0]:
            (_, before), (u1, last) = pooled.pop(-2), pooled.pop()
            pooled.append((u1, _plus(before, last)))
    return pooled


def _carry_bin(upper: float, counts: Counts) -> CarryBin:
    """A carry-over bin of the positions, from the first, that each rest on MIN_OUTCOMES."""
    return CarryBin(upper, *fields.leading_rates(counts))
