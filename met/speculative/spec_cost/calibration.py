"""The drafter's acceptance calibration: P(accept | top-1 log-prob), per-position priors, chains."""

import math
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Self

from met.speculative.spec_cost import fields
from met.speculative.spec_cost.errors import SpecCostError, TableParseError
from met.speculative.spec_cost.keys import SCHEMA, DrafterKey

MIN_OUTCOMES = 100
"""The fewest observations behind one fitted probability: a binomial standard error of at most 0.05 at any rate."""

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
class AcceptanceCalibration:
    """How likely a draft is to be accepted, from the drafter's top-1 log-probability for it.

    Fitted on one drafter. Every probability rests on >= MIN_OUTCOMES outcomes. An outcome is a
    draft that was judged, i.e. every draft before it in its chain was accepted, so each rate is
    conditional on the chain so far and a chain's expected accepted length is the sum of the
    running products: p1 + p1*p2 + p1*p2*p3 + ... (accepted drafts only; the bonus not counted).

    A draft with a confidence uses its bin (bins rise with confidence); one without uses the
    prior of its position, else of the deepest measured position before it, else the overall rate.
    """

    drafter: DrafterKey
    p_overall: float  # the accept rate over every outcome at every position
    outcomes: int  # every judged draft the calibration was fitted on
    bins: tuple[ConfidenceBin, ...] | Iterable[ConfidenceBin] = ()
    position_priors: tuple[PositionPrior, ...] | Iterable[PositionPrior] = ()
    meta: Mapping[str, object] = field(default_factory=dict)
    _uppers: list[float] = field(init=False, repr=False, compare=False)  # the bins' uppers, for bisect
    _positions: list[int] = field(init=False, repr=False, compare=False)  # the priors' positions, for bisect

    def __post_init__(self) -> None:
        if not isinstance(self.drafter, DrafterKey):
            raise TableParseError("drafter", self.drafter, "is not a DrafterKey")
        object.__setattr__(self, "p_overall", fields.probability(self.p_overall, "overall.p_accept"))
        fields.whole(self.outcomes, "overall.outcomes", MIN_OUTCOMES, 1 << 62)
        bins, priors = tuple(self.bins), tuple(self.position_priors)
        for i, b in enumerate(bins):
            if not isinstance(b, ConfidenceBin):
                raise TableParseError(f"bins[{i}]", b, "is not a ConfidenceBin")
            if i and b.upper <= bins[i - 1].upper:
                raise TableParseError(f"bins[{i}].upper", b.upper, f"is not above bins[{i - 1}].upper "
                                      f"({bins[i - 1].upper}); bins go in rising confidence")
            if i and b.p_accept < bins[i - 1].p_accept:
                raise TableParseError(f"bins[{i}].p_accept", b.p_accept, f"is below bins[{i - 1}].p_accept "
                                      f"({bins[i - 1].p_accept}); the rate never falls as confidence rises")
        if bins and bins[-1].upper != 0.0:
            raise TableParseError(f"bins[{len(bins) - 1}].upper", bins[-1].upper,
                                  "must be 0.0 in the last bin (the bins cover every log-prob)")
        for i, prior in enumerate(priors):
            if not isinstance(prior, PositionPrior):
                raise TableParseError(f"position_priors[{i}]", prior, "is not a PositionPrior")
            if i and prior.position <= priors[i - 1].position:
                raise TableParseError(f"position_priors[{i}].position", prior.position,
                                      f"is not after position_priors[{i - 1}].position ({priors[i - 1].position})")
        for name, parts in (("bins", bins), ("position_priors", priors)):
            if sum(p.outcomes for p in parts) > self.outcomes:
                raise TableParseError(name, None, f"count more outcomes than the overall outcomes ({self.outcomes})",
                                      show_value=False)
        object.__setattr__(self, "bins", bins)
        object.__setattr__(self, "position_priors", priors)
        object.__setattr__(self, "meta", MappingProxyType(fields.meta(self.meta)))
        object.__setattr__(self, "_uppers", [b.upper for b in bins])
        object.__setattr__(self, "_positions", [p.position for p in priors])

    @classmethod
    def fit(cls, outcomes: Iterable[tuple[float | None, bool, int]], drafter: DrafterKey,
            meta: Mapping[str, object] | None = None) -> Self:
        """Fit from judged drafts (top-1 log-prob or None, accepted, 1-based position); SpecCostError if too few."""
        rows = [_outcome(row, i) for i, row in enumerate(outcomes)]
        if len(rows) < MIN_OUTCOMES:
            raise SpecCostError(f"a calibration needs at least {MIN_OUTCOMES} judged drafts, got {len(rows)}; "
                                "run more prompts through met bench spec-cost")
        accepted = sum(a for _, a, _ in rows)
        edges = [math.log(p) for p in FIT_EDGES[:-1]]
        grid = [[0, 0] for _ in FIT_EDGES]  # per starting bin: [outcomes, accepted]
        for confidence, ok, _ in rows:
            if confidence is not None:
                slot = grid[bisect_left(edges, confidence)]
                slot[0] += 1
                slot[1] += ok
        uppers = [*edges, 0.0]
        bins = _monotone(_merge_small([(u, n, a) for u, (n, a) in zip(uppers, grid, strict=True) if n]))
        by_position: dict[int, list[int]] = {}
        for _, ok, position in rows:
            slot = by_position.setdefault(position, [0, 0])
            slot[0] += 1
            slot[1] += ok
        priors = [PositionPrior(pos, a / n, n) for pos, (n, a) in sorted(by_position.items()) if n >= MIN_OUTCOMES]
        return cls(drafter, accepted / len(rows), len(rows),
                   [ConfidenceBin(u, a / n, n) for u, n, a in bins], priors, meta or {})

    def p_accept(self, confidence: float | None, position: int) -> float:
        """P(accept) of the draft at `position` (1-based) with top-1 log-prob `confidence` (None: unknown)."""
        if isinstance(position, bool) or not isinstance(position, int) or position < 1:
            raise ValueError(f"position {position!r} is not a 1-based whole number")
        if confidence is not None and self.bins:
            if not confidence <= ROUNDING:  # also refuses NaN
                raise ValueError(f"confidence {confidence!r} is not a log-probability (<= 0); pass log p, not p")
            i = bisect_left(self._uppers, confidence)
            return self.bins[min(i, len(self.bins) - 1)].p_accept
        i = bisect_left(self._positions, position + 1) - 1  # the prior at position, else the deepest before it
        return self.position_priors[i].p_accept if i >= 0 else self.p_overall

    def expected_accepted(self, chain: Sequence[float | None]) -> float:
        """Expected accepted drafts of a chain (its drafts' confidences in order): the sum of running products."""
        return self.expected_accepted_by_depth(chain, len(chain))[-1]

    def expected_accepted_by_depth(self, chain: Sequence[float | None], depth: int) -> list[float]:
        """expected_accepted of the chain's first k drafts for every k in 0..=depth, in one pass.

        Drafts past the end of `chain` have no confidence: their position priors apply.
        Example: priors 0.5 everywhere and no confidences give [0, 0.5, 0.75] at depth 2.
        """
        totals, total, running = [0.0], 0.0, 1.0
        for position in range(1, depth + 1):
            running *= self.p_accept(chain[position - 1] if position <= len(chain) else None, position)
            total += running
            totals.append(total)
        return totals

    def to_toml(self) -> str:
        """The calibration as TOML text; parse(to_toml()) gives back an equal calibration."""
        doc = {"schema": SCHEMA, "drafter": {"kind": self.drafter.kind, "name": self.drafter.name,
                                             "digest": self.drafter.digest},
               "overall": {"p_accept": self.p_overall, "outcomes": self.outcomes}, "meta": dict(self.meta)}
        arrays = {"bins": [{"upper": b.upper, "p_accept": b.p_accept, "outcomes": b.outcomes} for b in self.bins],
                  "position_priors": [{"position": p.position, "p_accept": p.p_accept, "outcomes": p.outcomes}
                                      for p in self.position_priors]}
        return fields.dump(doc, arrays)

    @classmethod
    def parse(cls, text: str) -> Self:
        """Parse and validate a calibration's TOML text; raises only TableParseError, whatever the text."""
        doc = fields.load(text)
        if "schema" in doc:
            fields.schema(doc, SCHEMA)
        fields.shape(doc, "", ("schema", "drafter", "overall"), ("bins", "position_priors", "meta"))
        drafter = _part(doc, "drafter", ("kind", "name", "digest"), DrafterKey)
        overall = fields.table(doc, "overall", "")
        try:
            fields.shape(overall, "", ("p_accept", "outcomes"))
        except TableParseError as exc:
            raise exc.within("overall") from None
        bins = _parts(doc, "bins", ("upper", "p_accept", "outcomes"), ConfidenceBin)
        priors = _parts(doc, "position_priors", ("position", "p_accept", "outcomes"), PositionPrior)
        return cls(drafter, overall["p_accept"], overall["outcomes"], bins, priors, doc.get("meta", {}))


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


def _outcome(row: object, i: int) -> tuple[float | None, bool, int]:
    try:
        confidence, accepted, position = row  # type: ignore[misc]
    except (TypeError, ValueError):
        raise TableParseError(f"outcomes[{i}]", row, "is not (confidence, accepted, position)") from None
    if confidence is not None:
        confidence = fields.number(confidence, f"outcomes[{i}].confidence")
        if confidence > ROUNDING:
            raise TableParseError(f"outcomes[{i}].confidence", confidence, "is not a log-probability (<= 0)")
    if not isinstance(accepted, bool):
        raise TableParseError(f"outcomes[{i}].accepted", accepted, "is not a bool")
    fields.whole(position, f"outcomes[{i}].position", 1, MAX_POSITION)
    return confidence, accepted, position


def _merge_small(bins: list[tuple[float, int, int]]) -> list[tuple[float, int, int]]:
    """Merge adjacent (upper, outcomes, accepted) bins, left to right, until each has MIN_OUTCOMES."""
    merged: list[tuple[float, int, int]] = []
    pending = (0.0, 0, 0)
    for upper, n, a in bins:
        pending = (upper, pending[1] + n, pending[2] + a)
        if pending[1] >= MIN_OUTCOMES:
            merged.append(pending)
            pending = (0.0, 0, 0)
    if pending[1]:  # a short tail joins the bin before it, or is dropped if there is none
        if merged:
            _, n, a = merged.pop()
            merged.append((pending[0], n + pending[1], a + pending[2]))
    if merged:
        merged[-1] = (0.0, merged[-1][1], merged[-1][2])  # the last bin reaches log-prob 0
    return merged


def _monotone(bins: list[tuple[float, int, int]]) -> list[tuple[float, int, int]]:
    """Pool adjacent violators: merge neighbours until the rate never falls as confidence rises."""
    pooled: list[tuple[float, int, int]] = []
    for upper, n, a in bins:
        pooled.append((upper, n, a))
        # a_prev / n_prev > a / n, compared exactly in integers
        while len(pooled) > 1 and pooled[-2][2] * pooled[-1][1] > pooled[-1][2] * pooled[-2][1]:
            (_, n2, a2), (u1, n1, a1) = pooled.pop(-2), pooled.pop()
            pooled.append((u1, n1 + n2, a1 + a2))
    return pooled
