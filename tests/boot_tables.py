"""A table and calibration under a serve's key, for the tests of the measured planner's boot (bench and serve)."""

import torch

from met.engine.identity import MODES, RunSettings, serve_table_key
from met.speculative.spec_cost import AcceptanceCalibration, Cell, CostTable, DrafterKey, PositionPrior, TableKey

BOX = "test-box"


def settings() -> RunSettings:
    return RunSettings("float32", "cpu", torch.get_num_threads())


def serve_key(recipe) -> TableKey:
    """This serve's key, as `met serve --box-class test-box --energy none` computes it."""
    return serve_table_key(recipe.id, recipe.config, settings(), "none", MODES, BOX)


def table(key: TableKey, meta: dict | None = None, draft_s: float = 0.001) -> CostTable:
    joules = key.energy_source != "none"
    cells = [Cell(n, k, 0.01 + 0.002 * k, draft_s * k, 1.0 + k if joules else None, 0.1 * k if joules else None)
             for n in (1, 4) for k in range(3)]
    return CostTable(key, cells, meta or {})


def calibration(drafter: DrafterKey, lookup: tuple = (), shared_lookup: tuple = ()) -> AcceptanceCalibration:
    return AcceptanceCalibration(drafter, 0.6, 400, (), [PositionPrior(1, 0.7, 200), PositionPrior(2, 0.5, 100)],
                                 lookup=lookup, shared_lookup=shared_lookup)


def with_fields(key: TableKey, **changes) -> TableKey:
    fields = {"box_class": key.box_class, "recipe": key.recipe, "energy_source": key.energy_source,
              "plan_digests": dict(key.plan_digests), "schema": key.schema} | changes
    return TableKey(**fields)
