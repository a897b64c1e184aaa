"""`met generate`: offline generation through the engine."""

import typer


def generate() -> None:
    """Generate text offline (arrives with the model runner)."""
    typer.echo("met generate: not built yet", err=True)
    raise typer.Exit(2)
