"""Helpers of the `met bench policies` drafter tests: hand-made tables and the command on the micro recipe."""

import torch

import met.bench.policies as pol
from met.engine.identity import MODES, RunSettings, mtp_drafter_key, serve_table_key
from met.speculative.spec_cost import AcceptanceCalibration, Cell, CostTable, PositionPrior, TableKey

BOX = "test-box"
TEXTS = ["def f(x):\n    return x + 1\n", "import os\nprint(os.getcwd())\n", "class A:\n    pass\n",
         "for i in range(3):\n    print(i)\n"]


def table(key: TableKey) -> CostTable:
    """Verify cost grows with width and depth; a draft costs a little per draft."""
    return CostTable(key, [Cell(n, k, 0.01 + 0.001 * n + 0.002 * k * n, 0.001 * k) for n in (1, 4) for k in range(5)])


def calibration(drafter) -> AcceptanceCalibration:
    return AcceptanceCalibration(drafter, 0.6, 800, (), [PositionPrior(i, 0.8 - 0.1 * i, 200) for i in (1, 2, 3, 4)])


def command_env(monkeypatch, folder, recipe) -> tuple[RunSettings, list[str]]:
    """The command on recipe in float64 over TEXTS, its MTP table and calibration in folder (t.toml): the run
    settings a drafter's key is built under, and the command's arguments up to its drafter options."""
    monkeypatch.setattr("met.model.recipes.embedded", lambda name: recipe)  # read when the command runs
    monkeypatch.setattr(pol, "heldout_code", lambda count, offset, size: TEXTS[:count])
    settings = RunSettings("float64", "cpu", torch.get_num_threads())
    mtp = serve_table_key(recipe.id, recipe.config, settings, "none", MODES, BOX)
    (folder / "t.toml").write_text(table(mtp).to_toml())
    (folder / "t.calibration.toml").write_text(calibration(mtp_drafter_key(recipe)).to_toml())
    return settings, ["bench", "policies", "--quick", "--quiet", "--dtype", "float64", "--device", "cpu",
                      "--box-class", BOX, "--energy", "none", "--table", str(folder / "t.toml"), "--out-dir",
                      str(folder / "out")]
