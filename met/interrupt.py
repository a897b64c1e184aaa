"""Ctrl-C in met's commands: exit 130 (EX_INTERRUPTED) with one line on stderr, never a traceback.

Two phases. While `met` imports its commands nothing is worth finishing, so SIGINT ends the
process at once (`exit_at_once`). Once a command runs, SIGINT raises KeyboardInterrupt as usual, so
a command can leave its files whole and say so in its own line (`say_interrupted`, as bench
spec-cost does); Typer turns one left unhandled into exit 130, and `run` adds the line then. Python
drops an exception raised in a finalizer, as a KeyboardInterrupt is when the signal lands in one
(torch's imports collect garbage), so a process still running GRACE_S after the signal exits 130 then.
A serve's own handlers (drain, then exit) replace these while it listens.
"""

import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

from met.exit_codes import EX_INTERRUPTED

LINE = "interrupted (Ctrl-C)"
GRACE_S = 5.0  # long enough for a command to leave its files whole and say so
_state = {"signalled": False, "said": False}  # a SIGINT arrived; a command said so in its own line


def _exit_now(signum: int, frame: FrameType | None) -> None:
    os.write(2, f"{LINE}\n".encode())
    os._exit(EX_INTERRUPTED)  # nothing is half-written while met imports: no cleanup to run, no traceback


def exit_at_once() -> Callable | int | None:
    """SIGINT exits 130 at once (while met starts); the handler it replaced, for `restore`."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        return None
    return signal.signal(signal.SIGINT, _exit_now)


def restore(previous: Callable | int | None) -> None:
    """Put back the handler exit_at_once replaced (an import of met.cli changes nothing after it)."""
    if previous is not None and signal.getsignal(signal.SIGINT) is _exit_now:
        signal.signal(signal.SIGINT, previous)


def _raise(signum: int, frame: FrameType | None) -> None:
    if not _state["signalled"]:
        _state["signalled"] = True
        threading.Thread(target=_exit_later, name="met-interrupt", daemon=True).start()
    raise KeyboardInterrupt


def _exit_later() -> None:
    """Exit 130 GRACE_S after the signal if the KeyboardInterrupt was lost (dropped in a finalizer)."""
    time.sleep(GRACE_S)
    if not _state["said"]:
        os.write(2, f"{LINE}\n".encode())
    os._exit(EX_INTERRUPTED)


def say_interrupted(line: str) -> None:
    """A command's own line for its interruption (e.g. that its files are whole); `run` then adds none."""
    from met.say import say

    _state["said"] = True
    say(line, err=True)


def run(app: Callable[[], object]) -> None:
    """Run the command line; a SIGINT the command left unreported ends with LINE (its status: 130)."""
    signal.signal(signal.SIGINT, _raise)
    try:
        app()
    except SystemExit as exc:
        if exc.code == EX_INTERRUPTED and _state["signalled"] and not _state["said"]:
            os.write(2, f"{LINE}\n".encode())
        raise
    except KeyboardInterrupt:  # raised outside the command's own call (Typer reports those inside it)
        if not _state["said"]:
            os.write(2, f"{LINE}\n".encode())
        raise SystemExit(EX_INTERRUPTED) from None
