"""Seeded sampling: a request's text depends on its seed alone, not on the drafter, the depth or the batch around it."""

import dataclasses
import random

import pytest
import torch

from met.engine import runner as runner_module
from met.engine.accept import position_noise, seeded_pick
from met.engine.generate import generate
from met.engine.runner import ModelRunner, Sampling
from tests.engine.test_sampling_lossless import random_dflash

SAMPLING = Sampling(temperature=0.7, top_p=0.9, seed=11)


def _prompts(n: int) -> list[list[int]]:
    rng = random.Random(3)
    # repetitive prompts: prompt lookup proposes from the first step, and some of its drafts are kept
    return [[rng.randrange(97, 100) for _ in range(rng.randrange(8, 24))] * 2 for _ in range(n)]


def _run(model, spec: str, width: int, depth: int = 3, sampling: Sampling = SAMPLING, drafter=None):
    prompts = _prompts(3)
    runner = ModelRunner(model, width, dflash=drafter)
    outs = [o for i in range(0, len(prompts), width)
            for o in generate(runner, prompts[i : i + width], 32, spec, depth, sampling, stop_at_eos=False)]
    return [o.tokens for o in outs], sum(o.proposed for o in outs), sum(o.accepted for o in outs)


def test_a_seeded_request_gets_the_same_text_under_every_drafter_depth_and_width(model):
    # speculation off one prompt at a time is the reference; every drafter, depth and batch width gives its text
    drafter = random_dflash(model)
    reference, _, _ = _run(model, "off", 1)
    kept = 0
    for spec, width, depth in [("off", 3, 0), ("mtp", 1, 1), ("mtp", 3, 4), ("prompt-lookup", 1, 2),
                               ("prompt-lookup", 3, 5), ("ngram", 2, 3), ("dflash", 1, 0), ("dflash", 3, 0)]:
        tokens, proposed, accepted = _run(model, spec, width, depth, drafter=drafter if spec == "dflash" else None)
        assert tokens == reference, (spec, width, depth)
        assert spec == "off" or proposed > 0
        kept += accepted
    assert kept > 0  # drafts were kept as well as refused: the picks, not only the first token, coincide


def test_another_seed_gives_another_text_and_unseeded_requests_differ(model):
    seeded, _, _ = _run(model, "mtp", 3)
    other, _, _ = _run(model, "mtp", 3, sampling=dataclasses.replace(SAMPLING, seed=12))
    unseeded = [_run(model, "mtp", 3, sampling=dataclasses.replace(SAMPLING, seed=None))[0] for _ in range(2)]
    assert other != seeded and unseeded[0] != unseeded[1]


def test_seeded_picks_follow_p_and_never_take_a_token_p_excludes():
    # Gumbel-max under each position's noise: over 20,000 positions the picks' frequencies are p's
    p = torch.tensor([0.5, 0.3, 0.2, 0.0], dtype=torch.float64)
    picks = [seeded_pick(p, position_noise(5, t, 4))[0] for t in range(20_000)]
    counts = [picks.count(x) / len(picks) for x in range(4)]
    assert counts[3] == 0 and all(abs(c - px) < 0.015 for c, px in zip(counts, p.tolist()))  # 5 standard errors
    assert position_noise(5, 7, 4).tolist() == position_noise(5, 7, 4).tolist() != position_noise(6, 7, 4).tolist()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_seeded_request_repeats_on_a_gpu(model):
    # the noise is drawn on the GPU by its own generator: the text still repeats under every drafter and width
    gpu = model.to("cuda")
    try:
        reference, _, _ = _run(gpu, "off", 1)
        for spec, width, depth in [("mtp", 3, 3), ("prompt-lookup", 3, 4)]:
            assert _run(gpu, spec, width, depth)[0] == reference, spec
    finally:
        model.to("cpu")


@pytest.mark.parametrize("spec", ["mtp", "dflash", "prompt-lookup"])
def test_each_position_draws_its_noise_once(model, spec, monkeypatch):
    # a drafted position's noise is drawn once, by the drafter (host drafts draw none), and the verify picks with
    # it again: per request the prefill's first token, per step each verified draft's position and the bonus's
    drafter = random_dflash(model) if spec == "dflash" else None
    calls = _count_noise(monkeypatch)
    outs = generate(ModelRunner(model, 3, dflash=drafter), _prompts(3), 32, spec, 3, SAMPLING, stop_at_eos=False)
    steps, proposed = sum(o.steps for o in outs), sum(o.proposed for o in outs)
    assert proposed > 0 and len(calls) == len(outs) + steps + proposed


def _count_noise(monkeypatch) -> list[int]:
    calls = []
    real = runner_module.position_noise

    def counting(seed, position, vocab, device="cpu"):
        calls.append(position)
        return real(seed, position, vocab, device)

    monkeypatch.setattr(runner_module, "position_noise", counting)
    return calls


def test_generate_takes_a_sampling_per_prompt(model):
    # one seed per prompt gives each prompt the text it gets alone under that seed; a count off is refused
    prompts = _prompts(3)
    each = [dataclasses.replace(SAMPLING, seed=s) for s in (1, 2, 3)]
    together = [o.tokens for o in generate(ModelRunner(model, 3), prompts, 16, "mtp", 2, each, stop_at_eos=False)]
    alone = [generate(ModelRunner(model, 1), [p], 16, "off", sampling=s, stop_at_eos=False)[0].tokens
             for p, s in zip(prompts, each)]
    assert together == alone
    with pytest.raises(ValueError, match="2 samplings for 3 prompts"):
        generate(ModelRunner(model, 3), prompts, 4, "off", sampling=each[:2])
