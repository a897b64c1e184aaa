"""The fields and routes clients send beyond the basics: vLLM's sampling fields, several choices, the tokenizer
routes, HEAD, request ids, ignored fields, latency histograms, the queue bound."""

import json

import httpx

from met.model.tokenizer import EOS, encode
from serve_helpers import MODEL, serving

EOS_FIRST = {"logit_bias": {str(EOS): 100}}  # greedy text would end at once


def _post(url: str, path: str, body: dict, **kw) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=60, **kw)


def _events(url: str, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", f"{url}{path}", json=body | {"stream": True}, timeout=60) as r:
        assert r.status_code == 200, r.read()
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]


def test_eos_fields_min_tokens_ignore_eos_and_stop_strings(model):
    # EOS biased to first place: "stop" at once; min_tokens holds it off for 5; ignore_eos runs to max_tokens
    base = {"model": MODEL, "prompt": "def f(x):", "max_tokens": 8, "temperature": 0}
    with serving(model, "mtp") as srv:
        def ask(**fields):
            doc = _post(srv.url, "/v1/completions", base | fields).json()
            return doc["choices"][0]["finish_reason"], doc["usage"]["completion_tokens"], doc["choices"][0]["text"]

        assert ask(**EOS_FIRST)[:2] == ("stop", 0)
        assert ask(**EOS_FIRST, min_tokens=5)[:2] == ("stop", 5)
        assert ask(**EOS_FIRST, ignore_eos=True)[:2] == ("length", 8)
        full = ask()[2]
        stop = full[3:5]
        assert ask(stop=[stop])[2] == full[: full.index(stop)]
        assert ask(stop=[stop], include_stop_str_in_output=True)[2] == full[: full.index(stop)] + stop


def test_several_choices_stream_each_with_its_index_and_best_of_keeps_the_likeliest(model):
    # chat n=2 streamed: each choice's role first, then its text, which is the plain response's
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "x = 1"}], "max_tokens": 10, "temperature": 0.9,
            "seed": 4, "n": 2}
    with serving(model, "mtp") as srv:
        plain = _post(srv.url, "/v1/chat/completions", chat).json()
        events = _events(srv.url, "/v1/chat/completions", chat)
        for i in (0, 1):
            mine = [e["choices"][0] for e in events if e["choices"][0]["index"] == i]
            assert mine[0]["delta"] == {"role": "assistant", "content": ""}
            assert "".join(c["delta"].get("content", "") for c in mine) == plain["choices"][i]["message"]["content"]
            assert mine[-1]["finish_reason"] == plain["choices"][i]["finish_reason"]
        assert plain["choices"][0]["message"]["content"] != plain["choices"][1]["message"]["content"]  # seed + i
        # best_of 3 returns the candidate of the highest summed log-probability (the candidates are n = 3's)
        body = {"model": MODEL, "prompt": "import", "max_tokens": 6, "temperature": 1.0, "seed": 9, "logprobs": 0}
        three = _post(srv.url, "/v1/completions", body | {"n": 3}).json()["choices"]
        best = _post(srv.url, "/v1/completions", body | {"best_of": 3}).json()["choices"]
        sums = [sum(c["logprobs"]["token_logprobs"]) for c in three]
        assert len(best) == 1 and best[0]["text"] == three[sums.index(max(sums))]["text"]


def test_streamed_usage_echo_and_speculation_counts(model):
    # continuous_usage_stats: a usage on every chunk, growing; the last carries the speculation counts
    body = {"model": MODEL, "prompt": "aaaa aaaa aaaa", "max_tokens": 12, "temperature": 0,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    with serving(model, "prompt-lookup") as srv:
        events = _events(srv.url, "/v1/completions", body)
        counts = [e["usage"]["completion_tokens"] for e in events]
        assert all(e["usage"] is not None for e in events) and counts == sorted(counts) and counts[-1] == 12
        final = events[-1]["usage"]["speculation"]
        assert final["draft_tokens"] >= final["accepted_tokens"] > 0
        # echo streamed with logprobs: the first chunk is the prompt, its first token's figures null
        echo = _events(srv.url, "/v1/completions", {"model": MODEL, "prompt": "ab", "max_tokens": 2, "echo": True,
                                                     "logprobs": 1, "temperature": 0})
        first = echo[0]["choices"][0]
        assert first["text"] == "ab" and first["logprobs"]["token_logprobs"][0] is None
        assert len(first["logprobs"]["tokens"]) == 2


def test_tokenizer_routes_head_request_ids_openapi_and_ignored_fields(model):
    with serving(model, "off") as srv:
        url = srv.url
        tok = _post(url, "/tokenize", {"prompt": "hé"}).json()
        assert tok == {"count": 3, "max_model_len": 128, "tokens": encode("hé"), "token_strs": None}
        chat = _post(url, "/tokenize", {"messages": [{"role": "user", "content": "hi"}]}).json()
        assert chat["tokens"] == encode("# user:\nhi\n# assistant:\n")
        assert _post(url, "/detokenize", {"tokens": encode("hé")}).json() == {"prompt": "hé"}
        bad = _post(url, "/detokenize", {"tokens": [999]})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
        info = httpx.get(f"{url}/tokenizer_info").json()
        assert info["vocab_size"] == 258 and info["eos_token_ids"] == [EOS] and "assistant" in info["chat_template"]
        head = httpx.head(f"{url}/health")
        assert head.status_code == 200 and head.content == b""  # HEAD on every GET route
        assert httpx.head(f"{url}/v1/models").status_code == 200
        assert httpx.get(f"{url}/health", headers={"x-request-id": "abc-1"}).headers["x-request-id"] == "abc-1"
        assert len(httpx.get(f"{url}/health").headers["x-request-id"]) == 32  # one made up
        paths = httpx.get(f"{url}/openapi.json").json()["paths"]
        assert {"/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"} <= set(paths)
        assert httpx.get(f"{url}/docs").status_code == 200
        # a field met does not apply is served and named; a known field of the wrong type is a 400 naming it
        r = _post(url, "/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": 2, "response_format": {},
                                           "guided_choice_x": 1})
        assert r.status_code == 200 and r.headers["x-met-ignored-fields"] == "guided_choice_x, response_format"
        r = _post(url, "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "a"}],
                                                "top_logprobs": "2"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "top_logprobs", r.text
        assert r.json()["error"]["type"] == "invalid_request_error"


def test_latency_histograms_and_a_full_queue(model):
    # TTFT, inter-token and end-to-end histograms count each choice; past max_in_flight a request is a 429
    with serving(model, "off") as srv:
        _post(srv.url, "/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": 5, "n": 2, "temperature": 0})
        text = httpx.get(f"{srv.url}/metrics").text
        for name in ("met_time_to_first_token_seconds", "met_e2e_request_latency_seconds"):
            assert f"{name}_count 2.0" in text, name
        assert "met_inter_token_latency_seconds_count 8.0" in text  # 4 intervals of each choice
        srv.service.max_in_flight = 1
        r = _post(srv.url, "/v1/completions", {"model": MODEL, "prompt": "a", "n": 2})
        assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
