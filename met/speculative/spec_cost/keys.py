"""What a table and a calibration were measured under (TableKey, DrafterKey) and how keys differ."""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import ClassVar, Self

from met.speculative.spec_cost import fields
from met.speculative.spec_cost.errors import SpecCostError, TableParseError

SCHEMA = 1
"""Schema version of the table and calibration files; bumped when a field changes meaning."""

ENERGY_SOURCES = ("nvml", "rapl", "none")
"""Where a table's joules came from; "none" means it was measured in wall time only."""

_KEY_FIELDS = ("box_class", "recipe", "energy_source", "plan_digests")


@dataclass(frozen=True, slots=True)
class TableKey:
    """What a table was measured under. Equal keys are the only licence to use it.

    `plan_digests` maps each mode measured ("decode", "verify", "draft_mtp", ...) to the hash of
    everything that changes its cost; it is stored as sorted (mode, digest) pairs so the key is
    hashable. A serve builds its own TableKey with the digests of the modes it will run.
    """

    box_class: str
    recipe: str
    energy_source: str
    plan_digests: tuple[tuple[str, str], ...] | Mapping[str, str]
    schema: int = SCHEMA

    def __post_init__(self) -> None:
        fields.text(self.box_class, "box_class")
        fields.text(self.recipe, "recipe")
        if self.energy_source not in ENERGY_SOURCES:
            raise TableParseError("energy_source", self.energy_source, f"is not one of {', '.join(ENERGY_SOURCES)}")
        fields.whole(self.schema, "schema", 1, 1 << 16)
        pairs = self.plan_digests.items() if isinstance(self.plan_digests, Mapping) else self.plan_digests
        digests = _digests(pairs)
        object.__setattr__(self, "plan_digests", tuple(sorted(digests.items())))

    @property
    def modes(self) -> tuple[str, ...]:
        """The modes this key has a plan digest for, sorted."""
        return tuple(mode for mode, _ in self.plan_digests)

    def digest(self, mode: str) -> str | None:
        """The plan digest of `mode`, or None if it was not measured."""
        return dict(self.plan_digests).get(mode)

    def check(self, serve_key: "TableKey") -> list["KeyMismatch"]:
        """Every way this (the table's) key differs from the serve's; empty means the table may be used.

        The serve key names the modes the serve will run; each must have been measured here under
        the same plan digest. Modes measured here that the serve does not run are ignored. The
        energy source must be equal both ways: a serve that plans by joules cannot use a table
        measured without them, and a serve on a box without a meter does not plan by joules it
        cannot confirm.
        """
        found: list[KeyMismatch] = []
        if self.schema != serve_key.schema:
            found.append(SchemaMismatch("schema", self.schema, serve_key.schema))
        for attr, variant in (("box_class", BoxClassMismatch), ("recipe", RecipeMismatch),
                              ("energy_source", EnergySourceMismatch)):
            if getattr(self, attr) != getattr(serve_key, attr):
                found.append(variant(attr, getattr(self, attr), getattr(serve_key, attr)))
        for mode, digest in serve_key.plan_digests:
            mine = self.digest(mode)
            if mine is None:
                found.append(ModeNotMeasured(f"plan_digests.{mode}", None, digest))
            elif mine != digest:
                found.append(PlanDigestMismatch(f"plan_digests.{mode}", mine, digest))
        return found

    def to_dict(self) -> dict:
        """The [key] table as tomli-w writes it (schema is written at the top of the file)."""
        return {"box_class": self.box_class, "recipe": self.recipe, "energy_source": self.energy_source,
                "plan_digests": dict(self.plan_digests)}

    @classmethod
    def from_dict(cls, doc: Mapping, schema: int = SCHEMA) -> Self:
        """The key from a parsed [key] table; errors name paths under `key.`."""
        try:
            fields.shape(doc, "", _KEY_FIELDS)
            digests = fields.table(doc, "plan_digests", "")
            return cls(doc["box_class"], doc["recipe"], doc["energy_source"], tuple(digests.items()), schema)
        except TableParseError as exc:
            raise exc.within("key") from None


def _digests(pairs: Iterable) -> dict[str, str]:
    digests: dict[str, str] = {}
    try:
        items = list(pairs)
    except TypeError:
        raise TableParseError("plan_digests", pairs, "is not a table of mode = digest") from None
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 2):
            raise TableParseError("plan_digests", item, "is not a (mode, digest) pair")
        mode, digest = item
        path = f"plan_digests.{fields.name(mode)}"
        fields.text(mode, path)
        if mode in digests:
            raise TableParseError(path, mode, "is given twice")
        digests[mode] = fields.text(digest, path)
    if not digests:
        raise TableParseError("plan_digests", None, "is empty (a table measures at least one mode)", show_value=False)
    return digests


@dataclass(frozen=True, slots=True)
class DrafterKey:
    """The drafter a confidence calibration was fitted on: kind ("mtp", "dflash", ...), name, weights digest."""

    kind: str
    name: str
    digest: str

    def __post_init__(self) -> None:
        for attr in ("kind", "name", "digest"):
            fields.text(getattr(self, attr), attr)

    def __str__(self) -> str:
        return f"{self.kind} '{self.name}' @ {self.digest}"


def shown(value: object) -> str:
    """A key's value as a message quotes it: control characters escaped (\x1b, \t), never dropped by a terminal."""
    text = str(value)
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(c if c.isprintable() and c != "\\" else c.encode("unicode_escape").decode("ascii") for c in text)


@dataclass(frozen=True, slots=True)
class KeyMismatch:
    """One reason a table key does not match the serve's: the field, the table's value and the serve's."""

    field: str
    table_value: object
    serve_value: object
    remedy: ClassVar[str] = "run met bench spec-cost on this box to measure a table under this key"

    def message(self) -> str:
        """What differs and what to do about it, in one line."""
        return (f"table measured under {self.field} '{shown(self.table_value)}', this serve has "
                f"'{shown(self.serve_value)}'; {self.remedy}")


@dataclass(frozen=True, slots=True)
class BoxClassMismatch(KeyMismatch):
    """The table was measured on another class of box."""

    remedy: ClassVar[str] = "run met bench spec-cost here or pass --box-class"

    def message(self) -> str:
        """What differs and what to do about it, in one line."""
        return (f"table measured under box_class '{shown(self.table_value)}', this box is "
                f"'{shown(self.serve_value)}'; {self.remedy}")


@dataclass(frozen=True, slots=True)
class RecipeMismatch(KeyMismatch):
    """The table was measured for another model or other weights."""

    remedy: ClassVar[str] = "run met bench spec-cost for this recipe, or serve the recipe the table was measured for"


@dataclass(frozen=True, slots=True)
class EnergySourceMismatch(KeyMismatch):
    """The table's joules came from another meter (or none) than the serve plans with."""

    def message(self) -> str:
        """What differs and what to do about it, in one line."""
        return (f"table measured under energy_source '{shown(self.table_value)}', this serve plans with "
                f"'{shown(self.serve_value)}'; run met bench spec-cost --energy {shown(self.serve_value)} here, "
                f"or serve with --energy {shown(self.table_value)}")


@dataclass(frozen=True, slots=True)
class PlanDigestMismatch(KeyMismatch):
    """A mode the serve runs was measured under another plan (config, dtype, device, torch, threads ...)."""

    remedy: ClassVar[str] = "something that changes its cost differs; run met bench spec-cost here again"

    def message(self) -> str:
        """What differs and what to do about it, in one line."""
        mode = self.field.removeprefix("plan_digests.")
        return (f"mode '{shown(mode)}' was measured under plan digest '{shown(self.table_value)}', this serve's is "
                f"'{shown(self.serve_value)}'; {self.remedy}")


@dataclass(frozen=True, slots=True)
class ModeNotMeasured(KeyMismatch):
    """The serve runs a mode the table has no measurement for."""

    remedy: ClassVar[str] = "run met bench spec-cost with that mode, or serve without it"

    def message(self) -> str:
        """What differs and what to do about it, in one line."""
        mode = self.field.removeprefix("plan_digests.")
        return f"the serve runs mode '{shown(mode)}' but the table never measured it; {self.remedy}"


@dataclass(frozen=True, slots=True)
class SchemaMismatch(KeyMismatch):
    """The table was written under another schema version than this met reads."""

    remedy: ClassVar[str] = "re-measure with this met's met bench spec-cost"

    def message(self) -> str:
        """What differs and what to do about it, in one line."""
        return (f"table has schema {shown(self.table_value)}, this met reads schema {shown(self.serve_value)}; "
                f"{self.remedy}")


@dataclass(frozen=True, slots=True)
class DrafterMismatch(KeyMismatch):
    """The calibration was fitted on another drafter than the serve drafts with."""

    remedy: ClassVar[str] = "fit a calibration for this drafter with met bench spec-cost"

    def message(self) -> str:
        """What differs and what to do about it, in one line."""
        return (f"calibration fitted on drafter {shown(self.table_value)}, this serve drafts with "
                f"{shown(self.serve_value)}; {self.remedy}")


class KeyMismatchError(SpecCostError):
    """A table or calibration was measured under another key; `mismatches` says how."""

    def __init__(self, mismatches: list[KeyMismatch]) -> None:
        self.mismatches = mismatches
        super().__init__("; ".join(m.message() for m in mismatches))
