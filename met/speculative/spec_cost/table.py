"""The measured cost table: a Cell per (width, depth), the verify of copies (VerifyCell), interpolated in width."""

from bisect import bisect_left
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Self

from met.speculative.spec_cost import fields
from met.speculative.spec_cost.errors import TableParseError
from met.speculative.spec_cost.keys import SCHEMA, TableKey

MAX_WIDTH = 1 << 16  # sequences in one step; far above any batch a box serves
MAX_DEPTH = 64  # drafts per sequence; far above any depth worth verifying

_CELL_REQUIRED = ("n", "k", "verify_s", "draft_s")
_SPREADS = ("verify_s_spread", "draft_s_spread", "verify_j_spread", "draft_j_spread")
_CELL_OPTIONAL = ("verify_j", "draft_j", *_SPREADS, "catchup_s")
_VERIFY_REQUIRED = ("n", "k", "verify_s")
_VERIFY_OPTIONAL = ("verify_j", "verify_s_spread", "verify_j_spread")


@dataclass(frozen=True, slots=True)
class Cell:
    """One measured cell: n sequences, k drafts each (k = 0 is a plain decode step).

    Seconds are wall time of one step; joules are the energy of one step (None when the table
    was measured with energy_source "none"). draft_* are 0 at k = 0 and positive otherwise.
    A *_spread is the spread of the repeated measurements in the same unit (optional).

    catchup_s (optional, k >= 1 only): what a draft step at this width pays beyond draft_s per
    row its sequences' MTP block is behind, each of them (a request's first draft catches up on
    its whole prompt; a draft after plain steps on their rows). draft_s covers a step after a
    drafting step. Wall time only: no joules are measured for it.
    """

    n: int
    k: int
    verify_s: float
    draft_s: float
    verify_j: float | None = None
    draft_j: float | None = None
    verify_s_spread: float | None = None
    draft_s_spread: float | None = None
    verify_j_spread: float | None = None
    draft_j_spread: float | None = None
    catchup_s: float | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        fields.whole(self.n, "n", 1, MAX_WIDTH)
        fields.whole(self.k, "k", 0, MAX_DEPTH)
        set_(self, "verify_s", fields.cost(self.verify_s, "verify_s"))
        set_(self, "draft_s", fields.cost(self.draft_s, "draft_s", zero=self.k == 0))
        if (self.verify_j is None) != (self.draft_j is None):
            absent = "verify_j" if self.verify_j is None else "draft_j"
            raise TableParseError(absent, None, "is missing (a cell has both verify_j and draft_j, or neither)",
                                  show_value=False)
        if self.verify_j is not None:
            set_(self, "verify_j", fields.cost(self.verify_j, "verify_j", unit="J"))
            set_(self, "draft_j", fields.cost(self.draft_j, "draft_j", zero=self.k == 0, unit="J"))
        for attr in _SPREADS:
            set_(self, attr, fields.spread(getattr(self, attr), attr))
            if attr.endswith("_j_spread") and getattr(self, attr) is not None and self.verify_j is None:
                raise TableParseError(attr, getattr(self, attr), "is given for a cell without joules")
        if self.catchup_s is not None:
            if self.k == 0:
                raise TableParseError("catchup_s", self.catchup_s, "is given at k = 0 (a plain step drafts nothing)")
            set_(self, "catchup_s", fields.number(self.catchup_s, "catchup_s"))
            if not 0.0 <= self.catchup_s <= fields.MAX_STEP_S:
                raise TableParseError("catchup_s", self.catchup_s, f"is not a cost per row (0..{fields.MAX_STEP_S:g} s)")

    @property
    def wall_s(self) -> float:
        """Wall seconds of the whole step: verify + draft."""
        return self.verify_s + self.draft_s

    @property
    def energy_j(self) -> float | None:
        """Joules of the whole step: verify + draft (None without an energy source)."""
        return None if self.verify_j is None else self.verify_j + self.draft_j

    def to_dict(self) -> dict:
        """The [[cells]] entry as tomli-w writes it: absent fields are left out, not written empty."""
        names = _CELL_REQUIRED + _CELL_OPTIONAL
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}


@dataclass(frozen=True, slots=True)
class VerifyCell:
    """The verify of copies: n sequences, k drafts each that no drafter made (prompt lookup's copies).

    What verifying k copies costs, in the same units as Cell's verify_s and verify_j: at depths up
    to the table's kmax beside the cell's verify, which a drafting step pays (on a CPU timed in a
    decode it carries the drafter's bookkeeping and colder caches, so copies cost less), and past
    kmax, where the drafter stops and a long match's copy goes on, alone.
    """

    n: int
    k: int
    verify_s: float
    verify_j: float | None = None
    verify_s_spread: float | None = None
    verify_j_spread: float | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        fields.whole(self.n, "n", 1, MAX_WIDTH)
        fields.whole(self.k, "k", 1, MAX_DEPTH)
        set_(self, "verify_s", fields.cost(self.verify_s, "verify_s"))
        if self.verify_j is not None:
            set_(self, "verify_j", fields.cost(self.verify_j, "verify_j", unit="J"))
        for attr in ("verify_s_spread", "verify_j_spread"):
            set_(self, attr, fields.spread(getattr(self, attr), attr))
        if self.verify_j_spread is not None and self.verify_j is None:
            raise TableParseError("verify_j_spread", self.verify_j_spread, "is given for a cell without joules")

    def to_dict(self) -> dict:
        """The [[verify_cells]] entry as tomli-w writes it (absent fields left out)."""
        names = _VERIFY_REQUIRED + _VERIFY_OPTIONAL
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}


@dataclass(frozen=True, slots=True)
class CostTable:
    """A parsed, validated cost table: its key, a cell at every depth 0..=kmax of every width, and [meta].

    verify_cells (optional): per width, the verify of copies (VerifyCell) at each depth from 1, or
    from kmax + 1, to that width's deepest, without a gap (none at some widths, or at all). A copy
    k deep is priced at its verify cell where there is one, else at the cell's verify_s.
    """

    key: TableKey
    cells: tuple[Cell, ...] | Iterable[Cell]
    meta: Mapping[str, object] = field(default_factory=dict)
    verify_cells: tuple[VerifyCell, ...] | Iterable[VerifyCell] = ()
    _index: dict[tuple[int, int], Cell] = field(init=False, repr=False, compare=False)
    _copies: dict[tuple[int, int], VerifyCell] = field(init=False, repr=False, compare=False)  # measured verify cells
    # verify_cell's other answers (a cell where no verify cell was measured, or interpolated), made once
    _copies_made: dict[tuple[int, int], Cell | VerifyCell] = field(init=False, repr=False, compare=False)
    _widths: tuple[int, ...] = field(init=False, repr=False, compare=False)  # the planner asks every step
    _between: dict[tuple[int, int], Cell] = field(init=False, repr=False, compare=False)  # interpolated, made once
    _rows: dict[int, tuple] = field(init=False, repr=False, compare=False)
    _deepest: dict[int, int] = field(init=False, repr=False, compare=False)  # measured widths' deepest verify cells
    _depths: dict[int, int] = field(init=False, repr=False, compare=False)  # verify_depth's answers, made once

    def __post_init__(self) -> None:
        if not isinstance(self.key, TableKey):
            raise TableParseError("key", self.key, "is not a TableKey")
        cells = list(self.cells)
        if not cells:
            raise TableParseError("cells", None, "is empty (a table has at least one width)", show_value=False)
        index: dict[tuple[int, int], int] = {}
        for i, cell in enumerate(cells):
            if not isinstance(cell, Cell):
                raise TableParseError(f"cells[{i}]", cell, "is not a Cell")
            _check_energy(cell, i, self.key.energy_source)
            if (cell.n, cell.k) in index:
                raise TableParseError(f"cells[{i}]", None, f"duplicates the cell n={cell.n} k={cell.k} at "
                                      f"cells[{index[cell.n, cell.k]}]", show_value=False)
            index[cell.n, cell.k] = i
        kmax = max(k for _, k in index)
        for n in sorted({n for n, _ in index}):
            for k in range(kmax + 1):
                if (n, k) not in index:
                    raise TableParseError("cells", None, f"width n={n} has no cell at k={k} (every width needs "
                                          f"a cell at each depth 0..={kmax})", show_value=False)
        object.__setattr__(self, "cells", tuple(sorted(cells, key=lambda c: (c.n, c.k))))
        widths = tuple(sorted({n for n, _ in index}))
        object.__setattr__(self, "verify_cells", _checked_verify_cells(list(self.verify_cells), kmax, widths,
                                                                       self.key.energy_source))
        object.__setattr__(self, "meta", MappingProxyType(fields.meta(self.meta)))
        object.__setattr__(self, "_index", {(c.n, c.k): c for c in self.cells})
        object.__setattr__(self, "_copies", {(c.n, c.k): c for c in self.verify_cells})
        object.__setattr__(self, "_copies_made", {})
        object.__setattr__(self, "_widths", widths)
        object.__setattr__(self, "_between", {})
        deepest = {c.n: c.k for c in self.verify_cells}  # sorted by (n, k): each width's last is its deepest
        object.__setattr__(self, "_deepest", deepest)
        object.__setattr__(self, "_depths", {})
        object.__setattr__(self, "_rows", {})  # verify_row's, by width

    @property
    def widths(self) -> tuple[int, ...]:
        """The measured widths, ascending."""
        return self._widths

    @property
    def kmax(self) -> int:
        """The deepest measured depth (every width has cells 0..=kmax)."""
        return self.cells[-1].k  # cells are sorted by (n, k), and every width has the same depths

    def verify_depth(self, n: int) -> int:
        """The deepest verify priced at width n: its verify cells' deepest, or kmax where that is deeper.

        Between two measured widths the lesser of theirs (an interpolation needs both ends); outside
        them, the nearest width's.
        """
        if type(n) is not int or not 1 <= n <= MAX_WIDTH:
            raise ValueError(f"width {n!r} is not a whole number in 1..={MAX_WIDTH}")
        known = self._depths.get(n)
        if known is None:
            widths = self.widths
            i = bisect_left(widths, n)
            measured = i < len(widths) and widths[i] == n
            ends = [n] if measured else [widths[j] for j in (i - 1, i) if 0 <= j < len(widths)]
            known = self._depths[n] = min(max(self.kmax, self._deepest.get(w, 0)) for w in ends)
        return known

    @property
    def has_energy(self) -> bool:
        """Whether the cells carry joules (energy_source is not "none")."""
        return self.key.energy_source != "none"

    def cell(self, n: int, k: int) -> Cell:
        """The cost at width n, depth k: linear in width between measured widths, the nearest outside.

        The returned cell's n is the width asked for; an interpolated cell has no spreads.
        Example: widths 1 and 5 with verify_s 1.0 and 3.0 give verify_s 1.5 at n = 2.
        """
        if type(n) is int and type(k) is int:  # the planner asks several times a step: measured, or made before
            known = self._index.get((n, k)) or self._between.get((n, k))
            if known is not None:
                return known
        _check_width(n)
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= self.kmax:
            raise ValueError(f"depth {k!r} is outside the table's 0..={self.kmax}")
        widths = self.widths
        i = bisect_left(widths, n)
        if i == 0 or i == len(widths):
            made = replace(self._index[widths[0 if i == 0 else -1], k], n=n)
        else:
            lo, hi = self._index[widths[i - 1], k], self._index[widths[i], k]
            made = _between(lo, hi, n, k)
        self._between[n, k] = made
        return made

    def verify_cell(self, n: int, k: int) -> Cell | VerifyCell:
        """What verifying k copies per sequence costs at width n, up to verify_depth(n): the verify cell where
        the table has one, else the cell (k <= kmax; k = 0, a plain step: the cell); linear in width between
        measured widths, as cell().

        Only verify_s and verify_j mean the same in both (a VerifyCell prices no draft). Between a width
        with a verify cell at k and one without, the verify cell and the other's cell are interpolated.
        """
        if type(n) is int and type(k) is int:
            known = self._copies.get((n, k)) or self._copies_made.get((n, k))
            if known is not None:
                return known
        _check_width(n)
        deepest = self.verify_depth(n)
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= deepest:
            raise ValueError(f"depth {k!r} is outside the table's 0..={deepest} at width {n}")
        widths = self.widths
        i = bisect_left(widths, n)
        if k == 0 or (i < len(widths) and widths[i] == n):
            made = self.cell(n, k)  # a plain step; or no verify cell here (measured ones were found above)
        elif i == 0 or i == len(widths):
            end = widths[0 if i == 0 else -1]
            made = replace(self._copies.get((end, k)) or self._index[end, k], n=n)
        else:
            lo, hi = (self._copies.get((w, k)) or self._index[w, k] for w in (widths[i - 1], widths[i]))
            made = _between(lo, hi, n, k)
        self._copies_made[n, k] = made
        return made

    def verify_row(self, n: int) -> tuple[Cell | VerifyCell, ...]:
        """verify_cell(n, k) for every k in 0..=verify_depth(n), made once per width (the planner weighs every
        copy depth of a step)."""
        row = self._rows.get(n)
        if row is None:
            row = self._rows[n] = tuple(self.verify_cell(n, k) for k in range(self.verify_depth(n) + 1))
        return row

    def step_joules(self, n: int, k: int, drafted: bool = True, draft_width: int | None = None) -> float | None:
        """Joules of a step that verified k drafts per sequence at width n (and drafted them, unless a host did).

        None when the table has no energy. Priced at the deepest drafts verified: drafts made and then
        dropped before the verify are not priced. draft_width: how many of the n sequences the
        drafter drafted for (the rest copied, or had no room), priced at that width's draft; None: all n.
        A step that drafted for none is priced at the verify of copies (verify_cell), as deep as
        verify_depth(n).
        """
        cell = self.verify_cell(n, k) if not drafted or draft_width == 0 else self.cell(n, k)
        if cell.verify_j is None:
            return None
        if not drafted or draft_width == 0:
            return cell.verify_j
        return cell.verify_j + self.cell(draft_width or n, k).draft_j

    def to_toml(self) -> str:
        """The table as TOML text; parse(to_toml()) gives back an equal table."""
        doc = {"schema": self.key.schema, "key": self.key.to_dict(), "meta": dict(self.meta)}
        arrays = {"cells": [c.to_dict() for c in self.cells]}
        if self.verify_cells:
            arrays["verify_cells"] = [c.to_dict() for c in self.verify_cells]
        return fields.dump(doc, arrays)

    @classmethod
    def parse(cls, text: str) -> Self:
        """Parse and validate a table's TOML text; raises only TableParseError, whatever the text."""
        return cls.from_doc(fields.load(text))

    @classmethod
    def from_doc(cls, doc: Mapping) -> Self:
        """Validate a table TOML has been parsed into (parse's second half: a reader that parsed it once)."""
        if "schema" in doc:  # first: a file of another schema may have any fields
            fields.schema(doc, SCHEMA)
        if "drafter" in doc and "key" not in doc:  # say what the file is, not that [drafter] is unknown here
            raise TableParseError("drafter", None, "belongs to a calibration: this file is a drafter's calibration, "
                                  "not a cost table", show_value=False)
        fields.shape(doc, "", ("schema", "key", "cells"), ("meta", "verify_cells"))
        key = TableKey.from_dict(fields.table(doc, "key", ""), doc["schema"])
        cells = _parsed(doc, "cells", Cell, _CELL_REQUIRED, _CELL_OPTIONAL)
        verify_cells = _parsed(doc, "verify_cells", VerifyCell, _VERIFY_REQUIRED, _VERIFY_OPTIONAL) \
            if "verify_cells" in doc else []
        return cls(key, cells, doc.get("meta", {}), verify_cells)


def _check_width(n: object) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_WIDTH:
        raise ValueError(f"width {n!r} is not a whole number in 1..={MAX_WIDTH}")


def _between(lo: Cell | VerifyCell, hi: Cell | VerifyCell, n: int, k: int) -> Cell | VerifyCell:
    """The cost at width n, lo.n < n < hi.n, linear in width: a Cell between two cells, else a VerifyCell
    (the verify alone: a verify cell and a cell share only verify_s and verify_j)."""

    def lerp(attr: str) -> float | None:
        a, b = getattr(lo, attr), getattr(hi, attr)
        # Weighted form: exact at the ends, and positive whenever both ends are.
        return None if a is None else (a * (hi.n - n) + b * (n - lo.n)) / (hi.n - lo.n)

    if isinstance(lo, VerifyCell) or isinstance(hi, VerifyCell):
        return VerifyCell(n, k, lerp("verify_s"), lerp("verify_j"))
    catchup = lerp("catchup_s") if hi.catchup_s is not None else None
    return Cell(n, k, lerp("verify_s"), lerp("draft_s"), lerp("verify_j"), lerp("draft_j"), catchup_s=catchup)


def _parsed(doc: Mapping, name: str, kind: type, required: tuple[str, ...], optional: tuple[str, ...]) -> list:
    """The array of tables `name` as `kind`s, each checked for its fields; errors name the entry."""
    parsed = []
    for i, raw in enumerate(fields.tables(doc, name, "")):
        try:
            fields.shape(raw, "", required, optional)
            parsed.append(kind(**raw))
        except TableParseError as exc:
            raise exc.within(f"{name}[{i}]") from None
    return parsed


def _checked_verify_cells(cells: list, kmax: int, widths: tuple[int, ...], source: str) -> tuple[VerifyCell, ...]:
    """The verify cells sorted, after checking each width's run from 1 (or kmax + 1) to its deepest, without a gap."""
    where: dict[tuple[int, int], int] = {}
    for i, cell in enumerate(cells):
        if not isinstance(cell, VerifyCell):
            raise TableParseError(f"verify_cells[{i}]", cell, "is not a VerifyCell")
        if (source == "none") != (cell.verify_j is None):
            raise TableParseError(f"verify_cells[{i}].verify_j", cell.verify_j,
                                  f"must be {'absent' if source == 'none' else 'given'} under key.energy_source "
                                  f"\"{source}\" (as in every cell)", show_value=cell.verify_j is not None)
        if cell.n not in widths:
            raise TableParseError(f"verify_cells[{i}].n", cell.n, f"is not a width of the cells {widths}")
        if (cell.n, cell.k) in where:
            raise TableParseError(f"verify_cells[{i}]", None, f"duplicates the verify cell n={cell.n} k={cell.k} "
                                  f"at verify_cells[{where[cell.n, cell.k]}]", show_value=False)
        where[cell.n, cell.k] = i
    for n in widths:
        depths = sorted(k for m, k in where if m == n)
        if not depths:
            continue
        first = 1 if depths[0] <= kmax else kmax + 1
        for k in range(first, depths[-1] + 1):
            if (n, k) not in where:
                raise TableParseError("verify_cells", None, f"width n={n} has no verify cell at k={k} (a width's "
                                      f"verify cells run from k=1, or from k={kmax + 1}, to its deepest, "
                                      f"{depths[-1]}, without a gap)", show_value=False)
    return tuple(sorted(cells, key=lambda c: (c.n, c.k)))


def _check_energy(cell: Cell, i: int, source: str) -> None:
    if source == "none" and cell.verify_j is not None:
        raise TableParseError(f"cells[{i}].verify_j", cell.verify_j,
                              "is given but key.energy_source is \"none\" (a table measured without a meter has no joules)")
    if source != "none" and cell.verify_j is None:
        raise TableParseError(f"cells[{i}].verify_j", None, f"is missing (key.energy_source is \"{source}\", "
                              "so every cell has verify_j and draft_j)", show_value=False)
