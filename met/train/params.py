"""The schedules of met model train's three trainers, in a module that imports neither torch nor numpy.

`met model train --help` shows their defaults, and met builds every command's options when it starts.
"""

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TrainParams:
    """One training run's schedule."""

    steps: int = 6000
    batch: int = 24
    seq_len: int = 256
    lr: float = 2e-3
    min_lr_ratio: float = 0.1  # cosine decays to lr * this
    warmup: int = 100
    weight_decay: float = 0.1
    mtp_weights: tuple[float, ...] = (1.0, 0.5, 0.25)  # loss weight of MTP depth 1, 2, 3 (recursive)
    eval_every: int = 250
    checkpoint_every: int = 250
    seed: int = 0
    init_from: str = ""  # digest of the weights training started from; "": a fresh initialisation

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch < 1 or self.seq_len < 8:
            raise ValueError(f"steps, batch >= 1 and seq_len >= 8 required, got {self.steps}, {self.batch}, {self.seq_len}")
        if self.lr <= 0 or not 0 < self.min_lr_ratio <= 1:
            raise ValueError(f"lr must be positive and min_lr_ratio in (0, 1], got {self.lr}, {self.min_lr_ratio}")



@dataclass(frozen=True, slots=True)
class DflashTrainParams:
    """One drafter training run's schedule (field names shared with TrainParams, so train.lr_at applies)."""

    steps: int = 1500
    batch: int = 8  # windows per step, each read once by the frozen target
    seq_len: int = 256  # tokens per window
    anchors: int = 32  # blocks cut from each window per step
    lr: float = 1e-3
    min_lr_ratio: float = 0.1  # cosine decays to lr * this
    warmup: int = 50
    weight_decay: float = 0.01
    decay: float = 0.8  # loss weight of block row j is decay**j
    eval_every: int = 100
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch < 1 or self.anchors < 1:
            raise ValueError(f"steps, batch and anchors must be >= 1, got {self.steps}, {self.batch}, {self.anchors}")
        if self.lr <= 0 or not 0 < self.min_lr_ratio <= 1 or not 0 < self.decay <= 1:
            raise ValueError(f"need lr > 0, min_lr_ratio and decay in (0, 1], got {self.lr}, {self.min_lr_ratio}, "
                             f"{self.decay}")


@dataclass(frozen=True, slots=True)
class DraftTrainParams:
    """One draft model distillation run's schedule (field names shared with TrainParams, so train.lr_at applies)."""

    steps: int = 1500
    batch: int = 16  # windows per step, each read once by the frozen target
    seq_len: int = 256  # tokens per window; every position is distilled
    lr: float = 1e-3  # the draft starts as its target's first layers: a fresh model's 2e-3 would undo that start
    min_lr_ratio: float = 0.1  # cosine decays to lr * this
    warmup: int = 50
    weight_decay: float = 0.01  # small: it pulls the copied weights towards 0, away from the target's
    layers: int = 2  # decoder layers the draft keeps: its target's first ones
    ce_weight: float = 0.0  # weight of the next-byte cross-entropy beside the KL (0: the KL alone)
    eval_every: int = 100
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch < 1 or self.seq_len < 8 or self.layers < 1:
            raise ValueError(f"steps, batch, layers >= 1 and seq_len >= 8 required, got {self.steps}, {self.batch}, "
                             f"{self.layers}, {self.seq_len}")
        if self.lr <= 0 or not 0 < self.min_lr_ratio <= 1 or self.ce_weight < 0:
            raise ValueError(f"need lr > 0, min_lr_ratio in (0, 1] and ce_weight >= 0, got {self.lr}, "
                             f"{self.min_lr_ratio}, {self.ce_weight}")
