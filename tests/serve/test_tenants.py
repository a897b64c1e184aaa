"""Tenant isolation end to end: two API keys, two tenants; shared-lookup proposals never cross between them.

The shared lookup is instrumented (SpyLookup): every proposal is traced to the held request it was
copied from, and a shadow index with one scope for everyone shows which proposals a leak would
have made. Requests without a valid key are refused before the scheduler's submit is ever called.
"""

import json
from concurrent.futures import ThreadPoolExecutor

import httpx

from met.engine.generate import generate
from met.engine.runner import ModelRunner
from met.speculative.shared_lookup import ScopeKey, SharedLookup
from serve_helpers import MODEL, serving

SECRET = [200, 201, 202, 203, 204, 205]  # bytes only alice's request holds


class SpyLookup(SharedLookup):
    """The shared cache, recording every request held and every proposal, with its tenant.

    `sources` records, for each lookup that found a match, (asking tenant, tenant of the held request
    the proposal is copied from); `shadow` holds the same requests in one scope for every tenant, and
    `would_cross` counts the lookups whose shadow match lies in another tenant's request: what a
    lookup that ignored tenants would have proposed.
    """

    def __init__(self):
        super().__init__()
        self.held: list[tuple[str, list[int]]] = []
        self.proposals: list[tuple[str, list[int]]] = []
        self.sources: list[tuple[str, str]] = []
        self.shadow, self.shadow_tenants, self.would_cross = SharedLookup(), [], 0

    def add_request(self, scope, tokens):
        tokens = list(tokens)
        self.held.append((scope.tenant, tokens))
        if self.shadow.add_request(ScopeKey(scope.model, scope.tokenizer, None, "*"), tokens):
            self.shadow_tenants.append(scope.tenant)
        return super().add_request(scope, tokens)

    def match(self, scope, history, longer_than=0):
        found = super().match(scope, history, longer_than)
        if found is not None:
            self.sources.append((scope.tenant, _owner(self, found[1], lambda rid: self._held[rid][0].tenant)))
        shadow = self.shadow.match(ScopeKey(scope.model, scope.tokenizer, None, "*"), history, longer_than)
        if shadow is not None and _owner(self.shadow, shadow[1], self.shadow_tenants.__getitem__) != scope.tenant:
            self.would_cross += 1
        return found

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


def _owner(lookup: SharedLookup, tokens: tuple[int, ...], tenant_of) -> str:
    """The tenant of the held request whose tokens a match returned (the very tuple the cache holds)."""
    rids = [rid for rid, (_, held) in lookup._held.items() if held is tokens]
    assert len(rids) == 1
    return tenant_of(rids[0])


CODE = ["def add(a, b):\n    return a + b\n", "import os\nimport sys\n", "for i in range(10):\n    print(i)\n",
        "class Stack:\n    def __init__(self):\n", "with open(p) as f:\n    d = f.read()\n", "x = [1, 2, 3]\n"]


def test_two_tenants_at_once_never_get_each_others_tokens(model):
    # alice sends every prompt first; then bob sends the same prompts while alice keeps sending: every
    # lookup bob makes could copy alice's identical requests (the shadow says so), none does; once bob
    # holds his own, his lookups copy from them. Proposals never change greedy text: both get the same.
    spy = SpyLookup()
    with serving(model, "prompt-lookup", max_batch=4, keys={"ka": "alice", "kb": "bob"}, shared=spy) as srv:
        def ask(key: str, prompt: str) -> str:
            r = httpx.post(f"{srv.url}/v1/completions", headers={"authorization": f"Bearer {key}"}, timeout=60,
                           json={"model": MODEL, "prompt": prompt, "max_tokens": 24, "temperature": 0})
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["text"]

        with ThreadPoolExecutor(4) as pool:
            alice = list(pool.map(lambda p: ask("ka", p), CODE))
            crossed_before = spy.would_cross
            mixed = list(pool.map(lambda kp: ask(*kp), [(k, p) for p in CODE for k in ("kb", "ka")]))
            bob_again = list(pool.map(lambda p: ask("kb", p), CODE[:3]))
    assert [t for t, _ in spy.held].count("bob") == len(CODE) + 3
    assert spy.sources and all(asking == source for asking, source in spy.sources), spy.sources
    assert spy.would_cross > crossed_before  # bob's lookups would have copied alice's requests
    assert ("bob", "bob") in spy.sources  # ... and did copy his own once he had some
    assert mixed[0::2] == alice and mixed[1::2] == alice and bob_again == alice[:3]


BAD_AUTH = [
    {},  # no key
    {"authorization": "Bearer"},  # the scheme alone
    {"authorization": b"Bearer k\xe9"},  # a byte that is not ASCII
    {"authorization": "Bearer kc"},  # a key this server does not know
    {"authorization": "Bearer KA"},  # alice's key in other case
    {"authorization": "Bearer ka2"},  # alice's key with more after it
    {"authorization": "Bearer k"},  # a prefix of both keys
    {"authorization": "Basic a2E6"},  # another scheme ("ka:" in base64)
    {"authorization": "ka"},  # alice's key without a scheme
    {"api-key": "kc"},  # the other header, an unknown key
    {"authorization": "Bearer kc", "api-key": "ka"},  # the first credential sent is the one judged
]


def test_requests_without_a_valid_key_never_reach_the_scheduler(model):
    # every bad credential is a 401 before the body is read (a body too large or not JSON does not matter);
    # the scheduler's submit sees only the valid keys' requests, each with its key's tenant
    submitted = []
    with serving(model, "off", keys={"ka": "alice", "kb": "bob"}) as srv:
        submit = srv.scheduler.submit
        srv.scheduler.submit = lambda req, sink: (submitted.append(req.tenant), submit(req, sink))
        good = {"model": MODEL, "prompt": "hi", "max_tokens": 2, "temperature": 0}
        for headers in BAD_AUTH:
            for body in (good, b"{not json", b"x" * (5 << 20)):
                content = body if isinstance(body, bytes) else json.dumps(body).encode()
                r = httpx.post(f"{srv.url}/v1/completions", content=content, timeout=30,
                               headers=headers | {"content-type": "application/json"})
                assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (headers, r.text)
            for path in ("/v1/models", "/v1/snapshot"):
                assert httpx.get(f"{srv.url}{path}", headers=headers, timeout=30).status_code == 401
        assert submitted == [] and srv.scheduler.cell.latest().finished == ()
        for headers in ({"authorization": "Bearer ka"}, {"authorization": "bearer  kb"}, {"api-key": "kb"}):
            assert httpx.post(f"{srv.url}/v1/completions", json=good, headers=headers, timeout=30).status_code == 200
    assert submitted == ["alice", "bob", "bob"]
