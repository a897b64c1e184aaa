"""Where tables and calibrations live by default: the names `met bench spec-cost` writes and a measured serve reads.

A table's default name is tables/<box class>/<recipe>[.<drafter>].toml, its calibration's the
same with `.calibration` before `.toml`. Both commands name files through here, so a table written
without --out is the one a serve without a table option boots from. Light on purpose: the command
line imports it before any command runs.
"""

from pathlib import Path

TABLES = "tables"  # the folder of measured tables a serve plans from


def table_path(box: str, recipe: str, drafter: str | None = None) -> Path:
    """tables/<box>/<recipe>.toml, the MTP module's table; with drafter ("dflash", "draft-<draft model>",
    "eagle-<head folder>"), tables/<box>/<recipe>.<drafter>.toml."""
    return Path(TABLES) / box / (f"{recipe}.{drafter}.toml" if drafter else f"{recipe}.toml")


def calibration_path(table: Path) -> Path:
    """Where the calibration of a table goes: `x.toml` -> `x.calibration.toml`."""
    stem = table.name.removesuffix(".toml")
    return table.with_name(f"{stem}.calibration.toml")
