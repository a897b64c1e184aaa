"""`met generate --spec dflash`: a micro target with a briefly trained block drafter gives plain greedy's text."""

import json
from dataclasses import asdict

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from met.cli import app
from met.engine.generate import generate
from met.engine.identity import dflash_drafter_key
from met.engine.runner import ModelRunner, Sampling
from met.exit_codes import EX_DATAERR, EX_NOINPUT
from met.model.config import ModelConfig
from met.model.corpus import Split
from met.model.dflash import DflashConfig, DflashDrafter, save_drafter, shipped_path
import met.model.recipes as recipes
from met.model.transformer import Transformer
from met.model.weights import save_weights, write_card
from met.train.dflash import DflashTrainParams, train_dflash

PROMPTS = ["def add(a, b):\n", "aaaa", "x = [1, 2, 3]"]


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    """An embedded micro recipe and a DFlash drafter trained on it for 40 steps, shipped beside its weights."""
    folder = tmp_path_factory.mktemp("weights")
    torch.manual_seed(0)
    target = Transformer(ModelConfig.from_name("micro"))
    for p in target.parameters():
        torch.nn.init.normal_(p, std=0.3)
    digest = save_weights(target, folder / "micro-t.safetensors")
    write_card({"config": asdict(target.cfg), "digest": digest}, folder / "micro-t.card.json")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(recipes, "WEIGHTS_DIR", folder)
        recipe = recipes.embedded("micro-t")
    torch.manual_seed(1)
    drafter = DflashDrafter(DflashConfig.for_target(target.cfg, block=8, ffn_dim=64))
    split = Split(np.random.default_rng(0).integers(97, 110, 4000).astype(np.uint16), ("x",))
    train_dflash(drafter, target.eval(), split, split,
                 DflashTrainParams(steps=40, batch=4, seq_len=64, anchors=16, lr=3e-3, warmup=4, eval_every=40), None)
    save_drafter(drafter, shipped_path(recipe), recipe.id)
    return folder, recipe, target.double(), drafter.double()


@pytest.fixture
def micro(shipped, monkeypatch):
    monkeypatch.setattr(recipes, "WEIGHTS_DIR", shipped[0])
    return shipped


def _json(*args: str) -> list[dict]:
    result = CliRunner().invoke(app, ["generate", "--recipe", "micro-t", "--dtype", "float64", "--json", *args])
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_dflash_text_equals_plain_greedy_with_the_rungs_widths(micro, tmp_path):
    # float64, single stream and a batch of 3: the same text as --spec off; the widths the rung chose are reported
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps(p) for p in PROMPTS))
    for batch in ("1", "3"):
        plain = _json("--prompts", str(prompts), "--max-tokens", "40", "--batch", batch)
        block = _json("--prompts", str(prompts), "--max-tokens", "40", "--batch", batch, "--spec", "dflash")
        assert [o["text"] for o in block] == [o["text"] for o in plain]
        assert all(o["dflash_widths"] and o["drafts_proposed"] > 0 for o in block)
        assert "dflash_widths" not in plain[0]
    single = _json("--prompt", PROMPTS[1], "--max-tokens", "40", "--spec", "dflash")[0]
    assert set(single["dflash_widths"]) <= {"8"}  # width 1: the top single-stream level, capped by the block of 8
    assert sum(o["drafts_accepted"] for o in block) > 0  # a few training steps already land some drafts


@pytest.mark.parametrize("block, capped", [(4, True), (16, False)])
def test_json_says_when_the_drafters_block_cut_the_rungs_gamma(micro, tmp_path, block, capped):
    # a single stream's gamma is 8, 12 or 16: a block of 4 cuts every step's (its widths read 4, not the rung's
    # choice), a block of 16 none
    _, recipe, target, _ = micro
    torch.manual_seed(2)
    path = tmp_path / f"block{block}.safetensors"
    save_drafter(DflashDrafter(DflashConfig.for_target(target.cfg, block=block, ffn_dim=64)), path, recipe.id)
    out = _json("--prompt", PROMPTS[0], "--max-tokens", "12", "--spec", "dflash", "--drafter", str(path))[0]
    assert out["steps"] > 0 and out["dflash_capped"] == (out["steps"] if capped else 0)
    if capped:
        assert out["dflash_widths"] == {"4": out["steps"]}


@pytest.mark.parametrize("width", range(1, 9))
def test_dflash_equals_plain_greedy_at_every_tier_width(micro, width):
    # widths 1..8 cover the single stream and the 2, 3..=4 and 5..=8 tiers (gammas 8, 8, 6, 4); one prompt ends
    # 4 tokens short of the context, so its blocks are clamped by the room left
    _, _, target, drafter = micro
    rng = np.random.default_rng(width)
    prompts = [[int(t) for t in rng.integers(97, 110, rng.integers(3, 20))] for _ in range(width - 1)]
    prompts.append([97 + i % 13 for i in range(target.cfg.max_seq_len - 4)])
    plain = generate(ModelRunner(target, width), prompts, 30, "off", stop_at_eos=False)
    block = generate(ModelRunner(target, width, dflash=drafter), prompts, 30, "dflash", stop_at_eos=False)
    assert [o.tokens for o in block] == [o.tokens for o in plain]
    assert sum(o.proposed for o in block) > 0 and len(block[-1].tokens) < 30  # the long prompt ran into the context


def test_runner_drafts_up_to_gamma_per_slot(micro):
    # one pass, per-slot gammas 0, 3 and 8; confidences are log-probabilities; a gamma past the block is refused
    _, _, target, drafter = micro
    runner = ModelRunner(target, 3, dflash=drafter)
    runner.prefill([0, 1, 2], [[97, 98], [99], [100, 101, 102]], [Sampling()] * 3)
    drafts = runner.draft_dflash([0, 1, 2], [0, 3, 8])
    assert [len(d.tokens) for d in drafts] == [0, 3, 8]
    assert all(c <= 0 for d in drafts for c in d.confidences)
    with pytest.raises(ValueError, match="exceeds the drafter's block of 8"):
        runner.draft_dflash([0], [9])


def test_sampled_dflash_is_reproducible_and_runs_to_length(micro):
    # temperature > 0: lossless speculative sampling with the block's per-position distributions; same seed, same text
    _, _, target, drafter = micro
    outs = [generate(ModelRunner(target, 1, dflash=drafter), [[97, 98, 99]], 30, "dflash",
                     sampling=Sampling(0.8, 0.95, 7), stop_at_eos=False)[0].tokens for _ in range(2)]
    assert outs[0] == outs[1] and len(outs[0]) == 30


def test_missing_or_foreign_drafter_is_refused(micro, tmp_path):
    # no drafter file: 66 naming the training command; a drafter of another target: 65 naming both
    result = CliRunner().invoke(app, ["generate", "--recipe", "micro-t", "--prompt", "x", "--spec", "dflash",
                                      "--drafter", str(tmp_path / "none.safetensors")])
    assert result.exit_code == EX_NOINPUT and "met model train --drafter dflash" in result.stderr
    other = tmp_path / "other.safetensors"
    save_drafter(micro[3].float(), other, "another@0000")
    micro[3].double()
    result = CliRunner().invoke(app, ["generate", "--recipe", "micro-t", "--prompt", "x", "--spec", "dflash",
                                      "--drafter", str(other)])
    assert result.exit_code == EX_DATAERR and "trained against another@0000" in result.stderr


def test_a_damaged_drafter_file_exits_65_in_one_line(micro, tmp_path):
    # not safetensors at all, or the right header over weights that do not fit its config: no traceback
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"not a safetensors file")
    _, recipe, _, drafter = micro
    cut = tmp_path / "cut.safetensors"
    save_drafter(drafter.float(), cut, recipe.id)
    drafter.double()
    data = cut.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    for path in (garbage, cut):
        result = CliRunner().invoke(app, ["generate", "--recipe", "micro-t", "--prompt", "x", "--spec", "dflash",
                                          "--drafter", str(path)])
        assert result.exit_code == EX_DATAERR, (path, result.output)
        assert result.stderr.startswith(f"error: {path} ") and result.stderr.count("\n") == 1
        assert result.exception is None or isinstance(result.exception, SystemExit)


def test_drafter_key_is_its_own_file(micro):
    # kind dflash, the recipe's name, the drafter file's digest (not the target's)
    _, recipe, _, _ = micro
    from met.model.weights import file_digest

    key = dflash_drafter_key(recipe, file_digest(shipped_path(recipe)))
    assert (key.kind, key.name) == ("dflash", "micro-t") and key.digest != recipe.digest
