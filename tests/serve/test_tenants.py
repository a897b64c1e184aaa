"""Tenant isolation end to end: two API keys, two tenants; shared-lookup proposals never cross between them."""

import httpx

from met.engine.generate import generate
from met.engine.runner import ModelRunner
from met.speculative.shared_lookup import SharedLookup
from serve_helpers import MODEL, serving

SECRET = [200, 201, 202, 203, 204, 205]  # bytes only alice's request holds


class SpyLookup(SharedLookup):
    """The shared cache, recording every request held and every proposal, with its tenant."""

    def __init__(self):
        super().__init__()
        self.held: list[tuple[str, list[int]]] = []
        self.proposals: list[tuple[str, list[int]]] = []

    def add_request(self, scope, tokens):
        tokens = list(tokens)
        self.held.append((scope.tenant, tokens))
        return super().add_request(scope, tokens)

    def propose(self, scope, history, num_drafts):
        out = super().propose(scope, history, num_drafts)
        self.proposals.append((scope.tenant, out))
        return out


def _bob_prompt(model) -> tuple[list[int], int]:
    """A prompt of distinct bytes whose greedy first token is new to it: its own history then has no match."""
    for start in range(97, 240):
        prompt = [start, start + 1, start + 2]
        first = generate(ModelRunner(model, 1), [prompt], 1, "off", stop_at_eos=False)[0].tokens[0]
        if first not in prompt and first < 256:
            return prompt, first
    raise AssertionError("no suitable prompt")


def test_proposals_for_bob_never_come_from_alices_tokens(model):
    # alice's request holds (bob's last prompt token, bob's first token) followed by SECRET; bob's fallback
    # lookup must find nothing, while alice asking the same prompt gets SECRET proposed (the setup can leak)
    prompt, first = _bob_prompt(model)
    spy = SpyLookup()
    with serving(model, "prompt-lookup", keys={"ka": "alice", "kb": "bob"}, shared=spy) as srv:
        def ask(key: str, tokens: list[int]) -> dict:
            r = httpx.post(f"{srv.url}/v1/completions", headers={"authorization": f"Bearer {key}"}, timeout=30,
                           json={"model": MODEL, "prompt": tokens, "max_tokens": 8, "temperature": 0})
            assert r.status_code == 200, r.text
            return r.json()

        ask("ka", [1, 2, 3, prompt[-1], first, *SECRET])
        bob = ask("kb", prompt)
        alice = ask("ka", prompt)
    assert [t for t, _ in spy.held] == ["alice", "bob", "alice"]
    bob_proposals = [p for tenant, p in spy.proposals if tenant == "bob"]
    alice_proposals = [p for tenant, p in spy.proposals if tenant == "alice"]
    assert bob_proposals and all(not set(p) & set(SECRET) for p in bob_proposals)  # consulted, never leaked
    assert any(p[:1] == SECRET[:1] for p in alice_proposals)  # the same lookup under alice's scope finds it
    assert bob["choices"][0]["text"] == alice["choices"][0]["text"]  # proposals never change greedy text
