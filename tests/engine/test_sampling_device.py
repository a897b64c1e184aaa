"""Sampled requests without a seed run where the model runs: their generator lives on the model's device."""

import pytest
import torch

from met.engine.generate import generate
from met.engine.runner import ModelRunner, Sampling
from tests.engine.test_sampling_lossless import random_dflash

UNSEEDED = Sampling(temperature=0.7, top_p=0.9)
PROMPTS = [[97, 98, 99] * 4, [100, 101] * 5, [97] * 9]


def _sample_under_every_drafter(model, device: str) -> None:
    # prefill's pick, MTP's and DFlash's sampled drafts, host drafts and the speculative rule all draw
    # from the request's generator: every drafter runs to max_tokens on the device
    drafter = random_dflash(model).to(device)
    gpu = model.to(device)
    try:
        for spec in ("off", "mtp", "prompt-lookup", "dflash"):
            runner = ModelRunner(gpu, len(PROMPTS), dflash=drafter if spec == "dflash" else None)
            # 64 tokens: in 16, sampled text gave prompt lookup no recurring suffix in about 1 run of 13 (a
            # flaky test); in 64, none of 200 runs went without one (the fewest proposed 26 drafts)
            outs = generate(runner, PROMPTS, 64, spec, 3, UNSEEDED, stop_at_eos=False)
            assert [len(o.tokens) for o in outs] == [64] * len(PROMPTS), spec
            assert spec == "off" or sum(o.proposed for o in outs) > 0, spec
    finally:
        model.to("cpu")


def test_an_unseeded_sampled_request_runs_under_every_drafter(model):
    _sample_under_every_drafter(model, "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_an_unseeded_sampled_request_runs_on_a_gpu(model):
    # its generator was a host one: torch refuses it for a GPU's multinomial ("Expected a 'cuda' device
    # type for generator but found 'cpu'"), so a served request without a seed (temperature 1 by default)
    # failed its prefill with a 500 on a GPU
    _sample_under_every_drafter(model, "cuda")
