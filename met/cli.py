"""The `met` command line: wires each subpackage's Typer app together, nothing more.

Each sub-app imports its heavy modules (torch, fastapi, matplotlib) inside its commands, so `met --help`
and the commands that need none of them start at once; Ctrl-C while they start exits 130 (met.interrupt).
"""

from met import interrupt

_started = interrupt.exit_at_once()  # until the commands are wired: Ctrl-C exits 130 at once, in one line

import errno
import os
import sys
from typing import Annotated

import typer

from met import __version__
from met.bench.cli import bench_app
from met.bench.tables_cli import tables_app
from met.engine.cli import generate
from met.train.cli import train_cmd
from met.exit_codes import EX_IOERR
from met.model.cli import info_cmd, model_app
from met.say import say
from met.serve.cli import serve, top

app = typer.Typer(
    name="met",
    help="LLM inference whose speculative decoding is planned from measurement.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # click's plain help: paragraphs rewrapped to the terminal, as rich mode does not
)
model_app.command("train")(train_cmd)  # met.train.cli: its card's acceptance is decoded by the engine
model_app.command("info")(info_cmd)
app.add_typer(bench_app, name="bench")
app.add_typer(tables_app, name="tables")
app.add_typer(model_app, name="model")
app.command("generate")(generate)
app.command("serve")(serve)
app.command("top")(top)
interrupt.restore(_started)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"met {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """met: measure what speculation costs on this box, then serve with planned draft depth."""


def main() -> None:
    """Console-script entry point."""
    try:
        interrupt.run(app)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EIO, errno.EPIPE):
            raise
        # stdout on a full disk (`> /dev/full`, a cron log) or gone: say so in one line, not a traceback.
        # The commands' own files are written and reported on their own (bench spec-cost: 73, untouched).
        say(f"error: cannot write the output: {exc.strerror}", err=True)
        for stream in (sys.stdout, sys.stderr):  # nothing more to flush at exit, where it would fail again
            if stream is not None:
                os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
        sys.exit(EX_IOERR)

