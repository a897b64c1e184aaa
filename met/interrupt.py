"""Ctrl-C in met's commands: exit 130 (EX_INTERRUPTED) with one line on stderr, never a traceback.

By default SIGINT ends the process at once with the line (`exit_at_once`): while met starts and
while a command imports torch, a KeyboardInterrupt could land in a finalizer (Python drops it) or in
torch's C++ calling back into Python (which aborts). A command with files to leave whole asks for a
KeyboardInterrupt instead once its imports are done (`raise_on_sigint`, as bench spec-cost does
before it takes the table's lock), and may say so in its own line (`say_interrupted`); Typer turns
one left unhandled into exit 130, and `run` adds the line then. A process still running GRACE_S
after such a signal (the exception was dropped) exits 130 then.
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
_state = {"running": False, "signalled": False, "said": False}  # under run(); a SIGINT arrived; a line said it


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


def raise_on_sigint() -> None:
    """From now on SIGINT raises KeyboardInterrupt, for the command to leave its files whole (under `run` only:
    a test running the command in its own process keeps its handler)."""
    if _state["running"] and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _raise)


def say_interrupted(line: str) -> None:
    """A command's own line for its interruption (e.g. that its files are whole); `run` then adds none."""
    from met.say import say

    _state["said"] = True
    say(line, err=True)


def run(app: Callable[[], object]) -> None:
    """Run the command line; a SIGINT the command left unreported ends with LINE (its status: 130)."""
    _state["running"] = True
    signal.signal(signal.SIGINT, _exit_now)
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
