"""The measured planner's boot: load a table and its calibration, compare keys, refuse any mismatch.

`met serve --spec-cost-model measured` and `met bench policies` boot through it, so both refuse
the same files with the same statuses. It sits in met.bench beside the table files it reads
(met.serve may import met.bench; met.bench never imports met.serve). The TableKey comes from
met.engine.identity.serve_table_key, the same function `met bench spec-cost` writes tables with,
so a table measured here under the same settings matches exactly. Exit statuses: 65 (EX_DATAERR)
a table or calibration that is missing or does not parse; 78 (EX_CONFIG) measured under another
key (every mismatch is listed: field, the table's value, this serve's value, what to do); 69
(EX_UNAVAILABLE) an --energy source that does not work here. Nothing is approximated: a table is
used under its own key or not at all.
"""

from dataclasses import dataclass
from pathlib import Path

from met.bench.meters import EnergyUnavailable, open_meter
from met.bench.table_files import Unwritable, resolve_out
from met.bench.table_names import calibration_path, table_path
from met.bench.tables_cli import Refusal, read_text
from met.engine.identity import (MODES, EagleHead, OwnDrafter, RunSettings, box_class, mtp_drafter_key, own_drafter,
                                 serve_table_key)
from met.exit_codes import EX_CONFIG, EX_DATAERR, EX_UNAVAILABLE
from met.model.recipes import Recipe
from met.speculative.spec_cost import (
    AcceptanceCalibration,
    CostTable,
    DrafterKey,
    KeyMismatch,
    KeyMismatchError,
    SpecCostState,
    TableKey,
    TableParseError,
)
from met.speculative.spec_cost.keys import shown


class BootError(Exception):
    """The serve cannot start: the exit status and the lines to print."""

    def __init__(self, code: int, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.code, self.lines = code, lines


@dataclass(frozen=True, slots=True)
class MeasuredBoot:
    """Where --spec-cost-model measured reads from and what it plans with."""

    table: Path
    calibration: Path
    slack: float
    energy: str = "auto"  # the serve's energy source: auto | nvml | rapl | none (as `met bench spec-cost --energy`)
    box_class: str | None = None  # --box-class override
    table_option: str = "--spec-cost-table"  # the command's option for the table, named in a refusal's remedy


def default_table(box: str, recipe_name: str, draft_name: str | None = None, eagle_name: str | None = None) -> Path:
    """Where `met bench spec-cost` writes a table by default (table_names.table_path): tables/<box_class>/<recipe>.toml;
    with a draft model, <recipe>.draft-<draft model>.toml; with an EAGLE-3 head, <recipe>.eagle-<head folder>.toml."""
    if draft_name is not None and eagle_name is not None:
        raise ValueError("a table prices one drafter: a draft model's or an EAGLE-3 head's, not both")
    return table_path(box, recipe_name, f"draft-{draft_name}" if draft_name is not None
                      else f"eagle-{eagle_name}" if eagle_name else None)


def default_calibration(table: Path) -> Path:
    """The calibration beside a table (a symlinked table's target), where the bench writes it: `x.toml` ->
    `x.calibration.toml`."""
    try:
        return calibration_path(resolve_out(table))
    except Unwritable:  # a dangling link: the table's own refusal says so
        return calibration_path(table)


def load_table(path: Path, option: str = "--spec-cost-table") -> CostTable:
    """The cost table at path; BootError 65 if it is missing or invalid (the remedy names `option`)."""
    return _parse(path, CostTable, "cost table", f"run met bench spec-cost on this box to write it, or pass "
                  f"{option} PATH")


def load_calibration(path: Path) -> AcceptanceCalibration:
    """The calibration at path; BootError 65 if it is missing or invalid."""
    return _parse(path, AcceptanceCalibration, "calibration", "run met bench spec-cost --calibrate on this box "
                  "to write it, or pass --calibration PATH")


def _parse(path: Path, kind: type, what: str, remedy: str):
    try:
        text = read_text(path)
    except Refusal as exc:
        raise BootError(EX_DATAERR, [f"error: the {what} {exc}; {remedy}"]) from None
    try:
        return kind.parse(text)
    except TableParseError as exc:
        raise BootError(EX_DATAERR, [f"error: the {what} {path} is invalid: {exc}; {remedy}"]) from None


def check(table: CostTable, calibration: AcceptanceCalibration, serve_key: TableKey, serve_drafter: DrafterKey,
          slack: float, table_path: Path | None = None) -> SpecCostState:
    """The planner's state if both keys match; BootError 78 listing every mismatch otherwise."""
    try:
        return SpecCostState(table, calibration, slack, serve_key, serve_drafter)
    except KeyMismatchError as exc:
        raise BootError(EX_CONFIG, mismatch_lines(exc.mismatches, table_path)) from None


def mismatch_lines(mismatches: list[KeyMismatch], table_path: Path | None = None) -> list[str]:
    """The refusal: a header, then per mismatch its field, both values and what to do."""
    where = f" {table_path}" if table_path is not None else ""
    lines = [f"error: the cost table{where} or its calibration was measured under another key than this serve's "
             f"({len(mismatches)} mismatch{'es' if len(mismatches) != 1 else ''}); refusing to plan from it:"]
    for m in mismatches:
        lines.append(f"  {m.field}: table has {_shown(m.table_value)}, this serve has {_shown(m.serve_value)}: "
                     f"{m.message()}")
    return lines


def _shown(value: object) -> str:
    return "(not measured)" if value is None else f"'{shown(value)}'"  # control characters escaped, not dropped


def energy_source(energy: str, device: str) -> str:
    """The energy source this serve plans with, as the bench would record it here; BootError 69 if unavailable."""
    try:
        return open_meter(energy, device).source
    except EnergyUnavailable as exc:
        raise BootError(EX_UNAVAILABLE, [f"error: --energy {energy}: {exc}"]) from None


def boot_measured(recipe: Recipe, settings: RunSettings, boot: MeasuredBoot,
                  draft: Recipe | EagleHead | OwnDrafter | None = None) -> SpecCostState:
    """Load, parse and key-check the table and calibration for this recipe and these run settings.

    draft: the draft model or EAGLE-3 head the serve drafts with instead of the recipe's MTP module;
    the table must have measured its draft step (mode draft_model under the draft model's recipe and
    config, draft_eagle under the head's digest and config) and the calibration must have been
    fitted on it.
    """
    source = energy_source(boot.energy, settings.device)
    if draft is None:
        serve_key = serve_table_key(recipe.id, recipe.config, settings, source, MODES, boot.box_class)
        drafter = mtp_drafter_key(recipe)
    else:
        own = own_drafter(draft)
        serve_key = serve_table_key(recipe.id, recipe.config, settings, source, own.modes, boot.box_class, own.config)
        drafter = own.key
    table = load_table(boot.table, boot.table_option)
    calibration = load_calibration(boot.calibration)
    return check(table, calibration, serve_key, drafter, boot.slack, boot.table)


def boot_default(recipe: Recipe, settings: RunSettings, draft: Recipe | None = None,
                 slack: float = 0.1) -> tuple[Path, SpecCostState]:
    """The table at this box's default path for the recipe (and draft model), booted with its calibration as a
    serve given no table option boots it, without an energy source: (the table's path, its state). BootError as
    boot_measured."""
    table = default_table(box_class(settings.device, None), recipe.name, draft.name if draft is not None else None)
    return table, boot_measured(recipe, settings, MeasuredBoot(table, default_calibration(table), slack, "none"),
                                draft=draft)
