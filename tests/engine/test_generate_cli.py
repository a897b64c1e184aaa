"""`met generate`'s bad options and prompts: exit 2 or 65 with the value named, never a traceback."""

import json

import pytest
import torch
from typer.testing import CliRunner

from met.cli import app
from met.exit_codes import EX_DATAERR

runner = CliRunner()


@pytest.mark.parametrize(("args", "words"), [
    (["--device", "bogus"], "--device 'bogus' is not a torch device"),  # was a RuntimeError traceback
    (["--dtype", "int8"], "--dtype 'int8' is not one of float32"),  # weights cannot be int8
    (["--top-p", "0"], "--top-p 0 keeps no token"),  # was a ValueError from Sampling
    (["--temperature", "1e308"], "--temperature"),  # overflowed the softmax
    (["--seed", str(1 << 70)], "--seed"),  # torch.Generator takes 64 bits
    (["--batch", "1000000"], "--batch"),  # would allocate every slot's KV cache up front
    (["--threads", "100000"], "--threads"),  # crashed the process
    (["--prompt", "\udcff\udcfe"], "--prompt is not valid Unicode text"),  # argv bytes that are not UTF-8
    (["--spec", "mtp", "--drafter", "nope"], "--spec mtp would not use it"),  # was silently ignored
    (["--max-len", "1"], "--max-len 1 is not a context"),  # no room for a prompt and a token
    (["--max-len", "5000"], "--max-len 5000 is not a context met-tiny-py can run: 2..1024"),  # was cut silently
    (["--lookup-min-ngram", "5"], "--lookup-min-ngram"),  # the lookup index holds 1..4-grams
], ids=["device", "dtype", "top-p", "temperature", "seed", "batch", "threads", "prompt", "drafter", "max-len-1",
        "max-len-past-context", "lookup-min-ngram"])
def test_bad_options_exit_2_naming_the_value(args, words):
    argv = ["generate", "--max-tokens", "2", *args] + ([] if "--prompt" in args else ["--prompt", "x"])
    result = runner.invoke(app, argv)
    assert result.exit_code == 2 and words in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this box has CUDA")
def test_cuda_without_a_gpu_exits_2():
    result = runner.invoke(app, ["generate", "--prompt", "x", "--device", "cuda"])
    assert result.exit_code == 2 and "torch sees no CUDA device here; pass --device cpu" in result.output


def test_a_prompts_file_with_a_lone_surrogate_exits_65_naming_the_line(tmp_path):
    # JSON's "\ud800" escape is valid JSON but no text: refused with file:line, not a UnicodeEncodeError
    f = tmp_path / "p.jsonl"
    f.write_text('"fine"\n{"prompt": "\\ud800"}\n')
    result = runner.invoke(app, ["generate", "--prompts", str(f)])
    assert result.exit_code == EX_DATAERR and f"{f}:2: is not valid Unicode text" in result.output
    result = runner.invoke(app, ["generate", "--prompts", str(tmp_path)])
    assert result.exit_code == EX_DATAERR and "is a folder" in result.output


def test_the_context_check_counts_no_drafts_and_runs_before_any_prompt(tmp_path):
    # drafts are clamped to the room left, so a prompt + max_tokens that fits runs under every spec (was
    # refused with --depth added even for --spec off); a file's too-long prompt is refused before any output
    result = runner.invoke(app, ["generate", "--prompt", "x", "--max-tokens", "1024"])
    assert result.exit_code == 2 and "ask for at most 1023" in result.output
    f = tmp_path / "p.jsonl"
    f.write_text('"short"\n"' + "y" * 1020 + '"\n')
    result = runner.invoke(app, ["generate", "--prompts", str(f), "--max-tokens", "8"])
    assert result.exit_code == 2 and f"{f} prompt 2: 1020 tokens" in result.output
    assert result.stdout == ""  # the first prompt did not run either


def test_json_has_no_rate_without_a_decode_step():
    # at --max-tokens 1 the token comes from prefill: no decode time to divide by (was millions of tok/s)
    import json
    result = runner.invoke(app, ["generate", "--prompt", "x", "--max-tokens", "1", "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["tokens_per_s"] is None


def test_lookup_min_ngram_drafts_less_and_keeps_the_text():
    # a prompt that repeats single letters but no longer runs: 1-token matches draft, 4-token ones rarely
    def run(n: str) -> dict:
        result = runner.invoke(app, ["generate", "--prompt", "a b c d a e f a", "--max-tokens", "24", "--spec",
                                     "prompt-lookup", "--lookup-min-ngram", n, "--json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    loose, strict = run("1"), run("4")
    assert strict["text"] == loose["text"] and strict["drafts_proposed"] < loose["drafts_proposed"]


def test_json_rate_of_a_batched_prompt_is_over_its_own_decode_time(tmp_path, monkeypatch):
    # a clock that moves one second per verify step: a prompt's decode time is the steps it took part in.
    # At --batch 2 the repetitive prompt finishes in a third of the other's steps; its rate was divided by
    # the whole batch's decode time, so both prompts reported the slower one's rate
    from types import SimpleNamespace

    import met.engine.generate as gen
    from met.engine.runner import ModelRunner

    clock = SimpleNamespace(t=0.0)
    monkeypatch.setattr(gen, "time", SimpleNamespace(perf_counter=lambda: clock.t))
    verify = ModelRunner.verify

    def ticking(self, slots, drafts):
        clock.t += 1.0
        return verify(self, slots, drafts)

    monkeypatch.setattr(ModelRunner, "verify", ticking)
    f = tmp_path / "p.jsonl"
    f.write_text('"import os\\nimport sys\\n"\n"for i in range(10):\\n    print(i)\\nfor i in range(10):\\n    "\n')
    result = runner.invoke(app, ["generate", "--prompts", str(f), "--max-tokens", "24", "--spec", "prompt-lookup",
                                 "--batch", "2", "--json"])
    assert result.exit_code == 0, result.output
    recs = [json.loads(line) for line in result.stdout.splitlines()]
    assert recs[0]["steps"] < recs[1]["steps"]
    # the decode steps' tokens: all but the first, which the prefill chose
    assert [r["tokens_per_s"] for r in recs] == [round((r["tokens"] - 1) / r["steps"], 2) for r in recs]


@pytest.mark.parametrize(("dtype", "spec", "warned"), [
    ("bfloat16", "mtp", True), ("float16", "prompt-lookup", True),  # a verify's rounding may flip a near tie
    ("bfloat16", "off", False), ("float32", "mtp", False)])
def test_speculation_in_half_precision_warns_that_greedy_text_can_change(dtype, spec, warned):
    # on an H200 in bf16 the policies benchmark's greedy texts under speculation differed from plain decode's
    result = runner.invoke(app, ["generate", "--prompt", "def f(x):\n    return ", "--max-tokens", "4",
                                 "--dtype", dtype, "--spec", spec])
    assert result.exit_code == 0, result.output
    assert ("greedy text can differ from --spec off" in result.stderr) is warned
    assert "--dtype float32 keeps it identical" in result.stderr or not warned
