"""Checkpoint folders saved by transformers (tiny random Llama, Qwen2, Qwen3, Mistral): met's logits equal theirs;
refusals name why."""

import copy
import json

import pytest
import torch
from typer.testing import CliRunner

from checkpoint_helpers import checkpoint, hf_greedy
from met.cli import app
from met.engine.generate import generate
from met.engine.runner import Draft, ModelRunner, Sampling
from met.exit_codes import EX_DATAERR
from met.model.recipes import hf_recipe
from met.model.hf_config import CheckpointError
from met.model.recipes import RecipeError
from met.model.sources import load_source, resolve, tokenizer_for

transformers = pytest.importorskip("transformers")

FAMILIES = {
    "llama": dict(family="llama"),
    "qwen2-tied-bias": dict(family="qwen2"),  # q/k/v biases, lm_head tied to embed_tokens
    "llama-headdim-bias": dict(family="llama", head_dim=16, attention_bias=True),  # 4 x 16 != 48; o_proj bias too
    "llama-sharded": dict(family="llama", shard="20KB"),  # model.safetensors.index.json + shards
    "qwen3-headdim": dict(family="qwen3", head_dim=16),  # q/k norms before RoPE; 4 x 16 != 48; untied
    "qwen3-tied-narrow": dict(family="qwen3", head_dim=8, tie_word_embeddings=True),  # 4 x 8 < 48, tied
    "mistral": dict(family="mistral", sliding_window=None),  # Llama's layout under another name
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def saved(request, tmp_path_factory):
    """(folder, transformers model in float64) for each family."""
    folder = tmp_path_factory.mktemp("ckpt") / f"tiny-{request.param}"
    return folder, checkpoint(folder, **FAMILIES[request.param])


def test_logits_match_transformers_float32(saved):
    # the same folder through met and through transformers: logits within 1e-4 in float32
    folder, hf = saved
    src = load_source(str(folder), torch.float32)
    x = torch.randint(0, src.model.cfg.vocab_size, (2, 33), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(src.model(x), copy.deepcopy(hf).float()(x).logits, atol=1e-4, rtol=0)


def test_cached_greedy_decoding_equals_transformers_generate(saved):
    # the runner's packed, cached path (biases, head_dim, tying included) gives transformers' greedy tokens
    folder, hf = saved
    src = load_source(str(folder), torch.float64)
    prompt = [5, 17, 42, 99, 7]
    (out,) = generate(ModelRunner(src.model, 1), [prompt], 16, "off", eos_ids=src.tokenizer.eos_ids)
    assert out.tokens == hf_greedy(hf, prompt, 16)


def test_cached_path_logits_match_transformers_float32(saved):
    # the runner's packed, cached path scores every position as transformers scores the whole sequence, within
    # 1e-4 in float32: prefill, three plain decode steps, then a verify of three drafts
    folder, hf = saved
    model = load_source(str(folder), torch.float32).model
    runner, seen = ModelRunner(model, 1), []

    def spy(hidden):  # every logits row the runner computes, in order
        seen.append(out := type(model).logits_cached(model, hidden))
        return out

    model.logits_cached = spy
    prompt, drafts = [5, 17, 42, 99, 7], [11, 12, 13]
    tokens = prompt + runner.prefill([0], [prompt], [Sampling()])  # seen[0]: [1, V], the prompt's last position
    for _ in range(3):
        tokens += runner.verify([0], [Draft([], [])])[0].tokens  # seen[1..3]: [1, 1, V]
    runner.verify([0], [Draft(drafts, [0.0] * 3)])  # seen[4]: [1, 4, V], the last token's position and the drafts'
    got = torch.cat([seen[0], *(s[0] for s in seen[1:])])  # [8, V]: positions len(prompt) - 1 on
    with torch.no_grad():
        want = copy.deepcopy(hf).float()(torch.tensor([tokens + drafts])).logits[0, len(prompt) - 1:]
    assert got.shape == want.shape == (8, model.cfg.vocab_size)
    assert torch.allclose(got, want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("spec", ["prompt-lookup", "ngram"])
def test_copy_speculation_is_token_identical_to_plain_decoding(saved, spec):
    # no MTP module: drafts are copies from the history, verified by the model; float64 greedy text is plain
    # decoding's, and some copies are proposed
    folder, _ = saved
    src = load_source(str(folder), torch.float64)
    prompt = src.tokenizer.encode("def add(a, b):\n    return a + b\n" * 3)
    (plain,) = generate(ModelRunner(src.model, 1), [prompt], 32, "off", eos_ids=src.tokenizer.eos_ids)
    (spec_out,) = generate(ModelRunner(src.model, 1), [prompt], 32, spec, depth=4, eos_ids=src.tokenizer.eos_ids)
    assert spec_out.tokens == plain.tokens and spec_out.stats.proposed > 0


def test_config_and_tokenizer_come_from_the_folder(saved):
    # vocab, GQA heads, biases and tying as config.json says; EOS from generation_config.json; no MTP module
    folder, hf = saved
    src = load_source(str(folder))
    cfg, c = src.model.cfg, hf.config
    assert (cfg.vocab_size, cfg.n_heads, cfg.n_kv_heads, cfg.mtp_depth) == (c.vocab_size, 4, 2, 0)
    assert cfg.head_dim == getattr(c, "head_dim", 12) and src.model.mtp is None
    assert cfg.tie_word_embeddings == c.tie_word_embeddings and cfg.qk_norm == (c.model_type == "qwen3")
    if cfg.tie_word_embeddings:
        assert src.model.lm_head.weight is src.model.model.embed_tokens.weight
    assert src.tokenizer.eos_ids == {1} and src.tokenizer.name.startswith("hf-")
    assert src.tokenizer.decode(src.tokenizer.encode("café 日本語 😀")) == "café 日本語 😀"


def test_recipe_is_the_folder_name_and_a_digest_of_its_weights(tmp_path):
    # same weights -> same id; other weights -> other digest
    checkpoint(tmp_path / "one", seed=0)
    a = hf_recipe(tmp_path / "one")
    again = hf_recipe(tmp_path / "one")
    checkpoint(tmp_path / "two", seed=1)
    b = hf_recipe(tmp_path / "two")
    assert a.id == again.id == f"one@{a.digest}" and len(a.digest) == 16
    assert b.name == "two" and b.digest != a.digest and a.source == "hf"


def test_a_config_edit_that_changes_the_model_changes_the_recipe(tmp_path):
    # same weights under another rms_norm_eps compute another model: another digest (a calibration fitted
    # on the first is refused); a field met does not read keeps it
    checkpoint(tmp_path / "one")
    before = hf_recipe(tmp_path / "one")
    _edit_config(tmp_path / "one", transformers_version="9.9.9")
    assert hf_recipe(tmp_path / "one").id == before.id
    _edit_config(tmp_path / "one", rms_norm_eps=0.5)
    after = hf_recipe(tmp_path / "one")
    assert after.config.norm_eps == 0.5 and after.name == before.name and after.digest != before.digest


def test_hub_name_in_config_names_the_recipe(tmp_path):
    # `_name_or_path` of a hub model (org/name) names the recipe by its model name; a local path does not
    checkpoint(tmp_path / "snap")
    doc = json.loads((tmp_path / "snap" / "config.json").read_text())
    (tmp_path / "snap" / "config.json").write_text(json.dumps(doc | {"_name_or_path": "Qwen/Qwen2-0.5B"}))
    assert hf_recipe(tmp_path / "snap").name == "Qwen2-0.5B"
    (tmp_path / "snap" / "config.json").write_text(json.dumps(doc | {"_name_or_path": "/tmp/x/y"}))
    assert hf_recipe(tmp_path / "snap").name == "snap"


def _edit_config(folder, **changes):
    doc = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(doc | changes))


@pytest.mark.parametrize("changes, message", [
    ({"architectures": ["GemmaForCausalLM"]},
     "architecture GemmaForCausalLM is not supported (met loads LlamaForCausalLM, MistralForCausalLM, "
     "Qwen2ForCausalLM, Qwen3ForCausalLM)"),
    ({"architectures": ["Qwen3MoeForCausalLM"]}, "architecture Qwen3MoeForCausalLM is not supported"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}},
     "rope scaling type 'llama3' is not supported"),
    ({"rope_parameters": None, "rope_scaling": {"type": "yarn", "factor": 4.0}}, "rope scaling type 'yarn'"),
    # both keys: transformers reads the legacy rope_scaling (was: met read rope_parameters' default RoPE)
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 500.0}, "rope_scaling": {"rope_type": "linear",
                                                                                         "factor": 2.0}},
     "rope scaling type 'linear'"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
])
def test_unsupported_checkpoints_are_refused_by_name(tmp_path, changes, message):
    # an architecture or option the engine does not compute is refused, never approximated
    checkpoint(tmp_path / "m")
    _edit_config(tmp_path / "m", **changes)
    with pytest.raises(CheckpointError) as err:
        resolve(str(tmp_path / "m"))
    assert message in str(err.value)


def test_a_mistral_window_within_the_context_exits_65_naming_the_field(tmp_path):
    # sliding_window 64 under a context of 256: past 64 tokens Mistral masks keys that met attends to; the folder
    # is unusable (65), and the message says which field and what to do
    checkpoint(tmp_path / "m", "mistral", sliding_window=64)
    result = CliRunner().invoke(app, ["generate", "--model", str(tmp_path / "m"), "--prompt", "x"])
    assert result.exit_code == EX_DATAERR and "Traceback" not in result.output
    assert "sliding_window 64 is smaller than the context met serves (max_position_embeddings 256)" in result.stderr
    assert "set max_position_embeddings to 64 or less" in result.stderr


def test_a_mistral_window_no_smaller_than_the_context_loads(tmp_path):
    # a window as long as the context masks nothing: met's full attention is Mistral's
    checkpoint(tmp_path / "m", "mistral", sliding_window=256)
    assert _logits_match_transformers(tmp_path / "m")


def test_generate_on_a_qwen3_folder_speculates_by_copies(tmp_path):
    # met generate --spec prompt-lookup on a Qwen3 folder (no MTP module): transformers' greedy text, copies proposed
    hf = checkpoint(tmp_path / "q3", "qwen3", head_dim=16)
    tok = tokenizer_for(resolve(str(tmp_path / "q3")))
    prompt = "def add(a, b):\n    return a + b\n" * 3
    result = CliRunner().invoke(app, ["generate", "--model", str(tmp_path / "q3"), "--prompt", prompt, "--max-tokens",
                                      "32", "--dtype", "float64", "--json", "--spec", "prompt-lookup", "--depth", "4"])
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    assert got["text"] == tok.decode(hf_greedy(hf, tok.encode(prompt), 32)) and got["drafts_proposed"] > 0


def test_tensors_that_do_not_fit_the_config_are_refused(tmp_path):
    # config.json says 3 layers but the file holds 2: the missing tensors are named
    checkpoint(tmp_path / "m")
    _edit_config(tmp_path / "m", num_hidden_layers=3)
    with pytest.raises(CheckpointError, match=r"missing model\.layers\.2\."):
        load_source(str(tmp_path / "m"))


def test_missing_folder_files_are_recipe_errors(tmp_path):
    # no folder, no config.json, no weights, no tokenizer.json: each says what is missing
    with pytest.raises(RecipeError, match="no checkpoint folder"):
        resolve(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(RecipeError, match="has no config.json"):
        resolve(str(tmp_path / "empty"))
    checkpoint(tmp_path / "m")
    (tmp_path / "m" / "tokenizer.json").unlink()
    with pytest.raises(RecipeError, match="has no tokenizer.json"):
        tokenizer_for(resolve(str(tmp_path / "m")))
    (tmp_path / "m" / "model.safetensors").unlink()
    with pytest.raises(RecipeError, match="holds no \\*.safetensors"):
        resolve(str(tmp_path / "m"))


def _logits_match_transformers(folder) -> bool:
    """met's and transformers' float32 logits of one random batch agree within 1e-4."""
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    model = load_source(str(folder), torch.float32).model
    x = torch.randint(0, model.cfg.vocab_size, (1, 33), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return torch.allclose(model(x), hf(x).logits, atol=1e-4, rtol=0)


def test_rope_theta_is_read_where_transformers_reads_it(tmp_path):
    # rope_scaling wins over rope_parameters, its rope_theta too (met used 10000 here: every logit off by ~0.5)
    checkpoint(tmp_path / "m")
    _edit_config(tmp_path / "m", rope_theta=None, rope_parameters={"rope_type": "default"},
                 rope_scaling={"rope_type": "default", "rope_theta": 500.0})
    assert resolve(str(tmp_path / "m")).config.rope_theta == 500.0
    assert _logits_match_transformers(tmp_path / "m")


def test_tied_config_with_a_different_lm_head_is_refused(tmp_path):
    # transformers 4 ties such a file, transformers 5 keeps both: met neither guesses (it silently tied)
    checkpoint(tmp_path / "m")  # untied: lm_head.weight differs from embed_tokens
    _edit_config(tmp_path / "m", tie_word_embeddings=True)
    with pytest.raises(CheckpointError, match="tie_word_embeddings true, but the files hold an lm_head.weight that "
                                              "differs from model.embed_tokens.weight"):
        load_source(str(tmp_path / "m"))


def test_tied_checkpoint_saved_with_only_its_head_loads(tmp_path):
    # tied weights saved under lm_head.weight alone: that matrix is the embedding too, as in transformers
    from safetensors.torch import load_file, save_file

    checkpoint(tmp_path / "m", family="qwen2")
    path = tmp_path / "m" / "model.safetensors"
    state = load_file(path)
    state["lm_head.weight"] = state.pop("model.embed_tokens.weight")
    save_file(state, path, metadata={"format": "pt"})
    model = load_source(str(tmp_path / "m")).model
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert _logits_match_transformers(tmp_path / "m")


def test_a_tensor_in_two_files_is_refused(tmp_path):
    # no index and a second copy beside model.safetensors: which one won was the files' sort order
    import shutil

    checkpoint(tmp_path / "m")
    shutil.copy(tmp_path / "m" / "model.safetensors", tmp_path / "m" / "model.old.safetensors")
    with pytest.raises(CheckpointError, match=r"lm_head\.weight is in both model\.old\.safetensors and "
                                              r"model\.safetensors; a checkpoint holds each tensor once"):
        load_source(str(tmp_path / "m"))
