"""Training checkpoints: a run's weights, optimiser and random streams saved atomically, and resumed from.

Both trainers (the recipe's, met.model.train, and the DFlash drafter's, met.model.dflash_train)
keep the same state: the trained module under its own key ("model" or "drafter"), the AdamW
state, the numpy generator that draws batches, an optional torch generator (the drafter's
anchors), the step, the wall seconds so far and the last stats. A resumed run draws the same
batches and takes the same steps as one that never stopped.
"""

from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch


def resume(ckpt: Path | None, key: str, module: torch.nn.Module, opt: torch.optim.Optimizer,
           rng: np.random.Generator, gen: torch.Generator | None = None) -> tuple[int, float, dict]:
    """Load ckpt into module, opt, rng (and gen) when it exists: (step, elapsed seconds, stats); else (0, 0.0, {})."""
    if ckpt is None or not ckpt.exists():
        return 0, 0.0, {}
    state = torch.load(ckpt, weights_only=False)
    module.load_state_dict(state[key])
    opt.load_state_dict(state["opt"])
    rng.bit_generator.state = state["rng"]
    if gen is not None:
        gen.set_state(state["gen"])
    return state["step"], state["elapsed"], state.get("stats", {})


def save(ckpt: Path, key: str, module: torch.nn.Module, opt: torch.optim.Optimizer, rng: np.random.Generator,
         gen: torch.Generator | None, step: int, stats: dict, params: object, config: object) -> None:
    """Write the run's state to ckpt whole (a temp file beside it, then a rename); params and config are dataclasses."""
    state = {key: module.state_dict(), "opt": opt.state_dict(), "rng": rng.bit_generator.state, "step": step,
             "elapsed": stats["wall_s"], "stats": stats, "params": asdict(params), "config": asdict(config)}
    if gen is not None:
        state["gen"] = gen.get_state()
    tmp = ckpt.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(ckpt)
