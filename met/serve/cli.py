"""`met serve` and `met top`: the server and its live dashboard."""

import typer


def serve() -> None:
    """Serve an OpenAI-compatible API (arrives with the scheduler)."""
    typer.echo("met serve: not built yet", err=True)
    raise typer.Exit(2)


def top() -> None:
    """Show a running server's live snapshot (arrives with the server)."""
    typer.echo("met top: not built yet", err=True)
    raise typer.Exit(2)
