"""Progress of a long measurement: a rich bar on a terminal, plain lines in a log, nothing when quiet."""

import sys
import time
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

PLAIN_EVERY_S = 5.0  # a plain log gets a line at most this often within one phase (and at its end)


class Reporter:
    """Reports phases and their steps to stderr; `quiet` silences it, a non-terminal gets plain lines.

    Progress is news, not the product: a stream that is closed, full or gone (`2>&-`, a log on a
    full disk, a reader that quit) stops the news and never the run.
    """

    def __init__(self, quiet: bool = False, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.rich = not quiet and self.stream is not None and self.stream.isatty()
        self._bar: Progress | None = None
        self._task = None
        self._phase = ""
        self._last = 0.0
        self._lost = self.stream is None  # sys.stderr is None when the process started with it closed

    def __enter__(self) -> "Reporter":
        if self.rich:
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=Console(file=self.stream), transient=False)
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def say(self, message: str) -> None:
        """One line of news (the phase that starts, the meter chosen)."""
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.console.print(message, highlight=False, markup=False)
        else:
            self._print(message)

    def step(self, phase: str, done: int, total: int, label: str = "") -> None:
        """`done` of `total` steps of `phase` are finished; `label` names the last one."""
        if self.quiet:
            return
        if self._bar is not None:
            if phase != self._phase:
                self._task = self._bar.add_task(phase, total=total)
                self._phase = phase
            self._bar.update(self._task, completed=done, description=f"{phase} {label}".strip())
            return
        now = time.monotonic()
        if phase != self._phase or done == total or now - self._last >= PLAIN_EVERY_S:
            self._phase, self._last = phase, now
            self._print(f"{phase}: {done}/{total} {label}".rstrip())

    def _print(self, line: str) -> None:
        if self._lost:
            return
        try:
            print(line, file=self.stream, flush=True)
        except OSError:
            self._lost = True
