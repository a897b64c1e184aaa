"""An EAGLE-3 head drafting for its target: each draft is the head's own chain over the committed text, and greedy
text is plain decoding's, through the runner and through `met generate --spec eagle`.

The target verifies whatever the head proposes, so wrong drafts cost speed, not text: the reference
test checks the drafts themselves, against the head computed uncached from the committed sequence
(the target's hidden states at the head's layers, position by position, then the head's own outputs
fed back), after accepted drafts, rejected ones, a plain step between, a slot moved by compaction and
a neighbour released.
"""

import json

import pytest
import torch
from typer.testing import CliRunner

from met.cli import app
from met.engine.generate import generate
from met.engine.runner import Draft, ModelRunner, Sampling
from met.exit_codes import EX_DATAERR, EX_NOINPUT
from met.model.eagle3 import Eagle3Head
from met.model.hf_config import read_hf_config
from met.model.transformer import Transformer
from checkpoint_helpers import checkpoint
from eagle3_helpers import random_head, save_head
from random_models import micro_model


@torch.inference_mode()
def head_chain(target: Transformer, head: Eagle3Head, committed: list[int], k: int) -> list[int]:
    """The head's k greedy drafts after committed (the last token the pending one), uncached from scratch."""
    L = len(committed) - 1  # the target's cached tokens; committed[L] is pending
    _, taps = target.hidden(torch.tensor([committed[:L]]), None, head.cfg.layers)  # [1, L, n * dim]
    hidden = head.fuse(taps)  # [1, L, dim]: row i reads the target at i and the token at i + 1
    tokens = list(committed[1:])
    embed = head.embedding(target)
    drafts = []
    for _ in range(k):
        n = hidden.shape[1]
        out = head(hidden, embed(torch.tensor([tokens])), torch.arange(n)[None])  # causal, no cache
        drafts.append(int(head.logits(out[0, -1]).argmax()))
        hidden = torch.cat([hidden, out[:, -1:]], 1)  # a draft row reads the head's own last output
        tokens.append(drafts[-1])
    return drafts


def own_greedy(model: Transformer, history: list[int], k: int) -> list[int]:
    seq = list(history)
    with torch.inference_mode():
        for _ in range(k):
            seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
    return seq[len(history):]


def test_each_draft_is_the_heads_own_chain_over_the_committed_text():
    target = micro_model(0)
    head = random_head(target.cfg, draft_vocab=200, layers=(0, 1, 2))
    runner = ModelRunner(target, max_batch=4, max_len=96, track_mtp=False, eagle=head)
    prompts = [[5, 6, 7, 8, 9] * 3, [11, 12], [3] * 40]
    slots = [0, 1, 2]
    firsts = runner.prefill(slots, prompts, [Sampling()] * 3)
    history = {s: p + [f] for s, p, f in zip(slots, prompts, firsts)}
    accepted = rejected = 0
    for step in range(14):
        if step == 5:  # the middle sequence finishes; compaction moves slot 2 into slot 1
            runner.release(1)
            del history[1]
            assert runner.compact([0, 2]) == {2: 1}
            history[1] = history.pop(2)
            slots = [0, 1]
        depths = [0 if step % 4 == 3 and i == 0 else 1 + (step + i) % 3 for i in range(len(slots))]  # a plain row too
        drafts = runner.draft_eagle(slots, depths)
        for s, d, k in zip(slots, drafts, depths):
            assert d.tokens == head_chain(target, head, history[s], k), (step, s)
            assert len(d.confidences) == k and all(c <= 0 for c in d.confidences)
            assert all(head.t2d[t] for t in d.tokens)  # target ids, of the draft vocabulary
        if step % 3 == 0:  # accept the first draft by proposing the target's own token there
            drafts = [Draft(own_greedy(target, history[s], 1) + d.tokens[1:], d.confidences) if d.tokens else d
                      for s, d in zip(slots, drafts)]
        results = runner.verify(slots, drafts)
        for s, d, r in zip(slots, drafts, results):
            assert r.tokens == own_greedy(target, history[s], len(r.tokens))
            history[s] += r.tokens
            accepted += r.accepted
            rejected += len(d.tokens) > r.accepted
    assert accepted > 0 and rejected > 0  # both paths of the rollback ran


def test_sampled_drafts_carry_q_over_the_target_vocabulary_zero_off_the_heads():
    target = micro_model(0)
    head = random_head(target.cfg, draft_vocab=50)
    runner = ModelRunner(target, max_batch=1, max_len=64, track_mtp=False, eagle=head)
    runner.prefill([0], [[4, 5, 6]], [Sampling(temperature=0.8)])
    (d,) = runner.draft_eagle([0], [3])
    assert d.q.shape == (3, 258)
    torch.testing.assert_close(d.q.sum(-1), torch.ones(3, dtype=d.q.dtype))
    assert bool((d.q[:, ~head.t2d] == 0).all()) and all(d.q[j, t] > 0 for j, t in enumerate(d.tokens))


def test_greedy_text_through_the_head_is_plain_decodings():
    target = micro_model(0)
    prompts = [[5, 6, 7, 8], [40, 41, 42, 43, 44, 45], [9] * 20]
    plain = generate(ModelRunner(target, max_batch=2, max_len=128), prompts, 48, "off", stop_at_eos=False)
    for depth, vocab in ((1, None), (4, 120)):
        runner = ModelRunner(target, max_batch=2, max_len=128, track_mtp=False,
                             eagle=random_head(target.cfg, draft_vocab=vocab))
        outs = generate(runner, prompts, 48, "eagle", depth, stop_at_eos=False)
        assert [o.tokens for o in outs] == [o.tokens for o in plain]
        assert sum(o.proposed for o in outs) > 0


def test_drafting_twice_without_a_verify_is_refused():
    target = micro_model(0)
    runner = ModelRunner(target, 1, track_mtp=False, eagle=random_head(target.cfg))
    runner.prefill([0], [[1, 2, 3]], [Sampling()])
    runner.draft_eagle([0], [2])
    with pytest.raises(RuntimeError, match="verify its drafts before drafting again"):
        runner.draft_eagle([0], [2])
    runner.verify([0], [Draft([], [])])  # a plain step instead: the draft rows are dropped
    assert runner.draft_eagle([0], [1])[0].tokens


def _cli(*args: str) -> tuple[int, str, list[dict]]:
    result = CliRunner().invoke(app, ["generate", "--dtype", "float64", "--json", "--max-tokens", "40", *args])
    lines = result.stdout.splitlines() if result.exit_code == 0 else []
    return result.exit_code, result.output, [json.loads(line) for line in lines]


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def folders(request, tmp_path_factory):
    """A random tiny target folder and a random head for it in the published layout.

    llama: a head narrower than the target (target_hidden_size 48, hidden 32) with its own embedding, over
    a draft vocabulary of 200 of the target's ids, reading the layers its config names; qwen3: 4 layers,
    vLLM's default layers (1, 2, 2 of them), the target's embedding, a draft vocabulary of 150.
    """
    family = request.param
    root = tmp_path_factory.mktemp(family)
    if family == "llama":
        checkpoint(root / "target", "llama")
    else:
        checkpoint(root / "target", "qwen3", head_dim=16, num_hidden_layers=4)
    cfg = read_hf_config(root / "target").config
    if family == "llama":
        head = random_head(cfg, draft_vocab=200, dim=32, layers=(0, 1, 2))
        save_head(root / "head", head)
    else:
        head = random_head(cfg, draft_vocab=150, layers=(1, 2, 2), own_embedding=False)
        save_head(root / "head", head, layer_ids=False)
    return root / "target", root / "head"


def test_met_generate_spec_eagle_gives_plain_greedy_text(folders):
    target, head = folders
    prompt = ["--model", str(target), "--prompt", "def add(a, b):\n    return"]
    code, output, plain = _cli(*prompt)
    assert code == 0, output
    for depth in ("1", "3"):
        code, output, eagle = _cli(*prompt, "--spec", "eagle", "--drafter", str(head), "--depth", depth)
        assert code == 0, output
        assert eagle[0]["text"] == plain[0]["text"] and eagle[0]["drafts_proposed"] > 0


def test_met_generate_refuses_a_head_that_does_not_fit_or_is_not_there(folders, tmp_path):
    target, head = folders
    prompt = ["--model", str(target), "--prompt", "x", "--spec", "eagle"]
    code, output, _ = _cli(*prompt)
    assert code == 2 and "pass its folder as --drafter" in output
    code, output, _ = _cli(*prompt, "--drafter", str(tmp_path / "none"))
    assert code == EX_NOINPUT and "no EAGLE-3 head at" in output
    wide = save_head(tmp_path / "wide", random_head(read_hf_config(target).config.with_(dim=64), dim=32))
    code, output, _ = _cli(*prompt, "--drafter", str(wide))
    assert code == EX_DATAERR and "hidden size 64; this model's is 48" in output
    code, output, _ = _cli("--model", str(target), "--prompt", "x", "--spec", "mtp", "--drafter", str(head))
    assert code == 2 and "--spec mtp would not use it" in output
