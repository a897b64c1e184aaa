"""The errors spec_cost raises: the base of every refusal, and a field that is not valid.

A key that does not match is refused with keys.KeyMismatchError, beside the mismatches it lists.
"""

from __future__ import annotations

import datetime as dt
import math

_MAX_SHOWN = 40  # characters of a value quoted in a message; the rest is elided


class SpecCostError(ValueError):
    """Base of every refusal spec_cost makes (a ValueError, so generic handlers still catch it)."""


class TableParseError(SpecCostError):
    """A table or calibration field is invalid: raised by parse and by the dataclasses' own checks.

    `path` names the field as a user finds it in the file (`cells[3].verify_s`), `value` is what
    was there, `reason` what is wrong with it; str() is the one-line message
    `cells[3].verify_s: -0.2 is not a finite positive cost`.
    """

    def __init__(self, path: str, value: object, reason: str, *, show_value: bool = True) -> None:
        self.path, self.value, self.reason, self.show_value = path, value, reason, show_value
        detail = f"{show(value)} {reason}" if show_value else reason
        super().__init__(f"{path}: {detail}" if path else detail)

    def within(self, prefix: str) -> TableParseError:
        """The same error with its path placed under `prefix` (`key` + `box_class` -> `key.box_class`)."""
        if not self.path:
            path = prefix
        elif self.path.startswith("["):
            path = f"{prefix}{self.path}"
        else:
            path = f"{prefix}.{self.path}"
        return TableParseError(path, self.value, self.reason, show_value=self.show_value)


def show(value: object) -> str:
    """A value as a one-line message quotes it: TOML spelling for booleans and dates, short, never multi-line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, int) and value.bit_length() > 128:
        return f"an integer of {value.bit_length()} bits"
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()  # as the file spells it, not datetime.time(2, 11, 6)
    try:
        text = repr(value)
    except Exception:  # a repr that fails must not turn a parse error into another exception
        text = f"a {type(value).__name__}"
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."
