"""What OpenAI clients send and read, against a real server on loopback: LangChain's defaults, usage chunks, models."""

import httpx
import openai

from serve_helpers import MODEL, serving


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_langchain_openai_defaults_are_served(model):
    # langchain_openai.OpenAI sends every default on each call, logit_bias as {} (no bias): it was a 422
    with serving(model, "off") as srv:
        got = _client(srv.url).completions.create(
            model=MODEL, prompt=["def f(x):"], temperature=0.7, top_p=1, frequency_penalty=0, presence_penalty=0, n=1,
            logit_bias={}, seed=None, logprobs=None, max_tokens=8)
        assert got.usage.completion_tokens == 8
        # a bias that would change the text is still refused, by name
        r = httpx.post(f"{srv.url}/v1/completions", json={"model": MODEL, "prompt": "a", "logit_bias": {"50": 5}})
        assert r.status_code == 422 and r.json()["error"]["param"] == "logit_bias", r.text
        assert "not applied" in r.json()["error"]["message"], r.text

