"""`met serve --spec draft --draft-model NAME|PATH`: greedy text as transformers', drafts counted as mode draft, and
every refusal (options, tokenizer, vocabulary, context, tables) before the port is bound or a model loads."""

import json
import os
import signal
import subprocess
import sys

import httpx
import pytest
from typer.testing import CliRunner

from boot_tables import BOX, calibration, serve_key, settings, table
from checkpoint_helpers import checkpoint, hf_greedy
from met.cli import app
from met.engine.identity import DRAFT_MODEL_MODES, draft_model_config, draft_model_drafter_key, serve_table_key
from met.engine.policy import DRAFT_DEPTH, PolicyConfig, build_policy
from met.engine.policy_mtp import MtpLadderPolicy, MtpPlannedPolicy
from met.exit_codes import EX_CONFIG, EX_DATAERR
from met.model.recipes import Recipe
from met.model.sources import resolve, tokenizer_for
from met.speculative.spec_cost import SpecCostState
from serve_process import free_port, wait_healthy

pytest.importorskip("transformers")  # checkpoint() saves the folders through it

PROMPT = "def add(a, b):\n    return"
CHATML = ("{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
          "{% if add_generation_prompt %}<s>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A Qwen3 target with a chat template, a one-layer Qwen3 draft model of the same tokenizer.json, the target's HF
    model."""
    root = tmp_path_factory.mktemp("draft-serve")
    target, small = root / "Q3", root / "Q3SMALL"
    hf = checkpoint(target, "qwen3", head_dim=16)
    checkpoint(small, "qwen3", seed=1, num_hidden_layers=1, head_dim=16)
    (target / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHATML, "bos_token": "<s>",
        "eos_token": "</s>"}))  # the turn ends at the model's EOS (id 1)
    return target, small, hf


@pytest.fixture
def no_load(monkeypatch):
    """Any model load or server start fails the test: these refusals come before both."""
    monkeypatch.setattr(Recipe, "load", lambda *a, **k: pytest.fail("the model must not load"))
    monkeypatch.setattr("met.serve.server.check_bind", lambda *a, **k: pytest.fail("the port must not be bound"))
    monkeypatch.setattr("met.serve.server.run", lambda *a, **k: pytest.fail("the server must not start"))


def test_a_draft_model_serves_transformers_greedy_text_and_its_drafts_are_counted(folders):
    # completions (plain and streamed) and a chat through the target's template are transformers' greedy text on
    # the target; the draft model proposed drafts, counted under mode "draft" in /metrics and /v1/snapshot
    import transformers

    openai = pytest.importorskip("openai")
    target, small, hf = folders
    tok = tokenizer_for(resolve(str(target)))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-c", "from met.cli import main; main()", "serve", "--model", str(target), "--draft-model",
         str(small), "--spec", "draft", "--dtype", "float64", "--device", "cpu", "--threads", "1", "--port",
         str(port), "--max-batch", "2", "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ | {"PYTHONUNBUFFERED": "1"})
    try:
        wait_healthy(proc, url)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        want = tok.decode(hf_greedy(hf, tok.encode(PROMPT), 24))
        got = client.completions.create(model="Q3", prompt=PROMPT, max_tokens=24, temperature=0)
        assert got.choices[0].text == want
        chunks = client.completions.create(model="Q3", prompt=PROMPT, max_tokens=24, temperature=0, stream=True)
        assert "".join(c.choices[0].text for c in chunks if c.choices) == want
        messages = [{"role": "user", "content": "def add(a, b):"}]
        ids = transformers.AutoTokenizer.from_pretrained(str(target)).apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        chat = client.chat.completions.create(model="Q3", messages=messages, max_tokens=16, temperature=0)
        assert chat.usage.prompt_tokens == len(ids)
        assert chat.choices[0].message.content == tok.decode(hf_greedy(hf, ids, 16))
        snap = httpx.get(f"{url}/v1/snapshot").json()
        assert snap["spec"] == "draft" and snap["mode_steps"].get("draft", 0) > 0, snap
        assert snap["drafts_proposed"] > 0 and snap["drafted"] >= snap["drafts_proposed"]
        metrics = httpx.get(f"{url}/metrics").text
        assert 'met_steps_total{mode="draft"}' in metrics
        drafted = [line for line in metrics.splitlines() if line.startswith("met_spec_draft_tokens_total ")]
        assert drafted and float(drafted[0].split()[1]) == snap["drafts_proposed"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        err = proc.stderr.read()
        assert "spec draft," in err and "drafting with the draft model Q3SMALL@" in err
        assert f"up to {DRAFT_DEPTH} drafts a step" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_draft_model_of_another_tokenizer_exits_65_naming_both(folders, no_load):
    # the embedded recipe speaks bytes, the folder its BPE: refused before the port is bound or a model loads
    target, _, _ = folders
    r = CliRunner().invoke(app, ["serve", "--model", str(target), "--spec", "draft", "--draft-model", "met-tiny-py"])
    assert r.exit_code == EX_DATAERR, r.output
    assert "draft model met-tiny-py has tokenizer byte, the target Q3 has hf-" in r.stderr
    assert "Traceback" not in r.output


def test_a_draft_model_of_another_vocabulary_exits_65_naming_both(folders, no_load, tmp_path):
    # the same tokenizer.json over a wider embedding: the ids would not mean the same
    target, _, _ = folders
    vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    checkpoint(tmp_path / "wide", "qwen3", num_hidden_layers=1, head_dim=16, vocab_size=vocab + 8)
    r = CliRunner().invoke(app, ["serve", "--model", str(target), "--spec", "draft", "--draft-model",
                                 str(tmp_path / "wide")])
    assert r.exit_code == EX_DATAERR, r.output
    assert f"draft model wide has a vocabulary of {vocab + 8} tokens, the target Q3 of {vocab}" in r.stderr


@pytest.mark.parametrize("args, words", [
    (["--spec", "draft"], "drafts with --draft-model: give both or neither"),  # nothing to draft with
    (["--draft-model", "{small}"], "drafts with --draft-model: give both or neither"),  # unused
    (["--spec", "prompt-lookup", "--draft-model", "{small}"], "give both or neither"),  # another drafter's spec
    (["--spec", "mtp", "--draft-depth", "2"], "mtp+draft and eagle only"),  # a depth nothing would use
    (["--spec", "ngram", "--spec-cost-model", "measured"], "mtp+draft or --spec-cost-model static"),  # no planner
], ids=["spec-alone", "draft-model-alone", "other-spec", "depth-alone", "measured-hint"])
def test_draft_options_without_each_other_exit_2(folders, no_load, args, words):
    target, small, _ = folders
    r = CliRunner().invoke(app, ["serve", "--model", str(target), *(a.format(small=small) for a in args)])
    assert r.exit_code == 2 and words in r.output, r.output


def test_a_draft_model_of_a_shorter_context_exits_2_with_the_max_len_to_pass(folders, no_load, tmp_path):
    # its cache could not hold what the target's does; the serve says which --max-len fits both
    target, _, _ = folders
    checkpoint(tmp_path / "short", "qwen3", num_hidden_layers=1, head_dim=16, max_position_embeddings=64)
    args = ["serve", "--model", str(target), "--spec", "draft", "--draft-model", str(tmp_path / "short")]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2 and "short's context of 64 tokens is shorter than the serve's 256" in r.output, r.output
    assert "--max-len 64 or less" in r.output


def _draft_key(recipe):
    """This serve's key drafting with the recipe itself as its draft model (--box-class test-box --energy none)."""
    return serve_table_key(recipe.id, recipe.config, settings(), "none", DRAFT_MODEL_MODES, BOX,
                           draft_model_config(recipe))


def test_measured_draft_boots_on_the_draft_models_table_and_refuses_the_mtp_one(micro_embedded, tmp_path,
                                                                               monkeypatch):
    # micro-t drafting for itself: its draft-model table and calibration boot the planner; the MTP table of the
    # same recipe is another key (its draft_model mode was never measured): 78
    recipe = micro_embedded[1]
    monkeypatch.setattr("met.serve.server.run", lambda *a, **k: 0)
    args = ["serve", "--model", "micro-t", "--spec", "draft", "--draft-model", "micro-t", "--spec-cost-model",
            "measured", "--spec-cost-table", str(tmp_path / "t.toml"), "--box-class", BOX, "--energy", "none",
            "--port", "0"]
    (tmp_path / "t.calibration.toml").write_text(calibration(draft_model_drafter_key(recipe)).to_toml())
    (tmp_path / "t.toml").write_text(table(_draft_key(recipe)).to_toml())
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "spec draft/measured" in r.stderr and f"drafting with the draft model {recipe.id}" in r.stderr
    assert "planning from" in r.stderr and "draft-model drafts only" in r.stderr
    (tmp_path / "t.toml").write_text(table(serve_key(recipe)).to_toml())
    r = CliRunner().invoke(app, args)
    assert r.exit_code == EX_CONFIG and "plan_digests.draft_model: table has (not measured)" in r.stderr, r.output


def test_measured_draft_reads_the_draft_models_default_table(micro_embedded, no_load, tmp_path, monkeypatch):
    # no --spec-cost-table: tables/<box>/<recipe>.draft-<draft model>.toml, missing here: 65 naming that path
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["serve", "--model", "micro-t", "--spec", "draft", "--draft-model", "micro-t",
                                 "--spec-cost-model", "measured", "--box-class", BOX, "--energy", "none"])
    assert r.exit_code == EX_DATAERR, r.output
    assert f"tables/{BOX}/micro-t.draft-micro-t.toml" in r.stderr


def test_build_policy_drafts_with_the_draft_model_at_its_depth(micro_embedded):
    # static: the gate and ladder over the draft model, as deep as draft_depth; measured: the planner under the
    # draft model's key; --spec draft without a draft model in the runner is refused
    recipe = micro_embedded[1]
    static = build_policy(PolicyConfig("draft", draft_depth=3), 0, draft_model=True, environ={})
    assert isinstance(static, MtpLadderPolicy) and (static.drafter, static.name, static.num_drafts) == \
        ("draft", "draft", 3)
    state = SpecCostState(table(_draft_key(recipe)), calibration(draft_model_drafter_key(recipe)), 0.1,
                          _draft_key(recipe), draft_model_drafter_key(recipe))
    planned = build_policy(PolicyConfig("draft"), 0, state, draft_model=True)
    assert isinstance(planned, MtpPlannedPolicy) and (planned.name, planned.num_drafts) == ("draft/measured",
                                                                                           DRAFT_DEPTH)
    with pytest.raises(ValueError, match="--spec draft needs a runner with a draft model"):
        build_policy(PolicyConfig("draft"), 4)
    with pytest.raises(ValueError, match="draft depth must be in 1..=16"):
        PolicyConfig("draft", draft_depth=0)
