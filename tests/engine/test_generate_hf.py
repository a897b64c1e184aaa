"""`met generate --model FOLDER`: greedy text equal to transformers' generate; host speculation changes no token."""

import json

import pytest
from typer.testing import CliRunner

from checkpoint_helpers import checkpoint, hf_greedy
from met.cli import app
from met.exit_codes import EX_DATAERR, EX_NOINPUT
from met.model.sources import resolve, tokenizer_for

pytest.importorskip("transformers")

PROMPT = "def add(a, b):\n    return"


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3", "mistral"])
def saved(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp("gen") / f"tiny-{request.param}"
    overrides = {"qwen3": {"head_dim": 16}, "mistral": {"sliding_window": None}}.get(request.param, {})
    return folder, checkpoint(folder, request.param, **overrides)


def _generate(folder, *args: str) -> dict:
    result = CliRunner().invoke(app, ["generate", "--model", str(folder), "--prompt", PROMPT, "--max-tokens", "40",
                                      "--dtype", "float64", "--json", *args])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_greedy_text_equals_transformers_generate(saved):
    # the same prompt ids through transformers' greedy generate: the same tokens, so the same text
    folder, hf = saved
    tok = tokenizer_for(resolve(str(folder)))
    want = hf_greedy(hf, tok.encode(PROMPT), 40)
    got = _generate(folder)
    assert got["text"] == tok.decode(want) and got["tokens"] == len(want)


@pytest.mark.parametrize("spec", ["prompt-lookup", "ngram"])
def test_host_speculation_is_token_identical_to_plain(saved, spec):
    # drafts from the history are verified by the model: the text is plain greedy's, and some drafts land
    folder, _ = saved
    plain, spec_out = _generate(folder), _generate(folder, "--spec", spec, "--depth", "4")
    assert spec_out["text"] == plain["text"] and spec_out["tokens"] == plain["tokens"]
    assert spec_out["drafts_proposed"] > 0


def test_mtp_is_refused_on_a_model_without_an_mtp_module(saved):
    # a checkpoint folder has no MTP drafter: usage error naming the model and the alternatives
    folder, _ = saved
    result = CliRunner().invoke(app, ["generate", "--model", str(folder), "--prompt", "x", "--spec", "mtp"])
    assert result.exit_code == 2 and f"{folder.name} has no MTP module" in result.stderr
    assert "prompt-lookup" in result.stderr


def test_unsupported_architecture_exits_65_with_its_name(tmp_path):
    # Gemma is not loaded, and the message says which families are
    checkpoint(tmp_path / "m")
    doc = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps(doc | {"architectures": ["GemmaForCausalLM"]}))
    result = CliRunner().invoke(app, ["generate", "--model", str(tmp_path / "m"), "--prompt", "x"])
    assert result.exit_code == EX_DATAERR
    assert ("architecture GemmaForCausalLM is not supported (met loads LlamaForCausalLM, MistralForCausalLM, "
            "Qwen2ForCausalLM, Qwen3ForCausalLM)") in result.stderr and "Traceback" not in result.stderr


def test_missing_folder_exits_66(tmp_path):
    # a path that is not there: EX_NOINPUT, naming it
    result = CliRunner().invoke(app, ["generate", "--model", str(tmp_path / "gone"), "--prompt", "x"])
    assert result.exit_code == EX_NOINPUT and "no checkpoint folder" in result.stderr


def test_a_tokenizer_larger_than_the_model_exits_65_naming_the_ids(tmp_path):
    # tokenizer.json with more tokens than config.json's vocab_size: ids past the embedding were an
    # IndexError traceback in the forward (the serve answers 422 for such a prompt)
    from checkpoint_helpers import tokenizer

    checkpoint(tmp_path / "m")
    model_vocab = json.loads((tmp_path / "m" / "config.json").read_text())["vocab_size"]
    assert tokenizer(tmp_path / "m", vocab=2 * model_vocab) > model_vocab
    result = CliRunner().invoke(app, ["generate", "--model", str(tmp_path / "m"), "--prompt", PROMPT * 3])
    assert result.exit_code == EX_DATAERR, result.output
    assert f"are outside m's vocabulary 0..{model_vocab - 1}" in result.stderr and "Traceback" not in result.output


@pytest.fixture(scope="module")
def small(saved, tmp_path_factory):
    """A one-layer random model of the same family and tokenizer as `saved`: a draft model for it."""
    folder, hf = saved
    family = folder.name.removeprefix("tiny-")
    draft = tmp_path_factory.mktemp("draft") / f"small-{family}"
    overrides = {"qwen3": {"head_dim": 16}, "mistral": {"sliding_window": None}}.get(family, {})
    checkpoint(draft, family, seed=1, num_hidden_layers=1, **overrides)
    return draft


def test_a_draft_model_leaves_greedy_text_as_transformers_and_drafting_for_itself_accepts_all(saved, small):
    # another model's drafts are verified away where wrong; the target drafting for itself has every draft accepted
    folder, hf = saved
    tok = tokenizer_for(resolve(str(folder)))
    want = tok.decode(hf_greedy(hf, tok.encode(PROMPT), 40))
    other = _generate(folder, "--spec", "draft", "--draft-model", str(small), "--depth", "3")
    itself = _generate(folder, "--spec", "draft", "--draft-model", str(folder), "--depth", "3")
    assert other["text"] == want and itself["text"] == want
    assert other["drafts_proposed"] > 0
    assert itself["drafts_proposed"] > 10 and itself["drafts_accepted"] == itself["drafts_proposed"]


def test_a_draft_model_of_another_tokenizer_or_vocabulary_exits_65_naming_both(saved, tmp_path):
    folder, _ = saved
    args = ["generate", "--model", str(folder), "--prompt", "x", "--spec", "draft", "--draft-model"]
    result = CliRunner().invoke(app, args + ["met-tiny-py"])  # the byte tokenizer
    assert result.exit_code == EX_DATAERR, result.output
    assert f"draft model met-tiny-py has tokenizer byte, the target {folder.name} has hf-" in result.stderr
    doc = json.loads((folder / "config.json").read_text())
    checkpoint(tmp_path / "wide", "llama", vocab_size=doc["vocab_size"] + 8)  # the same tokenizer.json, more rows
    assert tokenizer_for(resolve(str(tmp_path / "wide"))).name == tokenizer_for(resolve(str(folder))).name
    result = CliRunner().invoke(app, args + [str(tmp_path / "wide")])
    assert result.exit_code == EX_DATAERR, result.output
    assert (f"draft model wide has a vocabulary of {doc['vocab_size'] + 8} tokens, the target {folder.name} of "
            f"{doc['vocab_size']}") in result.stderr


def test_draft_model_and_spec_draft_come_together(saved):
    folder, _ = saved
    for extra in (["--spec", "draft"], ["--draft-model", str(folder)]):
        result = CliRunner().invoke(app, ["generate", "--model", str(folder), "--prompt", "x", *extra])
        assert result.exit_code == 2 and "--spec draft drafts with --draft-model" in result.stderr
