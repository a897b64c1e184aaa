"""Training a DFlash block drafter (met.train.dflash): its block losses fall and its held-out stats are shares."""

import numpy as np
import pytest
import torch

from met.model.corpus import Split
from met.model.transformer import Transformer
from met.train.dflash import DflashTrainParams, block_losses, train_dflash

from random_models import random_dflash, random_micro


@pytest.fixture(scope="module")
def target() -> Transformer:
    return random_micro()


def test_block_losses_fall_with_a_few_steps(target):
    # distillation on a repetitive corpus: the weighted loss drops and acceptance stats are shares
    rng = np.random.default_rng(0)
    split = Split(np.tile(rng.integers(97, 110, 50), 100).astype(np.uint16), ("x",))
    d = random_dflash(target)
    x = torch.from_numpy(split.tokens[:64].astype(np.int64))[None].repeat(2, 1)
    first, stats = block_losses(d, target, x, 8, 0.8, torch.Generator().manual_seed(0))
    assert len(stats["accept_at"]) == 8 and all(0 <= a <= 1 for a in stats["accept_at"])
    params = DflashTrainParams(steps=30, batch=4, seq_len=64, anchors=8, lr=3e-3, warmup=3, eval_every=30)
    out = train_dflash(d, target, split, split, params, None)
    last, _ = block_losses(d, target, x, 8, 0.8, torch.Generator().manual_seed(0))
    assert last.item() < first.item() and len(out["heldout_accept_at"]) == 8
