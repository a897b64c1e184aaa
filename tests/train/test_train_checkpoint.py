"""Training checkpoints (met.train.checkpoint): a run stopped and resumed ends where one that never stopped does."""

import numpy as np
import pytest
import torch

from met.model.corpus import Split
from met.model.dflash import DflashConfig, DflashDrafter
from met.train.dflash import DflashTrainParams, train_dflash
from met.train.recipe import TrainParams, train

from random_models import random_micro

SPLIT = Split(np.tile(np.random.default_rng(0).integers(97, 110, 50), 60).astype(np.uint16), ("x",))


class Stop(Exception):
    """The run killed after a step (its checkpoint written first)."""


def stop_after(step: int):
    def on_step(done: int, stats: dict) -> None:
        if done == step:
            raise Stop

    return on_step


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_the_recipe_trainer_resumes_where_it_stopped(tmp_path):
    def run(ckpt, on_step=lambda step, stats: None):
        model = random_micro()
        params = TrainParams(steps=6, batch=2, seq_len=16, warmup=2, eval_every=100, checkpoint_every=3)
        return model, train(model, SPLIT, SPLIT, params, ckpt, on_step)

    straight, _ = run(None)
    with pytest.raises(Stop):
        run(tmp_path / "run.pt", stop_after(4))  # killed after step 4; the last checkpoint is step 3's
    resumed, stats = run(tmp_path / "run.pt")  # a fresh model: everything it knows comes from the file
    assert stats["step"] == 6 and same_weights(resumed, straight)
    assert not same_weights(random_micro(), straight)  # the comparison can fail


def test_the_dflash_trainer_resumes_where_it_stopped(tmp_path):
    target = random_micro()

    def run(ckpt, on_step=lambda step, stats: None):
        torch.manual_seed(1)
        drafter = DflashDrafter(DflashConfig.for_target(target.cfg, block=4, ffn_dim=32))
        params = DflashTrainParams(steps=6, batch=2, seq_len=32, anchors=4, warmup=2, eval_every=3)
        return drafter, train_dflash(drafter, target, SPLIT, SPLIT, params, ckpt, on_step)

    straight, _ = run(None)
    with pytest.raises(Stop):
        run(tmp_path / "drafter.pt", stop_after(4))
    resumed, stats = run(tmp_path / "drafter.pt")
    assert stats["step"] == 6 and same_weights(resumed, straight)
    torch.manual_seed(1)
    assert not same_weights(DflashDrafter(DflashConfig.for_target(target.cfg, block=4, ffn_dim=32)), straight)


def test_a_missing_checkpoint_starts_from_step_zero(tmp_path):
    from met.train import checkpoint

    model = random_micro()
    opt = torch.optim.AdamW(model.parameters())
    assert checkpoint.resume(tmp_path / "none.pt", "model", model, opt, np.random.default_rng(0)) == (0, 0.0, {})
    assert checkpoint.resume(None, "model", model, opt, np.random.default_rng(0)) == (0, 0.0, {})


@pytest.mark.parametrize("key", ["model", "drafter"])
def test_the_checkpoint_is_replaced_whole(tmp_path, key):
    model = random_micro()
    opt = torch.optim.AdamW(model.parameters())
    from met.train import checkpoint

    ckpt = tmp_path / "c.pt"
    checkpoint.save(ckpt, key, model, opt, np.random.default_rng(0), None, 3, {"wall_s": 1.5},
                     TrainParams(), model.cfg)
    assert not ckpt.with_suffix(".tmp").exists()
    state = torch.load(ckpt, weights_only=False)
    assert state["step"] == 3 and state["elapsed"] == 1.5 and key in state and "gen" not in state


def test_a_drafters_checkpoint_is_not_resumed_as_a_model(tmp_path):
    # the key names whose state the file holds; nothing is loaded from it
    from met.train import checkpoint

    model = random_micro()
    opt = torch.optim.AdamW(model.parameters())
    ckpt = tmp_path / "c.pt"
    checkpoint.save(ckpt, "drafter", model, opt, np.random.default_rng(0), None, 3, {"wall_s": 1.0},
                     TrainParams(), model.cfg)
    with pytest.raises(checkpoint.UnusableCheckpoint, match=r"c\.pt holds no 'model' state \(found: drafter, "):
        checkpoint.resume(ckpt, "model", model, opt, np.random.default_rng(0))


def test_a_run_asking_fewer_steps_than_its_checkpoint_is_refused(tmp_path):
    # a checkpoint at step 6 and steps=4: PastSteps names both (the card would have claimed 4)
    from met.train import checkpoint

    params = TrainParams(steps=6, batch=2, seq_len=16, warmup=2, eval_every=100, checkpoint_every=3)
    train(random_micro(), SPLIT, SPLIT, params, tmp_path / "run.pt")
    with pytest.raises(checkpoint.PastSteps, match="already at step 6, past the 4 steps asked for"):
        train(random_micro(), SPLIT, SPLIT, TrainParams(steps=4, batch=2, seq_len=16, warmup=2), tmp_path / "run.pt")


def test_a_run_resumed_with_other_options_is_refused(tmp_path):
    # a checkpoint of batch 2 resumed with batch 3: ChangedParams names it; more steps and evals may change
    from met.train import checkpoint

    params = TrainParams(steps=3, batch=2, seq_len=16, warmup=2, eval_every=100, checkpoint_every=3)
    train(random_micro(), SPLIT, SPLIT, params, tmp_path / "run.pt")
    with pytest.raises(checkpoint.ChangedParams, match=r"trained with batch 2 \(this run: 3\); resume it with"):
        train(random_micro(), SPLIT, SPLIT, TrainParams(steps=4, batch=3, seq_len=16, warmup=2), tmp_path / "run.pt")
    stats = train(random_micro(), SPLIT, SPLIT, TrainParams(steps=5, batch=2, seq_len=16, warmup=2, eval_every=2,
                                                             checkpoint_every=2), tmp_path / "run.pt")
    assert stats["step"] == 5


def test_a_drafter_is_not_resumed_against_another_targets_weights(tmp_path):
    # the target recipe's id is kept in the checkpoint: a retrained target (new digest) is refused, the same resumes
    from met.train import checkpoint

    target = random_micro()

    def run(steps, target_id):
        torch.manual_seed(1)
        drafter = DflashDrafter(DflashConfig.for_target(target.cfg, block=4, ffn_dim=32))
        params = DflashTrainParams(steps=steps, batch=2, seq_len=32, anchors=4, warmup=2, eval_every=2)
        return train_dflash(drafter, target, SPLIT, SPLIT, params, tmp_path / "d.pt", target_id=target_id)

    run(2, "micro@aaaa")
    with pytest.raises(checkpoint.UnusableCheckpoint, match=r"d\.pt was trained against micro@aaaa, not micro@bbbb"):
        run(4, "micro@bbbb")
    assert run(4, "micro@aaaa")["step"] == 4
