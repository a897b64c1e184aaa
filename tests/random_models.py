"""Random micro models for the tests: weights far from their init (std 0.3), so that layouts and paths tell apart."""

import torch

from met.model.config import ModelConfig
from met.model.dflash import DflashConfig, DflashDrafter
from met.model.transformer import Transformer


def random_micro(seed: int = 0) -> Transformer:
    """The micro preset with normal(0, 0.3) weights, float32, in eval mode."""
    torch.manual_seed(seed)
    m = Transformer(ModelConfig.from_name("micro"))
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return m.eval()


def micro_model(seed: int = 0) -> Transformer:
    """random_micro in float64, so batch shape and rounding cannot flip a greedy token."""
    return random_micro(seed).double()


def random_dflash(target: Transformer, block: int = 8) -> DflashDrafter:
    """A DFlash block drafter for target with seeded random weights (ffn 64: small and quick)."""
    torch.manual_seed(1)
    return DflashDrafter(DflashConfig.for_target(target.cfg, block=block, ffn_dim=64))

