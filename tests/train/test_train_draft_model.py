"""Distilling a draft model (met.train.draft_model): it starts as its target's first layers; training lowers its KL."""

import numpy as np
import pytest
import torch

from met.model.config import ModelConfig
from met.model.corpus import Split
from met.model.transformer import Transformer
from met.train import checkpoint
from met.train.draft_model import distill_losses, draft_config, train_draft, truncated
from met.train.params import DraftTrainParams

SPLIT = Split(np.tile(np.random.default_rng(0).integers(97, 110, 50), 60).astype(np.uint16), ("x",))
PARAMS = DraftTrainParams(steps=6, batch=2, seq_len=32, warmup=2, eval_every=3)


class Stop(Exception):
    """The run killed after a step (its checkpoint written first)."""


@pytest.fixture(scope="module")
def target() -> Transformer:
    """The micro preset with 4 layers and normal(0, 0.3) weights: deeper than its 2-layer draft."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_name("micro").with_(n_layers=4))
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return model.eval()


def windows(count: int = 2, length: int = 33) -> torch.Tensor:
    return torch.from_numpy(SPLIT.tokens[:length].astype(np.int64))[None].repeat(count, 1)


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_the_draft_starts_as_the_truncated_target(target):
    # its logits are the target's first 2 layers, then the target's final norm and head; its tensors are copies
    draft = truncated(target, 2)
    assert (draft.cfg.n_layers, draft.cfg.mtp_depth, draft.cfg.dim) == (2, 0, target.cfg.dim)
    own = target.state_dict()
    assert all(torch.equal(v, own[k]) for k, v in draft.state_dict().items())
    x = windows()[:, :32]
    with torch.no_grad():
        h = target.model.embed_tokens(x)
        cos, sin = target._rope(target._positions(x, None))
        for layer in target.model.layers[:2]:
            h, _ = layer(h, cos, sin)
        assert torch.allclose(draft(x), target.logits(h), atol=1e-6)
        assert not torch.allclose(draft(x), target(x), atol=1e-2)  # the comparison can fail: 4 layers differ
        draft.lm_head.weight.add_(1.0)
    assert torch.equal(target.lm_head.weight, own["lm_head.weight"]) and not target.lm_head.weight.equal(
        draft.lm_head.weight)


def test_a_draft_no_smaller_than_its_target_is_refused():
    # 2 layers of the 2-layer micro preset would be the target itself
    with pytest.raises(ValueError, match="a draft of 2 layers is no smaller than its target of 2; keep 1..1"):
        draft_config(ModelConfig.from_name("micro"), 2)


def test_a_few_steps_lower_the_kl(target):
    # distillation on a repetitive corpus: the KL to the target falls, agreement is a share
    draft = truncated(target, 2)
    first, before = distill_losses(draft, target, windows())
    assert 0 <= before["agree"] <= 1 and first.item() == pytest.approx(before["kl"])
    stats = train_draft(draft, target, SPLIT, SPLIT, DraftTrainParams(steps=30, batch=4, seq_len=32, lr=3e-3,
                                                                     warmup=3, eval_every=30), None)
    _, after = distill_losses(draft, target, windows())
    assert after["kl"] < 0.7 * before["kl"] and 0 <= stats["heldout_agree"] <= 1 and stats["step"] == 30


def test_the_cross_entropy_term_adds_to_the_loss(target):
    # ce_weight 0.5: loss = kl + 0.5 * ce
    loss, parts = distill_losses(truncated(target, 2), target, windows(), ce_weight=0.5)
    assert loss.item() == pytest.approx(parts["kl"] + 0.5 * parts["ce"], rel=1e-5)


def test_the_trainer_resumes_where_it_stopped(target, tmp_path):
    def run(ckpt, stop_at=None):
        def on_step(step, stats):
            if step == stop_at:
                raise Stop

        draft = truncated(target, 2)
        return draft, train_draft(draft, target, SPLIT, SPLIT, PARAMS, ckpt, on_step, "micro4@aaaa")

    straight, _ = run(None)
    with pytest.raises(Stop):
        run(tmp_path / "draft.pt", stop_at=4)  # killed after step 4; the last checkpoint is step 3's
    assert torch.load(tmp_path / "draft.pt", weights_only=False)["step"] == 3
    resumed, stats = run(tmp_path / "draft.pt")  # a fresh draft: everything past its start comes from the file
    assert stats["step"] == 6 and same_weights(resumed, straight)
    assert not same_weights(truncated(target, 2), straight)  # the comparison can fail


def test_a_checkpoint_of_other_target_weights_or_options_is_refused(target, tmp_path):
    # the target's id is kept in the checkpoint; so are the options (ce_weight here), as for the other trainers
    ckpt = tmp_path / "draft.pt"
    train_draft(truncated(target, 2), target, SPLIT, SPLIT, PARAMS, ckpt, target_id="micro4@aaaa")
    with pytest.raises(checkpoint.UnusableCheckpoint, match=r"draft\.pt was trained against micro4@aaaa, not micro4@b"):
        train_draft(truncated(target, 2), target, SPLIT, SPLIT, PARAMS, ckpt, target_id="micro4@bbbb")
    other = DraftTrainParams(steps=6, batch=2, seq_len=32, warmup=2, eval_every=3, ce_weight=0.1)
    with pytest.raises(checkpoint.ChangedParams, match=r"ce_weight 0.0 \(this run: 0.1\)"):
        train_draft(truncated(target, 2), target, SPLIT, SPLIT, other, ckpt, target_id="micro4@aaaa")
    with pytest.raises(checkpoint.PastSteps, match="already at step 6, past the 5 steps"):
        train_draft(truncated(target, 2), target, SPLIT, SPLIT, DraftTrainParams(steps=5, batch=2, seq_len=32,
                                                                                 warmup=2, eval_every=3),
                    ckpt, target_id="micro4@aaaa")
