"""A training run's output folder: its log opened before any step, and every write into it exiting 73 on failure.

The trainers' commands (cli.py, dflash_cli.py, draft_model_cli.py) write checkpoints, weights and
cards there; a write that fails (a folder where a file goes, a full disk) is one line naming the
file, not a traceback.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from met.exit_codes import EX_CANTCREAT
from met.model.cli import fail


def open_log(out_dir: Path) -> TextIO:
    """Create out_dir and open its train.log for appending, before any training; exit 73 when either fails."""
    why = "it is a file, not a folder" if out_dir.exists() and not out_dir.is_dir() else ""
    if not why:
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            return (out_dir / "train.log").open("a")
        except OSError as e:
            why = e.strerror or str(e)
    raise fail(f"cannot write to --out-dir {out_dir}: {why}; pass a folder you can write", EX_CANTCREAT)


def progress_bar(label: str, console: Console) -> Progress:
    """A training run's bar: steps done of all, the caller's info field, time spent and left; shown on a terminal
    only (a log or a pipe gets the trainer's lines instead)."""
    return Progress(TextColumn(f"[bold]{label}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                    TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                    console=console, disable=not console.is_terminal)


@contextmanager
def writing(out_dir: Path) -> Iterator[None]:
    """Writes into out_dir: an OSError among them (a checkpoint, weights or card path a folder, a full disk) exits 73
    naming the file."""
    try:
        yield
    except OSError as e:
        path = e.filename2 or e.filename or out_dir
        raise fail(f"cannot write {path}: {e.strerror or e}; make room for it in --out-dir {out_dir} or pass "
                   "another --out-dir", EX_CANTCREAT) from None
