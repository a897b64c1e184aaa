"""The serve soak of benchmarks/soak.py: a real server in its own process on 127.0.0.1, and a hostile load on it.

The server process (`python3 benchmarks/soak_serve.py CONFIG_JSON`) builds the scheduler and app
exactly as `met serve` does (create_app, KeyRing, uvicorn through met.serve.server.run, SIGTERM
drains), with a shared-lookup budget small enough to be reached, and adds one read-only route for
the soak, GET /soak/state: free KV slots, running and waiting sequences, shared-lookup tokens
held, failed ticks. The load (`run_load`) is N concurrent clients until the deadline, each
looping over a weighted mix of good streamed and plain requests (greedy, compared with their solo
greedy output), malformed ones, oversized prompts and bodies, wrong and missing keys, clients that
hang up mid-stream or time out. Loopback only.
"""

import asyncio
import json
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
MODEL_NAME = "soak-model"
KEYS = {"key-alpha": "alpha", "key-beta": "beta"}  # two tenants: shared lookups stay within each
REQUEST_TIMEOUT_S = 180.0  # a good request queued behind the whole load still finishes well within this

# kind -> (weight, the status it must get); None: whatever the client saw (it hung up)
KINDS = {
    "good_stream": (40, 200), "good_plain": (10, 200), "sampled": (3, 200),
    "disconnect_stream": (8, None), "abandon_plain": (3, None),
    "bad_json": (4, 400), "not_object": (2, 400), "negative_max_tokens": (4, 400), "bad_types": (3, 400),
    "huge_seed": (2, 400), "unknown_model": (4, 404), "oversized_prompt": (2, 400), "over_context": (3, 400),
    "huge_body": (3, 413), "wrong_key": (4, 401), "no_key": (2, 401),
}


def build_model(config: dict):
    """The served model: an embedded recipe in the asked dtype, or the serve tests' random float64 micro model."""
    import torch

    if config["model"] == "micro":
        sys.path.insert(0, str(ROOT / "tests"))
        from random_models import micro_model

        return micro_model(), "micro@test"
    from met.model.recipes import embedded

    recipe = embedded(config["model"])
    return recipe.load(getattr(torch, config["dtype"])), recipe.id


def serve(config: dict) -> int:
    """The server process: prints `port N` once it listens; serves until SIGTERM, then drains and exits 0."""
    import torch
    from fastapi.responses import JSONResponse

    from met.engine.policy import PolicyConfig, build_policy
    from met.engine.runner import ModelRunner
    from met.engine.scheduler import Scheduler
    from met.serve import server
    from met.serve.app import Service, create_app
    from met.serve.auth import KeyRing
    from met.speculative.shared_lookup import SharedLookup, SharedLookupParams

    torch.set_num_threads(config["threads"])
    model, model_id = build_model(config)
    num_drafts = model.cfg.mtp_depth if model.mtp is not None else 0
    shared = SharedLookup(SharedLookupParams(budget_tokens=config["shared_budget"]))
    scheduler = Scheduler(ModelRunner(model, config["max_batch"]), build_policy(PolicyConfig(config["spec"]),
                                                                                 num_drafts), model_id, shared=shared)
    app = create_app(Service(scheduler, (MODEL_NAME,), KeyRing(KEYS)))

    @app.get("/soak/state")
    async def state() -> JSONResponse:
        return JSONResponse({"free_slots": len(scheduler.free_slots), "max_batch": scheduler.runner.cache.max_batch,
                             "running": len(scheduler.running), "waiting": len(scheduler.waiting),
                             "shared_tokens": shared.tokens_held, "shared_budget": shared.params.budget_tokens,
                             "failed_ticks": scheduler.stats.failed_ticks, "context": scheduler.max_len,
                             "model_id": model_id})

    def started(s) -> None:
        print(f"port {server.bound_port(s)}", flush=True)

    return server.run(app, "127.0.0.1", 0, "warning", on_started=started)


@dataclass
class Tally:
    """What the clients saw: statuses by kind, differing outputs, stream errors, good tokens."""

    statuses: Counter = field(default_factory=Counter)  # (kind, status or outcome)
    unexpected: list = field(default_factory=list)  # (kind, status, detail)
    differing: list = field(default_factory=list)  # (prompt index, expected, got)
    compared: int = 0
    stream_errors: int = 0
    good_tokens: int = 0
    transport_errors: Counter = field(default_factory=Counter)
    seconds: dict = field(default_factory=lambda: {"served": [], "refused": []})  # latency of 200s and of 4xx


def prompts_for(context: int, max_tokens: int, count: int = 16) -> list[str]:
    """Distinct code-like prompts of varied length that leave room for max_tokens in the context."""
    pieces = ["def add(a, b):\n    return a + b\n", "import os\nimport sys\n",
              "class Stack:\n    def __init__(self):\n", "for i in range(10):\n    print(i)\n", "x = [1, 2, 3]\n",
              "with open(path) as f:\n    data = f.read()\n", "try:\n    run()\nexcept ValueError as exc:\n",
              "    if not items:\n        return None\n"]
    room = context - max_tokens - 1
    prompts = []
    for i in range(count):
        text = "".join(pieces[(i + j) % len(pieces)] for j in range(1 + (i * 7) % 24)) + f"# {i}\n"
        prompts.append(text[-room:])
    return prompts


class Load:
    """The clients of one soak: shared prompts, their solo greedy texts, the tally."""

    def __init__(self, url: str, prompts: list[str], solo: list[str], max_tokens: int, context: int) -> None:
        self.url, self.prompts, self.solo, self.max_tokens, self.context = url, prompts, solo, max_tokens, context
        self.tally = Tally()

    async def client(self, http: httpx.AsyncClient, rng: random.Random, deadline: float) -> None:
        kinds, weights = list(KINDS), [w for w, _ in KINDS.values()]
        for _ in range(1_000_000):  # bounded: the deadline ends it long before
            if time.monotonic() >= deadline:
                return
            kind = rng.choices(kinds, weights)[0]
            t0 = time.monotonic()
            try:
                outcome = await getattr(self, kind)(http, rng)
            except httpx.HTTPError as exc:
                outcome = f"transport error ({type(exc).__name__})"
                self.tally.transport_errors[kind, type(exc).__name__] += 1
            self.tally.statuses[kind, outcome] += 1
            want = KINDS[kind][1]
            if want is not None and outcome == want:
                self.tally.seconds["served" if want == 200 else "refused"].append(time.monotonic() - t0)
            if want is not None and outcome != want:
                self.tally.unexpected.append((kind, outcome))

    def _body(self, rng: random.Random, **over) -> dict:
        i = rng.randrange(len(self.prompts))
        body = {"model": MODEL_NAME, "prompt": self.prompts[i], "max_tokens": self.max_tokens, "temperature": 0}
        return body | over

    def _headers(self, rng: random.Random) -> dict:
        return {"authorization": f"Bearer {rng.choice(list(KEYS))}"}

    def _compare(self, body: dict, text: str) -> None:
        i = self.prompts.index(body["prompt"])
        self.tally.compared += 1
        if text != self.solo[i]:
            self.tally.differing.append((i, self.solo[i], text))

    async def good_stream(self, http: httpx.AsyncClient, rng: random.Random) -> int | str:
        body = self._body(rng, stream=True, stream_options={"include_usage": True})
        async with http.stream("POST", f"{self.url}/v1/completions", json=body, headers=self._headers(rng)) as r:
            if r.status_code != 200:
                await r.aread()
                return r.status_code
            parts, done, failed = [], False, False
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line.removeprefix("data: ")
                if data == "[DONE]":
                    done = True
                    continue
                event = json.loads(data)
                if "error" in event:
                    failed = True
                elif event["choices"]:
                    parts.append(event["choices"][0]["text"])
                else:
                    self.tally.good_tokens += event["usage"]["completion_tokens"]
        if failed or not done:
            self.tally.stream_errors += 1
            return "stream error" if failed else "stream cut"
        self._compare(body, "".join(parts))
        return 200

    async def good_plain(self, http: httpx.AsyncClient, rng: random.Random) -> int:
        body = self._body(rng)
        r = await http.post(f"{self.url}/v1/completions", json=body, headers=self._headers(rng))
        if r.status_code == 200:
            doc = r.json()
            self.tally.good_tokens += doc["usage"]["completion_tokens"]
            self._compare(body, doc["choices"][0]["text"])
        return r.status_code

    async def sampled(self, http: httpx.AsyncClient, rng: random.Random) -> int:
        body = self._body(rng, temperature=0.8, seed=rng.randrange(1 << 30))
        return (await http.post(f"{self.url}/v1/completions", json=body, headers=self._headers(rng))).status_code

    async def disconnect_stream(self, http: httpx.AsyncClient, rng: random.Random) -> str:
        body = self._body(rng, stream=True, max_tokens=self.max_tokens * 2)
        async with http.stream("POST", f"{self.url}/v1/completions", json=body, headers=self._headers(rng)) as r:
            lines, wanted = 0, rng.randint(1, 3)
            async for _ in r.aiter_lines():
                lines += 1
                if lines >= wanted:
                    break  # leaving the block closes the connection mid-stream
        return "hung up"

    async def abandon_plain(self, http: httpx.AsyncClient, rng: random.Random) -> str:
        try:
            await http.post(f"{self.url}/v1/completions", json=self._body(rng, max_tokens=self.max_tokens * 2),
                            headers=self._headers(rng), timeout=rng.uniform(0.05, 0.5))
        except httpx.TimeoutException:
            return "timed out"
        return "finished first"

    async def bad_json(self, http, rng) -> int:
        return await self._raw(http, rng, b'{"model": "soak-model", "prompt": ')

    async def not_object(self, http, rng) -> int:
        return await self._raw(http, rng, b'["soak-model", "hello"]')

    async def huge_body(self, http, rng) -> int:
        return await self._raw(http, rng, b'{"prompt": "' + b"x" * (5 << 20) + b'"}')

    async def _raw(self, http: httpx.AsyncClient, rng: random.Random, content: bytes) -> int:
        headers = self._headers(rng) | {"content-type": "application/json"}
        return (await http.post(f"{self.url}/v1/completions", content=content, headers=headers)).status_code

    async def _json(self, http: httpx.AsyncClient, rng: random.Random, body: dict, headers: dict | None = None) -> int:
        headers = self._headers(rng) if headers is None else headers
        return (await http.post(f"{self.url}/v1/completions", json=body, headers=headers)).status_code

    async def negative_max_tokens(self, http, rng) -> int:
        return await self._json(http, rng, self._body(rng, max_tokens=-rng.randint(1, 100)))

    async def bad_types(self, http, rng) -> int:
        bad = rng.choice([{"max_tokens": "many"}, {"prompt": 42}, {"temperature": "hot"}, {"stream": [1]},
                          {"prompt": [1, -5, 3]}, {"stop": ["", "x"]}, {"n": 0}, {"logprobs": 6}])
        return await self._json(http, rng, self._body(rng, **bad))

    async def huge_seed(self, http, rng) -> int:
        return await self._json(http, rng, self._body(rng, temperature=0.7, seed=rng.choice([1 << 64, -(1 << 70)])))

    async def unknown_model(self, http, rng) -> int:
        return await self._json(http, rng, self._body(rng, model=rng.choice(["gpt-4", "", "soak-model-2"])))

    async def oversized_prompt(self, http, rng) -> int:
        return await self._json(http, rng, self._body(rng, prompt="y" * (self.context + rng.randint(0, 500))))

    async def over_context(self, http, rng) -> int:
        return await self._json(http, rng, self._body(rng, max_tokens=self.context))

    async def wrong_key(self, http, rng) -> int:
        key = rng.choice(["key-gamma", "key-alph", "KEY-ALPHA", "key-alpha-", "Bearer", "x" * 300])
        return await self._json(http, rng, self._body(rng), {"authorization": f"Bearer {key}"})

    async def no_key(self, http, rng) -> int:
        return await self._json(http, rng, self._body(rng), {})


async def run_load(load: Load, clients: int, seconds: float, seed: int) -> None:
    """`clients` concurrent clients for `seconds`, then every request in flight is let finish (bounded)."""
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits, trust_env=False) as http:
        deadline = time.monotonic() + seconds
        tasks = [asyncio.create_task(load.client(http, random.Random(seed * 1000 + i), deadline))
                 for i in range(clients)]
        await asyncio.wait_for(asyncio.gather(*tasks), seconds + 2 * REQUEST_TIMEOUT_S)


if __name__ == "__main__":
    sys.exit(serve(json.loads(sys.argv[1])))
