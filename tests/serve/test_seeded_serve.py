"""A seeded sampled request over HTTP gets the text it gets alone without speculation, whatever is served beside it."""

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from met.engine.generate import generate
from met.engine.policy import PolicyConfig, build_policy
from met.engine.policy_mtp import MtpPlannedPolicy
from met.engine.runner import ModelRunner, Sampling
from met.model.tokenizer import decode, encode
from met.speculative.spec_capacity import DEFAULT_POOLS
from met.speculative.spec_cost import (AcceptanceCalibration, Cell, ConfidenceBin, CostTable, DrafterKey,
                                       PositionPrior, SpecCostState, TableKey)
from serve_helpers import MODEL, serving, settled

# repetitive prompts, so prompt lookup proposes from the first step; seeds at both ends of the range accepted
# (prompt, seed, temperature, top_p); a tiny temperature or top_p is the argmax
CASES = [("ab" * 9, 7, 0.8, 0.9), ("def f(x):\n    return x\n" * 2, -(1 << 63), 0.8, 0.9),
         ("x = 1\ny = 2\n" * 2, (1 << 64) - 1, 0.8, 0.9), ("import os\n" * 3, 0, 1e-30, 1.0),
         ("x = 1\ny = 2\n" * 2, 5, 0.8, 1e-6)]
MAX_TOKENS = 24


def _alone(model, prompt: str, seed: int, temperature: float, top_p: float) -> tuple[str, str]:
    """(text, finish_reason) of the request alone with speculation off (`met generate --spec off --seed`)."""
    sampling = Sampling(temperature, top_p, seed)
    out = generate(ModelRunner(model, 1), [encode(prompt)], MAX_TOKENS, "off", sampling=sampling)
    return decode(out[0].tokens), "stop" if out[0].finished_by == "eos" else "length"


def _stop(text: str) -> str:
    """A stop string inside the text: its first character past the third that decodes (not U+FFFD)."""
    return next(c for c in text[3:] if c != "\ufffd")


def _measured(model) -> MtpPlannedPolicy:
    """--spec-cost-model measured on a table where drafting pays (k up to 3) and a calibration that accepts often."""
    key = TableKey("box", "r@d", "none", {"decode": "a", "verify": "b", "draft_mtp": "c"})
    cells = [Cell(n, k, 0.01 * (1 + 0.1 * k), 0.001 * k, None, None) for n in (1, 4) for k in range(4)]
    drafter = DrafterKey("mtp", "r", "d")
    cal = AcceptanceCalibration(drafter, 0.1, 1000, [ConfidenceBin(0.0, 0.9, 1000)], [PositionPrior(1, 0.9, 1000)])
    return MtpPlannedPolicy(SpecCostState(CostTable(key, cells), cal, 0.1, key, drafter), model.cfg.mtp_depth,
                            DEFAULT_POOLS)


def _ask(url: str, body: dict) -> tuple[str, str]:
    """(text, finish_reason) of a completion, plain or joined from its stream."""
    if not body.get("stream"):
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        return choice["text"], choice["finish_reason"]
    parts, finish = [], None
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                doc = json.loads(line.removeprefix("data: "))
                assert "error" not in doc, doc
                parts.append(doc["choices"][0]["text"])
                finish = doc["choices"][0]["finish_reason"] or finish
    return "".join(parts), finish


@pytest.mark.parametrize("spec", ["off", "mtp", "mtp-measured", "prompt-lookup"])
def test_a_seeded_request_is_served_its_text_alone_without_speculation(model, spec):
    # each seeded request, sent alone, then plain, streamed and with a stop string among 17 concurrent ones
    # (an unseeded and a greedy one too) through 4 slots (widths 1..4): the text it gets alone with
    # speculation off, under every policy
    alone = [_alone(model, *case) for case in CASES]
    stops = [_stop(text) for text, _ in alone]
    policy = _measured(model) if spec == "mtp-measured" else build_policy(PolicyConfig(spec), model.cfg.mtp_depth)
    bodies = [{"model": MODEL, "prompt": p, "max_tokens": MAX_TOKENS, "temperature": t, "top_p": tp, "seed": s}
              for p, s, t, tp in CASES]
    with serving(model, policy=policy, max_batch=4) as srv:
        assert _ask(srv.url, bodies[0]) == alone[0]
        asked = [b | {"stream": stream} for stream in (False, True) for b in bodies]
        asked += [b | {"stop": stop} for b, stop in zip(bodies, stops)]
        asked += [bodies[0] | {"seed": None}, bodies[1] | {"temperature": 0}]  # the standard rule, greedy beside them
        with ThreadPoolExecutor(len(asked)) as pool:
            got = list(pool.map(lambda b: _ask(srv.url, b), asked))
        snap = settled(srv.scheduler, lambda s: sum(c for _, c in s.finished) == len(asked) + 1)
    assert got[: 2 * len(CASES)] == alone * 2
    cut = [(text[: text.index(stop)], "stop") for (text, _), stop in zip(alone, stops)]
    assert got[2 * len(CASES) : 3 * len(CASES)] == cut
    if spec != "off":  # drafts were kept as well as refused: the picks, not only the bonus tokens, coincide
        assert 0 < snap.drafts_accepted < snap.drafts_proposed
