"""The `met tables` sub-app: check and show cost tables and calibrations."""

import typer

tables_app = typer.Typer(help="Check and show measured cost tables.", no_args_is_help=True)
