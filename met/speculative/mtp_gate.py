"""The MTP runtime gate: per step, MTP verify or plain decode, by delivered throughput measured per mode.

Delivered throughput is emitted tokens per second of step wall time, measured over windows of
WINDOW_STEPS steps of one mode. The gate runs the better mode (exploit) and, every
`probe_every` exploit windows, one window of the other (a probe). It switches only when the
other mode's latest window beats the exploited one by more than `margin`, so two modes within
the margin of each other never flap. An exploit window that falls below the other mode's last
measured rate by the margin brings the next probe forward instead of switching on stale data.
The caller reads the clock and passes each step's seconds in.
"""

import math
from dataclasses import dataclass, field
from enum import StrEnum

WINDOW_STEPS = 32  # steps per measurement window: averages per-step noise down to about 1%


class Mode(StrEnum):
    """A decode mode the gate chooses between."""

    MTP = "mtp"  # draft with the MTP heads, verify drafts + bonus in one forward
    PLAIN = "plain"  # one token per forward, no drafts

    @property
    def other(self) -> "Mode":
        """The mode this one is compared against."""
        return Mode.PLAIN if self is Mode.MTP else Mode.MTP


@dataclass(frozen=True, slots=True)
class GateParams:
    """The gate's window length, switching margin and probe period."""

    window_steps: int = WINDOW_STEPS
    margin: float = 0.10  # the other mode must deliver > (1 + margin) x the exploited mode's rate
    probe_every: int = 16  # exploit windows between probes: a probe costs at most 1/17 of the steps
    start: Mode = Mode.MTP  # exploited first; the other is probed right after its first window

    def __post_init__(self) -> None:
        if self.window_steps < 1:
            raise ValueError(f"window_steps must be >= 1, got {self.window_steps}")
        if not (math.isfinite(self.margin) and self.margin >= 0.0):
            raise ValueError(f"margin must be finite and >= 0, got {self.margin}")
        if self.probe_every < 1:
            raise ValueError(f"probe_every must be >= 1 window, got {self.probe_every}")


@dataclass(slots=True)
class _Window:
    steps: int = 0
    tokens: int = 0
    seconds: float = 0.0


@dataclass(slots=True)
class MtpGate:
    """Chooses the mode of each step; the scheduler calls mode() before a step and observe() after it."""

    params: GateParams = field(default_factory=GateParams)
    exploit: Mode = field(init=False)  # the mode currently judged better
    window_mode: Mode = field(init=False)  # mode of the window being measured (exploit, or a probe)
    rates: dict[Mode, float] = field(init=False, default_factory=dict)  # latest full window's tokens/s
    exploit_windows: int = field(init=False, default=0)  # exploit windows since the last probe
    _window: _Window = field(init=False, repr=False, default_factory=_Window)

    def __post_init__(self) -> None:
        self.exploit = self.window_mode = self.params.start

    def mode(self) -> Mode:
        """The mode the next step should run in."""
        return self.window_mode

    def observe(self, mode: Mode, emitted_tokens: int, step_seconds: float) -> None:
        """Fold in one step the caller ran in `mode`; a step of another mode than the window's is not counted."""
        if emitted_tokens < 0:
            raise ValueError(f"emitted_tokens must be >= 0, got {emitted_tokens}")
        if not (math.isfinite(step_seconds) and step_seconds > 0.0):
            raise ValueError(f"step_seconds must be finite and > 0, got {step_seconds}")
        if mode is not self.window_mode:
            return  # e.g. no drafter output that step: it measured neither window
        w = self._window
        w.steps += 1
        w.tokens += emitted_tokens
        w.seconds += step_seconds
        if w.steps >= self.params.window_steps:
            self.rates[mode] = w.tokens / w.seconds
            self._window = _Window()
            self._close_window(mode)

    def _beats(self, a: Mode, b: Mode) -> bool:
        return self.rates[a] > self.rates[b] * (1.0 + self.params.margin)

    def _close_window(self, mode: Mode) -> None:
        other = self.exploit.other
        if mode is not self.exploit:  # a probe window ended: switch only past the margin
            if self._beats(other, self.exploit):
                self.exploit = other
            self.exploit_windows = 0
            self.window_mode = self.exploit
            return
        self.exploit_windows += 1
        probe = (
            other not in self.rates
            or self.exploit_windows >= self.params.probe_every
            or self._beats(other, self.exploit)
        )
        self.window_mode = other if probe else self.exploit
