"""The HTTP API against a real server on loopback: the openai client, exact greedy text, batching, errors."""

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from met.engine.generate import generate
from met.engine.runner import ModelRunner
from met.model.tokenizer import decode, encode
from serve_helpers import MODEL, Slow, serving, settled

PROMPTS = ["def add(a, b):\n", "import os\nimport sys\n", "class Stack:\n    def __init__(self):", "x = [1, 2, 3]"]


def _greedy(model, prompt: str, max_tokens: int) -> str:
    """What `met generate --spec off` prints for the prompt (plain greedy, stops at EOS)."""
    return decode(generate(ModelRunner(model, 1), [encode(prompt)], max_tokens, "off")[0].tokens)


def _client(url: str, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)


def test_openai_client_plain_and_streamed_equal_plain_greedy(model):
    # speculation on (mtp): the plain response and the joined stream are both plain greedy's text
    with serving(model, "mtp") as srv:
        client = _client(srv.url)
        for prompt in PROMPTS[:2]:
            want = _greedy(model, prompt, 40)
            got = client.completions.create(model=MODEL, prompt=prompt, max_tokens=40, temperature=0)
            assert got.choices[0].text == want
            assert got.usage.prompt_tokens == len(encode(prompt)) and got.usage.completion_tokens == 40
            assert got.choices[0].finish_reason == "length" and got.object == "text_completion"
            chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=40, temperature=0,
                                                    stream=True, stream_options={"include_usage": True}))
            assert "".join(c.choices[0].text for c in chunks if c.choices) == want
            assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
            assert chunks[-1].usage.completion_tokens == 40


@pytest.mark.parametrize("spec", ["mtp", "prompt-lookup"])
def test_alone_and_inside_a_batch_of_16_give_the_same_text(model, spec):
    # 16 concurrent requests through 8 slots (continuous batching, widths up to 8): each equals its solo text
    prompts = [PROMPTS[i % 4] + "#" * (i // 4) for i in range(16)]
    with serving(model, spec, max_batch=8) as srv:
        client = _client(srv.url)

        def ask(prompt: str) -> str:
            return client.completions.create(model=MODEL, prompt=prompt, max_tokens=32, temperature=0).choices[0].text

        alone = ask(prompts[5])
        with ThreadPoolExecutor(16) as pool:
            together = list(pool.map(ask, prompts))
        assert settled(srv.scheduler, lambda s: s.finished == (("length", 17),)).finished == (("length", 17),)
    assert together[5] == alone
    assert together == [_greedy(model, p, 32) for p in prompts]


def test_stop_string_ends_the_text_before_it(model):
    # a stop string taken from the greedy text: the response is the text before its first occurrence
    full = _greedy(model, PROMPTS[0], 40)
    stop = full[12:15]
    with serving(model, "mtp") as srv:
        got = _client(srv.url).completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=40, temperature=0,
                                                  stop=[stop])
    assert got.choices[0].text == full[: full.index(stop)] and got.choices[0].finish_reason == "stop"


def _post(url: str, body, key: str | None = None) -> httpx.Response:
    headers = {"content-type": "application/json"} | ({"authorization": f"Bearer {key}"} if key else {})
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{url}/v1/completions", content=content, headers=headers, timeout=30)


def test_bad_requests_get_their_4xx_and_never_reach_the_scheduler(model):
    # each refusal is OpenAI-shaped with a clear message; the scheduler sees none of them
    good = {"model": MODEL, "prompt": "hi", "max_tokens": 4, "temperature": 0}
    cases = [
        (b"{not json", "k1", 400, "not valid JSON"),  # bad JSON
        (b"[1, 2]", "k1", 400, "JSON object, got an array"),  # JSON, but not an object
        (b"null", "k1", 400, "JSON object, got null"),  # in JSON's words, not Python's NoneType
        (good | {"max_tokens": -3}, "k1", 400, "max_tokens"),  # negative max_tokens (every invalid field: a 400)
        (good | {"max_tokens": 0}, "k1", 400, "only useful with echo"),  # nothing to generate, nothing to score
        (good | {"n": 2, "best_of": 1}, "k1", 400, "at least n"),  # best_of below n
        (good | {"logit_bias": {"999": 1}}, "k1", 400, "outside the vocabulary"),  # a bias of no token
        (good | {"top_k": "5"}, "k1", 400, "top_k"),  # a vLLM field of the wrong type stays refused
        (good | {"temperature": 7}, "k1", 400, "temperature"),  # out of range
        (good | {"prompt": ""}, "k1", 400, "prompt"),  # empty prompt
        (good | {"logprobs": 6}, "k1", 400, "logprobs"),  # OpenAI takes 0..5
        (good | {"temperature": 0.5, "seed": 2**64}, "k1", 400, "seed"),  # a seed torch cannot take (was a 500)
        (good | {"max_tokens": "4"}, "k1", 400, "max_tokens"),  # a string is not a number (strict, as OpenAI)
        (good | {"max_tokens": True}, "k1", 400, "max_tokens"),  # nor a bool
        (good | {"stream": "yes"}, "k1", 400, "stream"),  # nor a string a bool
        (good | {"stream_options": {"include_usage": True}}, "k1", 400, "only allowed when stream"),
        (good | {"stream": True, "stream_options": {"include_usage": "yes"}}, "k1", 400, "include_usage"),  # (was on)
        (good | {"n": True}, "k1", 400, "n: Input should be a valid integer"),  # == 1, yet no integer (was served)
        (good | {"n": 1.0}, "k1", 400, "n: Input should be a valid integer"),  # (was served)
        (good | {"echo": 0}, "k1", 400, "echo: Input should be a valid boolean"),  # == false (was served)
        (good | {"presence_penalty": False}, "k1", 400, "presence_penalty"),  # (was served)
        (good | {"prompt": "\ud800abc"}, "k1", 400, "not valid Unicode"),  # a lone surrogate (was a 500)
        (good | {"stop": ["\n", "\ud83d"]}, "k1", 400, "not valid Unicode"),  # half an emoji (was a stop never met)
        (b'{"prompt": "a", "seed": ' + b"9" * 5000 + b"}", "k1", 400, "4300 digits"),  # (was a 500)
        (b'{"prompt": "a", "temperature": NaN}', "k1", 400, "NaN is not a JSON number"),  # (was 'at most 2')
        (b'{"prompt": "a", "top_p": -Infinity}', "k1", 400, "-Infinity is not"),  # (was 'greater than 0')
        (b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "k1", 400, "recursion"),  # (was a 500)
        (good | {"model": "gpt-4"}, "k1", 404, "gpt-4"),  # unknown model
        (good | {"prompt": "x" * 200}, "k1", 400, "200 tokens"),  # longer than the context (128; was a 413)
        (good | {"max_tokens": 127}, "k1", 400, "at most 126"),  # prompt + max_tokens over the context
        (good, None, 401, "no API key"),  # missing key
        (good, "wrong", 401, "not valid"),  # wrong key
    ]
    with serving(model, "off", keys={"k1": "alice"}) as srv:
        for body, key, status, words in cases:
            r = _post(srv.url, body, key)
            err = r.json()["error"]
            assert r.status_code == status and words in err["message"], (body, r.status_code, err)
            assert set(err) >= {"message", "type", "code"}
        assert srv.scheduler.cell.latest().finished == ()  # nothing reached it
        assert _post(srv.url, good, "k1").json()["usage"]["completion_tokens"] == 4
        with pytest.raises(openai.NotFoundError):
            _client(srv.url, "k1").completions.create(model="nope", prompt="hi", max_tokens=2)
        with pytest.raises(openai.AuthenticationError):
            _client(srv.url, "bad").completions.create(model=MODEL, prompt="hi", max_tokens=2)


def test_unknown_paths_and_methods_get_openai_shaped_errors_and_every_status_is_counted(model):
    # 404 and 405 in OpenAI's shape (FastAPI's own is {"detail": ...}); a trailing slash is a 404, not a redirect;
    # a bug's 500 is OpenAI-shaped too, and /metrics counts it though the error middleware answers it
    with serving(model, "off") as srv:
        for method, path, status in [("GET", "/v1/nope", 404), ("GET", "/v1/completions", 405),
                                     ("POST", "/v1/models", 405), ("POST", "/v1/completions/", 404)]:
            r = httpx.request(method, f"{srv.url}{path}", json={}, timeout=30)
            assert r.status_code == status, (method, path, r.status_code)
            assert path in r.json()["error"]["message"], r.json()

        def broken(req, sink):
            raise RuntimeError("a bug")

        srv.scheduler.submit = broken
        r = _post(srv.url, {"model": MODEL, "prompt": "hi"})
        assert r.status_code == 500 and r.json()["error"]["code"] == "internal_error"
        text = httpx.get(f"{srv.url}/metrics").text
        assert 'met_http_responses_total{code="500"} 1.0' in text and 'code="405"} 2.0' in text


def test_a_client_leaving_mid_stream_frees_its_slot(model):
    # read one chunk of a long stream, hang up: the request is cancelled and its slot is free at once
    with serving(model, policy=Slow(), max_batch=2) as srv:
        body = {"model": MODEL, "prompt": "hello", "max_tokens": 100, "stream": True, "temperature": 0}
        with httpx.stream("POST", f"{srv.url}/v1/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()  # keep the iterator: dropping it closes the connection
            next(lines)
            assert settled(srv.scheduler, lambda s: s.active == 1).active == 1
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and srv.scheduler.cell.latest().active:
            time.sleep(0.02)
        snap = srv.scheduler.cell.latest()
        assert snap.active == 0 and dict(snap.finished) == {"cancelled": 1}
        assert sorted(srv.scheduler.free_slots) == [0, 1]


def test_a_client_leaving_before_a_plain_response_frees_its_slot(model):
    # a non-streamed request whose client times out: the server notices within a poll and cancels it
    with serving(model, policy=Slow(), max_batch=2) as srv:
        body = {"model": MODEL, "prompt": "hello", "max_tokens": 100, "temperature": 0}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{srv.url}/v1/completions", json=body, timeout=0.3)
        snap = settled(srv.scheduler, lambda s: s.finished, timeout=3.0)
        assert dict(snap.finished) == {"cancelled": 1} and snap.active == 0


def test_a_client_leaving_while_its_body_is_read_is_no_500(model):
    # headers and half a body, then hang up: no 500 counted (and no traceback logged), the next request served
    with serving(model, "off") as srv:
        host, port = srv.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                         b"content-length: 100\r\n\r\n{\"model\": ")
            time.sleep(0.2)  # the handler is reading the body when the client leaves
        time.sleep(0.2)
        assert _post(srv.url, {"model": MODEL, "prompt": "hi", "max_tokens": 2}).status_code == 200
        assert 'code="500"' not in httpx.get(f"{srv.url}/metrics").text


def test_models_health_metrics_snapshot(model):
    # the read-only endpoints: names, liveness, Prometheus text with the spec metrics, the snapshot as JSON
    with serving(model, "mtp") as srv:
        _client(srv.url).completions.create(model=MODEL, prompt="a = 1", max_tokens=8, temperature=0)
        assert [m.id for m in _client(srv.url).models.list().data] == [MODEL]
        assert httpx.get(f"{srv.url}/health").json()["status"] == "ok"
        text = httpx.get(f"{srv.url}/metrics").text
        for name in ("met_spec_drafts_total", "met_spec_draft_tokens_total", "met_spec_accepted_tokens_total",
                     "met_spec_accepted_tokens_per_pos_total{position=\"0\"}", "met_step_seconds_total{mode=",
                     "met_planned_depth", 'met_http_responses_total{code="200"}'):
            assert name in text, name
        settled(srv.scheduler, lambda s: s.finished)
        snap = httpx.get(f"{srv.url}/v1/snapshot").json()
        assert snap["spec"] == "mtp" and snap["emitted_tokens"] >= 8 and snap["finished"] == {"length": 1}


def test_sampling_with_a_seed_is_reproducible(model):
    # temperature > 0 through the API: the same seed gives the same text (plain decode: one random draw per token)
    with serving(model, "off") as srv:
        client = _client(srv.url)
        texts = [client.completions.create(model=MODEL, prompt="x", max_tokens=12, temperature=0.9, seed=3)
                 .choices[0].text for _ in range(2)]
    assert texts[0] == texts[1]
