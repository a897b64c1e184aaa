"""Log-probabilities and logits processors under speculation: the same as plain decoding's, whatever drafts.

The reference is the model's own full forward pass (no cache, no drafts) over prompt + output,
with the processors applied as plain decoding applies them, one position at a time.
"""

from dataclasses import replace

import pytest
import torch

from met.engine.logits import History, process
from met.engine.policy import PolicyConfig, build_policy
from met.engine.requests import Delta, Finished, QueueSink, Request
from met.engine.runner import ModelRunner, Sampling
from met.engine.scheduler import Scheduler
from met.model.dflash import DflashConfig, DflashDrafter
from met.model.tokenizer import EOS, encode
from random_models import micro_model

SPECS = ["off", "mtp", "prompt-lookup", "dflash"]
PROMPTS = ["def add(a, b):\n    return a", "aaaa aaaa aaaa", "x = [1, 2, 3]\ny = [1, 2"]


@pytest.fixture(scope="module")
def model():
    return micro_model()


@pytest.fixture(scope="module")
def drafter(model):
    torch.manual_seed(3)  # an untrained drafter: its drafts are mostly rejected, which the rule must survive
    return DflashDrafter(DflashConfig.for_target(model.cfg, block=4, ffn_dim=64)).double().eval()


def _serve(model, drafter, spec: str, samplings: list[Sampling], prompts: list[str], max_tokens: int = 24):
    """Run requests through the scheduler; per request (tokens, logprobs, prompt logprobs, final event)."""
    runner = ModelRunner(model, len(prompts), dflash=drafter if spec == "dflash" else None)
    policy = build_policy(PolicyConfig(spec), model.cfg.mtp_depth, dflash_block=drafter.block)
    sched = Scheduler(runner, policy, "micro@test")
    sinks = [QueueSink() for _ in prompts]
    for i, (p, s, sink) in enumerate(zip(prompts, samplings, sinks)):
        sched.submit(Request(str(i), tuple(encode(p)), max_tokens, s), sink)
    out = [[[], [], None, None] for _ in prompts]
    while any(o[3] is None for o in out):
        sched.tick()
        for o, sink in zip(out, sinks):
            while not sink.queue.empty():
                event = sink.queue.get()
                if isinstance(event, Delta):
                    o[1].extend(event.logprobs)
                    o[2] = event.prompt_logprobs if event.prompt_logprobs is not None else o[2]
                else:
                    o[3] = event
    for o in out:
        o[0] = [lp.token for lp in o[1]]
    return out


def _full_logp(model, tokens: list[int]) -> torch.Tensor:
    """log_softmax of a plain full forward pass [T, V] over tokens (row j predicts tokens[j + 1])."""
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([tokens]))[0].double(), -1)


def test_greedy_logprobs_are_the_same_under_every_drafter_and_equal_a_full_forward(model, drafter):
    # every drafter, a batch of 3: tokens and log-probabilities (with top-3) identical to --spec off, and to the
    # model's own log-softmax over prompt + output within 1e-5; echo's prompt scores too
    sampling = Sampling(logprobs=3, prompt_logprobs=True)
    runs = {spec: _serve(model, drafter, spec, [sampling] * 3, PROMPTS) for spec in SPECS}
    base = runs["off"]
    drafted = sum(f.draft_tokens for spec in SPECS[1:] for *_, f in runs[spec])
    assert drafted > 0  # the drafters did draft: the figures came through verify steps
    for spec in SPECS[1:]:
        for got, want in zip(runs[spec], base):
            assert got[0] == want[0], spec
            assert [lp.logprob for lp in got[1]] == pytest.approx([lp.logprob for lp in want[1]], abs=1e-9), spec
            assert [[t for t, _ in lp.top] for lp in got[1]] == [[t for t, _ in lp.top] for lp in want[1]], spec
    for prompt, (tokens, lps, prompt_lps, _) in zip(PROMPTS, base):
        ids = encode(prompt)
        logp = _full_logp(model, ids + tokens)
        want = [float(logp[len(ids) - 1 + j, t]) for j, t in enumerate(tokens)]
        assert [lp.logprob for lp in lps] == pytest.approx(want, abs=1e-5)
        assert [float(logp[j, t]) for j, t in enumerate(ids[1:])] == \
            pytest.approx([lp.logprob for lp in prompt_lps], abs=1e-5)
        top = logp[len(ids) - 1].topk(3)
        assert [t for t, _ in lps[0].top] == top.indices.tolist()


def _plain_processed(model, prompt: list[int], sampling: Sampling, n: int) -> list[int]:
    """Greedy decoding with the processors, one full forward per token: the reference."""
    history, out = History(prompt, model.cfg.vocab_size, torch.device("cpu")), []
    for _ in range(n):
        with torch.no_grad():
            row = model(torch.tensor([prompt + out]))[0, -1:]
        t = int(process(row, sampling, history, [])[0].argmax())
        if t == EOS:
            break
        out.append(t)
        history.add([t])
    return out


PROCESSED = [
    Sampling(repetition_penalty=1.8),  # a seen token's logit shrinks
    Sampling(presence_penalty=1.5, frequency_penalty=0.7),  # output tokens pushed down
    Sampling(logit_bias=((97, 4.0), (32, 2.5))),  # "a" and " " pulled up
    Sampling(min_tokens=20, eos_ids=frozenset({EOS}), logit_bias=((EOS, 9.0),)),  # EOS banned for 20 tokens
]


@pytest.mark.parametrize("sampling", PROCESSED, ids=["repetition", "presence-frequency", "bias", "min-tokens"])
def test_speculation_stays_lossless_under_logits_processors(model, drafter, sampling):
    # each row of a verify sees the drafts before it: every drafter gives the reference's tokens
    want = [_plain_processed(model, encode(p), sampling, 24) for p in PROMPTS]
    assert want != [_plain_processed(model, encode(p), Sampling(), 24) for p in PROMPTS]  # the processor matters
    for spec in SPECS:
        got = [o[0] for o in _serve(model, drafter, spec, [replace(sampling, logprobs=0)] * 3, PROMPTS)]
        assert got == want, spec


def test_seeded_sampling_under_processors_and_truncation_is_the_same_under_every_drafter(model, drafter):
    # seeded picks are by position: penalties, top_k and min_p on, each drafter gives --spec off's text
    s = Sampling(0.9, 0.95, 7, top_k=20, min_p=0.05, presence_penalty=0.5, repetition_penalty=1.3, logprobs=0)
    runs = {spec: [o[0] for o in _serve(model, drafter, spec, [s] * 3, PROMPTS)] for spec in SPECS}
    assert all(runs[spec] == runs["off"] for spec in SPECS), runs


def test_max_tokens_0_with_prompt_logprobs_scores_the_prompt_alone(model, drafter):
    # echo's max_tokens = 0: the prompt's scores, no token generated
    (tokens, lps, prompt_lps, end), = _serve(model, drafter, "mtp", [Sampling(logprobs=1, prompt_logprobs=True)],
                                             PROMPTS[:1], max_tokens=0)
    assert tokens == [] and end.completion_tokens == 0 and isinstance(end, Finished)
    assert len(prompt_lps) == len(encode(PROMPTS[0])) - 1

