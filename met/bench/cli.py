"""The `met bench` sub-app: measurement commands."""

import typer

bench_app = typer.Typer(help="Measure speculation costs on this box.", no_args_is_help=True)
