"""What OpenAI clients send and read, against a real server on loopback: LangChain's defaults, usage chunks, models."""

import json

import httpx
import openai
import pytest

from met.engine.generate import generate
from met.engine.runner import ModelRunner
from met.model.chat_template import EMBEDDED
from met.model.tokenizer import decode, encode
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
        # a bias is applied: +100 on "2" (token 50) makes greedy text all "2"s
        r = httpx.post(f"{srv.url}/v1/completions", json={"model": MODEL, "prompt": "a", "logit_bias": {"50": 100},
                                                          "temperature": 0, "max_tokens": 5})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == "22222", r.text


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


def _greedy(model, prompt: list[int], max_tokens: int) -> str:
    """What `met generate --spec off` prints for a prompt (plain greedy, stops at EOS)."""
    return decode(generate(ModelRunner(model, 1), [prompt], max_tokens, "off")[0].tokens)


CHAT = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def add(a, b):"}]


def test_chat_plain_and_streamed_are_met_generate_on_the_rendered_prompt(model):
    # the embedded template renders the messages; greedy chat text (plain and joined stream) is plain greedy's
    prompt = encode(EMBEDDED.render(CHAT))
    want = _greedy(model, prompt, 24)
    with serving(model, "mtp") as srv:
        client = _client(srv.url)
        got = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=24, temperature=0)
        assert got.object == "chat.completion" and got.choices[0].message.role == "assistant"
        assert got.choices[0].message.content == want and got.usage.prompt_tokens == len(prompt)
        chunks = list(client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=24, temperature=0,
                                                     stream=True, stream_options={"include_usage": True}))
        assert chunks[0].choices[0].delta.role == "assistant"  # the role first, as OpenAI's
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == got.choices[0].finish_reason
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == got.usage.completion_tokens
        logprobs = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4, temperature=0,
                                                  logprobs=True, top_logprobs=2).choices[0].logprobs.content
        assert len(logprobs) == 4 and all(len(t.top_logprobs) == 2 for t in logprobs)
        assert all(t.logprob == t.top_logprobs[0].logprob for t in logprobs)  # greedy: each is the likeliest


def test_completions_logprobs_echo_n_and_prompt_lists(model):
    # logprobs=3, echo with max_tokens=0 (the prompt scored alone), n=2 and two prompts, through the openai client
    with serving(model, "prompt-lookup") as srv:
        client = _client(srv.url)
        got = client.completions.create(model=MODEL, prompt="x = [1, 2", max_tokens=6, temperature=0, logprobs=3)
        lp = got.choices[0].logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == 6
        assert all(3 <= len(top) <= 4 and max(top.values()) == t for top, t in zip(lp.top_logprobs, lp.token_logprobs))
        echo = client.completions.create(model=MODEL, prompt="x = [1, 2", max_tokens=0, echo=True, logprobs=1)
        e = echo.choices[0]
        assert e.text == "x = [1, 2" and e.logprobs.token_logprobs[0] is None and len(e.logprobs.tokens) == 9
        assert e.logprobs.text_offset == list(range(9)) and echo.usage.completion_tokens == 0
        two = client.completions.create(model=MODEL, prompt="def f(x):", max_tokens=5, n=2, temperature=0)
        assert [c.index for c in two.choices] == [0, 1] and two.choices[0].text == two.choices[1].text
        listed = client.completions.create(model=MODEL, prompt=["a = 1\n", "import os\n"], max_tokens=5,
                                           temperature=0)
        assert [c.text for c in listed.choices] == [_greedy(model, encode(p), 5) for p in ["a = 1\n", "import os\n"]]
        assert listed.usage.prompt_tokens == 6 + 10 and listed.usage.completion_tokens == 10


def test_chat_of_a_model_without_a_template_is_a_bad_request_saying_so(model):
    # a checkpoint folder without a chat template: chat is a 400 naming what is missing and what to do
    with serving(model, "off") as srv:
        srv.service.chat = None
        with pytest.raises(openai.BadRequestError, match="no chat template") as err:
            _client(srv.url).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
        assert err.value.body["code"] == "chat_template_missing" and err.value.body["param"] == "messages"
