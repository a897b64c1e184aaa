"""`met serve --model FOLDER` in its own process answers the openai client with transformers' greedy text."""

import os
import signal
import subprocess
import sys

import openai
import pytest
from typer.testing import CliRunner

from checkpoint_helpers import checkpoint, hf_greedy
from met.cli import app
from met.model.sources import resolve, tokenizer_for
from serve_process import free_port, wait_healthy

transformers = pytest.importorskip("transformers")

PROMPTS = ["def add(a, b):\n    return", "café 日本語 😀"]


@pytest.mark.parametrize("family, overrides", [("qwen2", {}), ("qwen3", {"head_dim": 16})])
def test_met_serve_model_folder_answers_openai_with_transformers_greedy_text(tmp_path, family, overrides):
    # a Qwen2 folder (tied, biased) and a Qwen3 one (q/k norms, heads 16 wide), default spec for a model without
    # MTP (prompt-lookup): plain and streamed answers are transformers' greedy text; token-id prompts above the
    # byte vocabulary are accepted
    name = f"tiny-{family}"
    folder = tmp_path / name
    hf = checkpoint(folder, family, **overrides)
    tok = tokenizer_for(resolve(str(folder)))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-c", "from met.cli import main; main()", "serve", "--model", str(folder), "--dtype",
         "float64", "--device", "cpu", "--threads", "1", "--port", str(port), "--max-batch", "2",
         "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ | {"PYTHONUNBUFFERED": "1"})
    try:
        wait_healthy(proc, url)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        assert [m.id for m in client.models.list().data] == [name]
        for prompt in PROMPTS:
            want = tok.decode(hf_greedy(hf, tok.encode(prompt), 24))
            got = client.completions.create(model=name, prompt=prompt, max_tokens=24, temperature=0)
            assert got.choices[0].text == want
            chunks = client.completions.create(model=name, prompt=prompt, max_tokens=24, temperature=0,
                                               stream=True)
            assert "".join(c.choices[0].text for c in chunks if c.choices) == want
        ids = [300, 301, 5]
        got = client.completions.create(model=str(folder), prompt=ids, max_tokens=8, temperature=0)
        assert got.choices[0].text == tok.decode(hf_greedy(hf, ids, 8))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert "spec prompt-lookup" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_refuses_mtp_and_unsupported_folders(tmp_path):
    # --spec mtp on a folder: usage error; an unsupported architecture: 65 with its name; nothing is served
    checkpoint(tmp_path / "m")
    result = CliRunner().invoke(app, ["serve", "--model", str(tmp_path / "m"), "--spec", "mtp"])
    assert result.exit_code == 2 and "has no MTP module" in result.stderr
    (tmp_path / "m" / "config.json").write_text(
        (tmp_path / "m" / "config.json").read_text().replace("LlamaForCausalLM", "GemmaForCausalLM"))
    result = CliRunner().invoke(app, ["serve", "--model", str(tmp_path / "m")])
    assert result.exit_code == 65 and "architecture GemmaForCausalLM is not supported" in result.stderr


CHATML = ("{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
          "{% if add_generation_prompt %}<s>assistant\n{% endif %}")


def test_chat_on_a_folder_is_transformers_greedy_on_its_template_and_stops_at_its_end_of_turn(tmp_path):
    # the folder's template (tokenizer_config.json), rendered and tokenized as transformers does; the greedy
    # chat text is transformers' greedy text on those ids; the template's eos_token ends the turn
    import json

    import torch
    from fastapi.testclient import TestClient

    from met.engine.policy import PolicyConfig
    from met.model.chat_template import template_for
    from met.model.sources import load_source
    from met.serve.app import Service, create_app

    folder = tmp_path / "chat-qwen2"
    hf = checkpoint(folder, "qwen2")
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHATML, "bos_token": "<s>",
        "eos_token": "<s>"}))  # id 0: an end of turn that is not the model's EOS (id 1)
    source = load_source(str(folder), torch.float64)
    service = Service.build(source.model, source.recipe.id, ("tiny",), PolicyConfig("prompt-lookup"), 2,
                            tokenizer=source.tokenizer, chat=template_for(source.recipe))
    messages = [{"role": "user", "content": "def add(a, b):"}]
    ids = transformers.AutoTokenizer.from_pretrained(str(folder)).apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    with TestClient(create_app(service)) as client:
        got = client.post("/v1/chat/completions", json={"model": "tiny", "messages": messages, "max_tokens": 12,
                                                         "temperature": 0}).json()
        assert got["usage"]["prompt_tokens"] == len(ids)
        want = hf_greedy(hf, ids, 12)
        assert got["choices"][0]["message"]["content"] == source.tokenizer.decode(want[: want.index(0)] if 0 in want
                                                                                   else want)
        body = {"model": "tiny", "messages": messages, "max_tokens": 12, "temperature": 0, "logit_bias": {"0": 100}}
        ended = client.post("/v1/chat/completions", json=body).json()
        assert ended["choices"][0]["finish_reason"] == "stop" and ended["usage"]["completion_tokens"] == 0
        # a completion is no turn: the same bias runs on (id 0 is not the tokenizer's EOS)
        plain = client.post("/v1/completions", json={"model": "tiny", "prompt": ids, "max_tokens": 4,
                                                      "temperature": 0, "logit_bias": {"0": 100}}).json()
        assert plain["usage"]["completion_tokens"] == 4
        assert client.get("/tokenizer_info").json()["eos_token"] == "<s>"
