"""A draft model drafting for a target: its own cache stays the committed sequence's, and greedy text is plain's.

The target verifies whatever the draft model proposes, so wrong drafts cost speed, not text: these
tests check the drafts themselves. Each draft must be the draft model's own greedy continuation of
the sequence as committed so far (computed uncached, from scratch), after accepted drafts, rejected
ones, a plain step between, a slot moved by compaction and a neighbour released. A model drafting
for itself has every draft accepted.
"""

import pytest
import torch

from met.engine.generate import generate
from met.engine.runner import Draft, ModelRunner, Sampling
from met.model.config import ModelConfig
from met.model.transformer import Transformer
from random_models import micro_model


@torch.inference_mode()
def own_greedy(model: Transformer, history: list[int], k: int) -> list[int]:
    """model's next k greedy tokens after history, each from an uncached forward of the whole sequence."""
    seq = list(history)
    for _ in range(k):
        seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
    return seq[len(history):]


def near(model: Transformer, std: float, seed: int = 3) -> Transformer:
    """A copy of model with normal(0, std) noise on every weight: it agrees with model on most tokens, not all."""
    torch.manual_seed(seed)
    other = Transformer(model.cfg).double()
    other.load_state_dict(model.state_dict())
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn_like(p) * std)
    return other.eval()


def test_each_draft_is_the_draft_models_own_continuation_of_the_committed_text():
    target = micro_model(0)
    small = near(target, 0.1)
    runner = ModelRunner(target, max_batch=4, max_len=96, track_mtp=False, draft_model=small)
    prompts = [[5, 6, 7, 8, 9] * 3, [11, 12], [3] * 40]
    slots = [0, 1, 2]
    firsts = runner.prefill(slots, prompts, [Sampling()] * 3)
    history = {s: p + [f] for s, p, f in zip(slots, prompts, firsts)}
    accepted = rejected = 0
    for step in range(14):
        if step == 5:  # the middle sequence finishes; compaction moves slot 2 into slot 1
            runner.release(1)
            del history[1]
            moved = runner.compact([0, 2])
            assert moved == {2: 1}
            history[1] = history.pop(2)
            slots = [0, 1]
        depths = [0 if step % 4 == 3 and i == 0 else 1 + (step + i) % 3 for i in range(len(slots))]  # a plain row too
        drafts = runner.draft_small(slots, depths)
        for s, d, k in zip(slots, drafts, depths):
            assert d.tokens == own_greedy(small, history[s], k), (step, s)
            assert len(d.confidences) == k and all(c <= 0 for c in d.confidences)
        results = runner.verify(slots, drafts)
        for s, d, r in zip(slots, drafts, results):
            assert r.tokens == own_greedy(target, history[s], len(r.tokens))  # the target's greedy text
            history[s] += r.tokens
            accepted += r.accepted
            rejected += len(d.tokens) > r.accepted
    assert accepted > 0 and rejected > 0  # both paths of the cache's rollback ran


def test_a_model_drafting_for_itself_has_every_draft_accepted():
    # the draft model's cache after a verify that accepted everything lacks the last draft: it must catch up on it
    model = micro_model(0)
    runner = ModelRunner(model, max_batch=2, max_len=128, track_mtp=False, draft_model=micro_model(0))
    prompts = [[5, 6, 7, 8], [40, 41, 42, 43, 44, 45]]
    outs = generate(runner, prompts, 40, "draft", 3, stop_at_eos=False)
    plain = generate(ModelRunner(model, max_batch=2, max_len=128), prompts, 40, "off", stop_at_eos=False)
    assert [o.tokens for o in outs] == [o.tokens for o in plain]
    assert all(o.proposed > 20 and o.accepted == o.proposed for o in outs)


def test_another_draft_model_leaves_greedy_text_as_plain_decoding():
    target = micro_model(0)
    prompts = [[5, 6, 7, 8], [40, 41, 42, 43, 44, 45], [9] * 20]
    plain = generate(ModelRunner(target, max_batch=2, max_len=128), prompts, 48, "off", stop_at_eos=False)
    for depth in (1, 4):
        runner = ModelRunner(target, max_batch=2, max_len=128, track_mtp=False, draft_model=micro_model(2))
        outs = generate(runner, prompts, 48, "draft", depth, stop_at_eos=False)
        assert [o.tokens for o in outs] == [o.tokens for o in plain]
        assert sum(o.proposed for o in outs) > 0


def test_a_draft_model_of_another_vocabulary_or_a_shorter_context_is_refused():
    target = micro_model(0)
    other_vocab = Transformer(ModelConfig.from_name("micro").with_(vocab_size=100)).double()
    with pytest.raises(ValueError, match="vocabulary of 100 tokens is not this model's 258"):
        ModelRunner(target, 1, draft_model=other_vocab)
    short = Transformer(ModelConfig.from_name("micro").with_(max_seq_len=64)).double()
    with pytest.raises(ValueError, match="context of 64 tokens is shorter than the target's 128"):
        ModelRunner(target, 1, max_len=128, draft_model=short)


def test_drafting_twice_without_a_verify_is_refused():
    runner = ModelRunner(micro_model(0), 1, track_mtp=False, draft_model=micro_model(1))
    runner.prefill([0], [[1, 2, 3]], [Sampling()])
    runner.draft_small([0], [2])
    with pytest.raises(RuntimeError, match="verify its drafts before drafting again"):
        runner.draft_small([0], [2])
    runner.verify([0], [Draft([], [])])  # a plain step instead: the drafts fed leave the cache
    assert runner.draft_small([0], [1])[0].tokens


def test_a_verify_of_other_tokens_that_emits_a_fed_draft_as_its_own_keeps_it_waiting():
    # fed d1, verified X != d1 instead (a step's drafts replaced, as by a copy): the target rejects X and emits
    # its own token, d1; the cache must not count d1 as taken, or the next draft has no row to draft from
    model = micro_model(0)
    runner = ModelRunner(model, 1, track_mtp=False, draft_model=micro_model(0))  # drafts are the target's tokens
    prompt = [5, 6, 7, 8]
    history = prompt + runner.prefill([0], [prompt], [Sampling()])
    d1, d2 = runner.draft_small([0], [2])[0].tokens
    other = (d1 + 1) % model.cfg.vocab_size
    result = runner.verify([0], [Draft([other], [0.0])])[0]
    assert (result.accepted, result.tokens) == (0, [d1])
    history += result.tokens
    assert runner.draft_small([0], [3])[0].tokens == own_greedy(micro_model(0), history, 3)
