"""The scheduler on a checkpoint folder's model: its tokenizer's EOS, text and shared-lookup scope."""

import json

import pytest
import torch

from checkpoint_helpers import checkpoint, hf_greedy
from met.engine.policy import PolicyConfig, build_policy
from met.engine.requests import Finished, QueueSink, Request
from met.engine.runner import ModelRunner
from met.engine.scheduler import Scheduler
from met.model.sources import load_source
from met.speculative.shared_lookup import SharedLookup

pytest.importorskip("transformers")

PROMPT = list(range(40, 52))  # distinct tokens: no n-gram of the prompt repeats inside it


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sched") / "tiny-llama"
    hf = checkpoint(folder, "llama", seed=3)
    return load_source(str(folder), torch.float64), hf


class Spy(SharedLookup):
    """The shared cache, recording each scope asked and each non-empty proposal."""

    def __init__(self):
        super().__init__()
        self.scopes, self.hits = set(), 0

    def propose(self, scope, history, num_drafts):
        out = super().propose(scope, history, num_drafts)
        self.scopes.add(scope)
        self.hits += bool(out)
        return out


def _run(sched: Scheduler, prompt: list[int], max_tokens: int) -> tuple[str, Finished]:
    sink = QueueSink()
    sched.submit(Request("r", tuple(prompt), max_tokens), sink)
    for _ in range(1000):
        sched.tick()
        if any(isinstance(e, Finished) for e in list(sink.queue.queue)):
            break
    return sink.collect(timeout=1)


def test_shared_lookup_copies_across_requests_of_an_hf_model(source):
    # two requests with one prompt of distinct tokens: the second's own history has no match after its first
    # token, so it copies request one's continuation from the scope (the folder's recipe and tokenizer), and
    # its text is still transformers' greedy text
    (recipe, model, tok), hf = source
    spy = Spy()
    sched = Scheduler(ModelRunner(model, 2), build_policy(PolicyConfig("prompt-lookup"), 0), recipe.id,
                      shared=spy, tokenizer=tok)
    want = hf_greedy(hf, PROMPT, 20)
    assert want[0] not in PROMPT  # else the second request's own prompt would match first
    first, _ = _run(sched, PROMPT, 20)
    assert spy.hits == 0
    second, end = _run(sched, PROMPT, 20)
    assert first == second == tok.decode(want) and end.reason in ("length", "stop")
    assert spy.hits > 0
    assert {(s.model, s.tokenizer) for s in spy.scopes} == {(recipe.id, tok.name)}


def test_the_tokenizers_eos_ends_a_request(tmp_path):
    # EOS is the folder's (generation_config.json), not the byte tokenizer's 257: a token greedy decoding
    # reaches at step 6 is made the EOS id, and met stops there as transformers does
    folder = tmp_path / "eos"
    hf = checkpoint(folder, "llama", seed=3)
    eos = hf_greedy(hf, PROMPT, 8)[6]
    for name in ("config.json", "generation_config.json"):
        path = folder / name
        path.write_text(json.dumps(json.loads(path.read_text()) | {"eos_token_id": eos}))
    hf.config.eos_token_id = eos
    want = hf_greedy(hf, PROMPT, 12)
    recipe, model, tok = load_source(str(folder), torch.float64)
    assert tok.eos_ids == {eos} and len(want) <= 6
    sched = Scheduler(ModelRunner(model, 1), build_policy(PolicyConfig("off"), 0), recipe.id, tokenizer=tok)
    text, end = _run(sched, PROMPT, 12)
    assert end.reason == "stop" and end.completion_tokens == len(want) and text == tok.decode(want)
