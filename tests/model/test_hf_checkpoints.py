"""Checkpoint folders saved by transformers (tiny random Llama and Qwen2): met's logits equal theirs; refusals name why."""

import copy
import json

import pytest
import torch

from checkpoint_helpers import checkpoint, hf_greedy
from met.engine.generate import generate
from met.engine.runner import ModelRunner
from met.model.hf_checkpoint import hf_recipe
from met.model.hf_config import CheckpointError
from met.model.recipes import RecipeError
from met.model.sources import load_source, resolve, tokenizer_for

transformers = pytest.importorskip("transformers")

FAMILIES = {
    "llama": dict(family="llama"),
    "qwen2-tied-bias": dict(family="qwen2"),  # q/k/v biases, lm_head tied to embed_tokens
    "llama-headdim-bias": dict(family="llama", head_dim=16, attention_bias=True),  # 4 x 16 != 48; o_proj bias too
    "llama-sharded": dict(family="llama", shard="20KB"),  # model.safetensors.index.json + shards
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


def test_config_and_tokenizer_come_from_the_folder(saved):
    # vocab, GQA heads, biases and tying as config.json says; EOS from generation_config.json; no MTP module
    folder, hf = saved
    src = load_source(str(folder))
    cfg, c = src.model.cfg, hf.config
    assert (cfg.vocab_size, cfg.n_heads, cfg.n_kv_heads, cfg.mtp_depth) == (c.vocab_size, 4, 2, 0)
    assert cfg.head_dim == getattr(c, "head_dim", 12) and src.model.mtp is None
    assert cfg.tie_word_embeddings == c.tie_word_embeddings
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
    ({"architectures": ["MistralForCausalLM"]},
     "architecture MistralForCausalLM is not supported (met loads LlamaForCausalLM, Qwen2ForCausalLM)"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}},
     "rope scaling type 'llama3' is not supported"),
    ({"rope_parameters": None, "rope_scaling": {"type": "yarn", "factor": 4.0}}, "rope scaling type 'yarn'"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
])
def test_unsupported_checkpoints_are_refused_by_name(tmp_path, changes, message):
    # an architecture or option the engine does not compute is refused, never approximated
    checkpoint(tmp_path / "m")
    _edit_config(tmp_path / "m", **changes)
    with pytest.raises(CheckpointError) as err:
        resolve(str(tmp_path / "m"))
    assert message in str(err.value)


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
