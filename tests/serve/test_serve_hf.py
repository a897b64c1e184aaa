"""`met serve --model FOLDER` in its own process answers the openai client with transformers' greedy text."""

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest
from typer.testing import CliRunner

from checkpoint_helpers import checkpoint, hf_greedy
from met.cli import app
from met.model.sources import resolve, tokenizer_for

pytest.importorskip("transformers")

PROMPTS = ["def add(a, b):\n    return", "café 日本語 😀"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(proc: subprocess.Popen, url: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"met serve exited {proc.returncode}: {proc.stderr.read()}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError("met serve did not come up")


def test_met_serve_model_folder_answers_openai_with_transformers_greedy_text(tmp_path):
    # a Qwen2 folder (tied, biased), default spec for a model without MTP (prompt-lookup): plain and streamed
    # answers are transformers' greedy text; token-id prompts above the byte vocabulary are accepted
    folder = tmp_path / "tiny-qwen2"
    hf = checkpoint(folder, "qwen2")
    tok = tokenizer_for(resolve(str(folder)))
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-c", "from met.cli import main; main()", "serve", "--model", str(folder), "--dtype",
         "float64", "--device", "cpu", "--threads", "1", "--port", str(port), "--max-batch", "2",
         "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ | {"PYTHONUNBUFFERED": "1"})
    try:
        _wait_healthy(proc, url)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        assert [m.id for m in client.models.list().data] == ["tiny-qwen2"]
        for prompt in PROMPTS:
            want = tok.decode(hf_greedy(hf, tok.encode(prompt), 24))
            got = client.completions.create(model="tiny-qwen2", prompt=prompt, max_tokens=24, temperature=0)
            assert got.choices[0].text == want
            chunks = client.completions.create(model="tiny-qwen2", prompt=prompt, max_tokens=24, temperature=0,
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
