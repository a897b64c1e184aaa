"""say: write one line of a command's output; a stream that cannot take it does not change the exit status."""

import typer


def say(line: str, err: bool = False) -> None:
    """Write line to stdout (stderr if err); dropped when the stream is full, closed, its reader gone, or absent.

    The exit status says what the command did: a cron log on a full disk must not turn a written
    table into a traceback and exit 1, nor a held lock's 75, nor `met`'s own 74 for unwritable output.
    """
    try:
        typer.echo(line, err=err)  # click itself drops a line for a stream that is None (started closed)
    except (OSError, ValueError, AttributeError):  # full or gone; closed; something that is no stream
        pass
