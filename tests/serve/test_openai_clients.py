"""What OpenAI clients send and read, against a real server on loopback: LangChain's defaults, usage chunks, models."""

import json

import httpx
import openai
import pytest

from serve_helpers import MODEL, serving


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_langchain_openai_defaults_are_served(model):
    # langchain_openai.OpenAI sends every default on each call, logit_bias as {} (no bias): it was a 422
    with serving(model, "off") as srv:
        got = _client(srv.url).completions.create(
            model=MODEL, prompt=["def f(x):"], temperature=0.7, top_p=1, frequency_penalty=0, presence_penalty=0, n=1,
            logit_bias={}, seed=None, logprobs=None, max_tokens=8)
        # served, not refused: sampled without a seed, the text may end at EOS before max_tokens, even at once
        # (0 tokens, "stop": it did in a clean-clone CI run)
        choice = got.choices[0]
        assert 0 <= got.usage.completion_tokens <= 8 and choice.finish_reason in ("stop", "length")
        assert (choice.finish_reason == "length") == (got.usage.completion_tokens == 8)
        # a bias that would change the text is still refused, by name
        r = httpx.post(f"{srv.url}/v1/completions", json={"model": MODEL, "prompt": "a", "logit_bias": {"50": 5}})
        assert r.status_code == 422 and r.json()["error"]["param"] == "logit_bias", r.text
        assert "not applied" in r.json()["error"]["message"], r.text


def test_include_usage_gives_every_other_chunk_a_null_usage(model):
    # OpenAI: with include_usage, every chunk before the usage chunk carries "usage": null (clients index it)
    body = {"model": MODEL, "prompt": "x = 1", "max_tokens": 6, "temperature": 0, "stream": True}
    with serving(model, "off") as srv:
        for options, want_key in [({"stream_options": {"include_usage": True}}, True), ({}, False)]:
            with httpx.stream("POST", f"{srv.url}/v1/completions", json=body | options, timeout=30) as r:
                chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
            texts = [c for c in chunks if c["choices"]]
            assert texts and all(("usage" in c) == want_key and c.get("usage") is None for c in texts), chunks
            if want_key:
                assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6


def test_the_served_model_can_be_retrieved(model):
    # GET /v1/models/{model} (openai's models.retrieve); an unknown name is a 404 naming the served one
    with serving(model, "off") as srv:
        got = _client(srv.url).models.retrieve(MODEL)
        assert got.id == MODEL and got.object == "model"
        with pytest.raises(openai.NotFoundError, match=MODEL):
            _client(srv.url).models.retrieve("gpt-4")


@pytest.mark.parametrize("prompt, max_tokens", [("x" * 200, 4), ("x" * 100, 40)], ids=["prompt", "with-max-tokens"])
def test_a_request_past_the_context_is_a_bad_request_context_length_exceeded(model, prompt, max_tokens):
    # the prompt alone (200 > 128; was a 413 'prompt_too_long') or with max_tokens: what OpenAI clients look for
    with serving(model, "off") as srv:
        with pytest.raises(openai.BadRequestError, match="context") as err:
            _client(srv.url).completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens)
        assert err.value.body["code"] == "context_length_exceeded", err.value.body


def test_chat_completions_is_refused_saying_what_is_served(model):
    # no chat template: a chat client's 404 says to send the text as a prompt to /v1/completions
    with serving(model, "off") as srv:
        with pytest.raises(openai.NotFoundError, match="/v1/completions") as err:
            _client(srv.url).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
        assert err.value.body["code"] == "not_found"
