"""The `met model` sub-app: train the embedded recipe and describe it."""

import typer

model_app = typer.Typer(help="Train and inspect the embedded model recipe.", no_args_is_help=True)
