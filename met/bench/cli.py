"""The `met bench` sub-app: measurement commands."""

import typer

from met.bench.policies_cli import policies
from met.bench.spec_cost_cli import spec_cost

bench_app = typer.Typer(help="Measure speculation costs on this box, and what each drafting policy delivers.",
                        no_args_is_help=True, rich_markup_mode=None)
bench_app.command("spec-cost")(spec_cost)
bench_app.command("policies")(policies)
