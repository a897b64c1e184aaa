"""Training checkpoints: a run's weights, optimiser and random streams saved atomically, and resumed from.

Every trainer (the recipe's, met.train.recipe, the DFlash drafter's, met.train.dflash, and the
draft model's, met.train.draft_model) keeps the same state: the trained module under its own
key ("model", "drafter" or "draft"), the AdamW state, the numpy generator that draws batches,
an optional torch generator (the drafter's anchors), the step, the wall seconds so far and the
last stats. A resumed run draws the same batches and takes the same steps as one that never
stopped.
"""

from collections.abc import Callable
from dataclasses import asdict, is_dataclass
from pathlib import Path

import numpy as np
import torch


class UnusableCheckpoint(Exception):
    """A checkpoint file that cannot be resumed from: unreadable, or saved by another model or trainer."""


RESUMABLE = ("steps", "eval_every", "checkpoint_every")  # options a resumed run may change: its length, its reports


class ChangedParams(ValueError):
    """A checkpoint resumed under other training options: the card would claim options its first steps did not use."""

    def __init__(self, ckpt: Path, changes: dict[str, tuple[object, object]]) -> None:
        super().__init__(f"the checkpoint {ckpt} was trained with {shown(changes)}; resume it with the same options "
                         f"(only {', '.join(RESUMABLE)} may change), or train in another folder to start afresh")
        self.ckpt, self.changes = ckpt, changes


class PastSteps(ValueError):
    """A checkpoint already past the steps a run asks for: resuming it would report fewer steps than it took."""

    def __init__(self, ckpt: Path, step: int, steps: int) -> None:
        super().__init__(f"the checkpoint {ckpt} is already at step {step}, past the {steps} steps asked for; "
                         f"ask for {step} or more to resume it, or train in another folder to start afresh")
        self.ckpt, self.step, self.steps = ckpt, step, steps


def resume(ckpt: Path | None, key: str, module: torch.nn.Module, opt: torch.optim.Optimizer,
           rng: np.random.Generator, gen: torch.Generator | None = None, params: object = None,
           target: str | None = None) -> tuple[int, float, dict]:
    """Load ckpt into module, opt, rng (and gen) when it exists: (step, elapsed seconds, stats); else (0, 0.0, {}).

    Raises UnusableCheckpoint naming the file and why (module, opt and rng may then be partly loaded):
    also for a drafter trained against another `target` (recipe id). Raises ChangedParams when
    `params` (a dataclass) differs from the checkpoint's in a field outside RESUMABLE.
    """
    if ckpt is None or not ckpt.exists():
        return 0, 0.0, {}
    try:
        state = torch.load(ckpt, weights_only=False)
    except Exception as exc:  # torch.load raises many types for a file that is no checkpoint (EOFError when empty)
        raise UnusableCheckpoint(f"{ckpt} is not a readable checkpoint ({type(exc).__name__}: "
                                 f"{_one_line(exc)})") from None
    if not isinstance(state, dict) or key not in state:
        keys = ", ".join(map(str, state)) if isinstance(state, dict) else type(state).__name__
        raise UnusableCheckpoint(f"{ckpt} holds no {key!r} state (found: {keys or 'nothing'})")
    if differ := _changes(state.get("config"), getattr(module, "cfg", None)):
        raise UnusableCheckpoint(f"{ckpt} was saved for another {key}: {shown(dict(list(differ.items())[:4]))}")
    if target is not None and state.get("target", target) != target:  # a checkpoint without one cannot be told
        raise UnusableCheckpoint(f"{ckpt} was trained against {state['target']}, not {target} (the target's "
                                 "weights changed since)")
    if changes := _changes(state.get("params"), params, skip=RESUMABLE):
        raise ChangedParams(ckpt, changes)
    try:
        module.load_state_dict(state[key])
        opt.load_state_dict(state["opt"])
        rng.bit_generator.state = state["rng"]
        if gen is not None:
            gen.set_state(state["gen"])
        step, elapsed = int(state["step"]), float(state["elapsed"])
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise UnusableCheckpoint(f"{ckpt} was saved for another {key} or trainer: {_one_line(exc)}") from None
    return step, elapsed, state.get("stats", {})


def _changes(saved: object, now: object, skip: tuple[str, ...] = ()) -> dict[str, tuple[object, object]]:
    """{field: (checkpoint's, this run's)} of a dataclass's fields that differ from the checkpoint's dict of them.

    Fields in `skip` or not in the checkpoint are left out; {} when either side cannot be told.
    """
    if not isinstance(saved, dict) or not is_dataclass(now):
        return {}
    fields = asdict(now)
    return {k: (saved[k], v) for k, v in fields.items()
            if k not in skip and k in saved and _plain(saved[k]) != _plain(v)}


def shown(changes: dict[str, tuple[object, object]], name: Callable[[str], str] = str) -> str:
    """`batch 2 (this run: 16), lr ...`: each changed field by `name`, the checkpoint's value and this run's."""
    return ", ".join(f"{name(k)} {old} (this run: {new})" for k, (old, new) in changes.items())


def _plain(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value  # a saved tuple may come back a list


def _one_line(exc: BaseException) -> str:
    """The exception's message on one line, at most 300 characters (load_state_dict lists every mismatch)."""
    text = " ".join(str(exc).split()) or repr(exc)
    return text if len(text) <= 300 else text[:297] + "..."


def save(ckpt: Path, key: str, module: torch.nn.Module, opt: torch.optim.Optimizer, rng: np.random.Generator,
         gen: torch.Generator | None, step: int, stats: dict, params: object, config: object,
         target: str | None = None) -> None:
    """Write the run's state to ckpt whole (a temp file beside it, then a rename); params and config are dataclasses.

    target: the recipe id a drafter is trained against, checked when the run resumes.
    """
    state = {key: module.state_dict(), "opt": opt.state_dict(), "rng": rng.bit_generator.state, "step": step,
             "elapsed": stats["wall_s"], "stats": stats, "params": asdict(params), "config": asdict(config)}
    if gen is not None:
        state["gen"] = gen.get_state()
    if target is not None:
        state["target"] = target
    tmp = ckpt.with_suffix(".tmp")
    try:
        torch.save(state, tmp)
    except RuntimeError as exc:  # torch's file writer reports an unwritable path (a folder there, a full disk) so
        reason = str(exc).rpartition("strerror: ")[2] or str(exc)  # "[enforce fail at ...] ... strerror: Is a directory"
        raise OSError(0, reason, str(tmp)) from None
    tmp.replace(ckpt)
