"""The DFlash block drafter: block shapes, bidirectional rows, and files keyed to their target."""

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from met.exit_codes import EX_DATAERR, EX_NOINPUT
from met.model.dflash import DflashConfig, DrafterError, load_drafter, save_drafter
from met.model.transformer import Transformer

from random_models import random_dflash, random_micro


@pytest.fixture(scope="module")
def target() -> Transformer:
    return random_micro()


def test_one_pass_gives_a_block_of_logits(target):
    # 3 sequences -> [3, block, vocab]; the target's embeddings and head are used, not copied
    d = random_dflash(target)
    out = d(target, torch.randn(3, target.cfg.dim), torch.tensor([1, 2, 3]))
    assert out.shape == (3, 8, target.cfg.vocab_size)
    assert not any(n.startswith(("embed", "lm_head")) for n, _ in d.named_parameters())


def test_rows_see_each_other_both_ways(target):
    # bidirectional inside the block: nudging a late MASK position's embedding moves the first row's logits
    d = random_dflash(target)
    h, t = torch.randn(1, target.cfg.dim), torch.tensor([5])
    before = d(target, h, t)
    with torch.no_grad():
        d.pos[-1] += 1.0
    assert not torch.allclose(d(target, h, t)[:, 0], before[:, 0])


def test_saved_drafter_loads_only_for_its_target(target, tmp_path):
    # the file carries its config and target id; another target's id is refused by name
    d = random_dflash(target)
    path = tmp_path / "d.safetensors"
    digest = save_drafter(d, path, "micro@abc")
    again = load_drafter(path, "micro@abc")
    assert len(digest) == 16 and again.cfg == d.cfg
    x = (target, torch.randn(2, target.cfg.dim), torch.tensor([3, 4]))
    assert torch.equal(again(*x), d.eval()(*x))
    with pytest.raises(DrafterError, match="trained against micro@abc, not micro@other") as exc:
        load_drafter(path, "micro@other")
    assert exc.value.status == EX_DATAERR


def test_a_missing_or_damaged_drafter_says_which_with_its_status(target, tmp_path):
    # none: 66 and how to train one; bytes that are not safetensors, or a config that does not fit: 65
    with pytest.raises(DrafterError, match="train one with: met model train --drafter dflash --target micro") as exc:
        load_drafter(tmp_path / "none.safetensors", "micro@abc")
    assert exc.value.status == EX_NOINPUT
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x00" * 64)
    with pytest.raises(DrafterError, match="cannot be read as a safetensors file") as exc:
        load_drafter(bad, "micro@abc")
    assert exc.value.status == EX_DATAERR
    path = tmp_path / "d.safetensors"
    save_drafter(random_dflash(target), path, "micro@abc")
    with safe_open(str(path), framework="pt") as f:
        meta, state = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    meta["dflash_config"] = meta["dflash_config"].replace('"block": 16', '"block": 8').replace('"dim": ', '"dim": 1')
    save_file(state, str(path), metadata=meta)
    with pytest.raises(DrafterError, match="holds a damaged DFlash drafter") as exc:
        load_drafter(path, "micro@abc")
    assert exc.value.status == EX_DATAERR


def test_config_refuses_blocks_past_16():
    # the DFlash rung never asks for more than 16
    with pytest.raises(ValueError, match="block must be in 1..=16"):
        DflashConfig(dim=32, vocab_size=258, block=17)
