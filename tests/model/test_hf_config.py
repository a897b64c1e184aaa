"""config.json of a checkpoint folder (met.model.hf_config): a field out of range is a CheckpointError naming it."""

import json

import pytest

from met.model.hf_config import CheckpointError, read_hf_config

# the smallest Llama config.json met reads
BASE = {"architectures": ["LlamaForCausalLM"], "hidden_size": 48, "num_attention_heads": 4, "num_hidden_layers": 2,
        "intermediate_size": 96, "vocab_size": 320, "eos_token_id": 1}


def _folder(tmp_path, config: dict, generation: dict | None = None):
    (tmp_path / "config.json").write_text(json.dumps(config))
    if generation is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    return tmp_path


def test_the_smallest_config_reads(tmp_path):
    # the base of the cases below is itself accepted (so each refusal is its one change's)
    hf = read_hf_config(_folder(tmp_path, BASE))
    assert (hf.config.n_heads, hf.config.n_kv_heads, hf.config.rope_theta, hf.eos_ids) == (4, 4, 10000.0, (1,))


@pytest.mark.parametrize("change, message", [
    ({"num_attention_heads": 0}, "num_attention_heads must be a positive integer, got 0"),  # was ZeroDivisionError
    ({"num_key_value_heads": 0}, "num_key_value_heads must be a positive integer, got 0"),  # was read as 4
    ({"hidden_size": 48.5}, "hidden_size must be a positive integer, got 48.5"),  # was truncated to 48
    ({"hidden_size": "48"}, "hidden_size must be a positive integer, got '48'"),
    ({"head_dim": -2}, "head_dim must be a positive integer, got -2"),
    ({"hidden_size": 2, "num_attention_heads": 4}, "hidden_size 2 is smaller than num_attention_heads 4"),
    ({"rope_theta": -1}, "rope_theta must be a finite number above 0, got -1"),  # was accepted
    ({"rope_theta": float("nan")}, "rope_theta must be a finite number above 0, got nan"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 0}},
     "rope_parameters.rope_theta must be a finite number above 0, got 0"),
    ({"rms_norm_eps": -1e-6}, "rms_norm_eps must be a finite number above 0, got -1e-06"),
    ({"eos_token_id": 320}, "eos_token_id 320 is outside the vocabulary (0..319"),  # was accepted
    ({"eos_token_id": [1, -1]}, "eos_token_id -1 is outside the vocabulary"),
    ({"eos_token_id": "</s>"}, "eos_token_id must be a token id or a list of them, got '</s>'"),
])
def test_a_field_out_of_range_is_refused_by_name(tmp_path, change, message):
    # the error names config.json, the field and its value
    with pytest.raises(CheckpointError) as err:
        read_hf_config(_folder(tmp_path, BASE | change))
    assert str(err.value).startswith(f"{tmp_path / 'config.json'}: ") and message in str(err.value)


def test_generation_configs_eos_is_checked_against_the_vocabulary(tmp_path):
    # generation_config.json's ids win over config.json's, and are checked as strictly, naming that file
    assert read_hf_config(_folder(tmp_path, BASE, {"eos_token_id": [1, 2]})).eos_ids == (1, 2)
    with pytest.raises(CheckpointError, match=r"generation_config\.json: eos_token_id 9999 is outside"):
        read_hf_config(_folder(tmp_path, BASE, {"eos_token_id": 9999}))
    # one that names no EOS leaves config.json's standing
    assert read_hf_config(_folder(tmp_path, BASE, {"eos_token_id": None})).eos_ids == (1,)


# Qwen3 and Mistral over the same sizes, in a context of 256
QWEN3 = BASE | {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_key_value_heads": 2,
                "head_dim": 16, "max_position_embeddings": 256}
MISTRAL = BASE | {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "max_position_embeddings": 256}
QWEN2 = BASE | {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "max_position_embeddings": 256}


def test_qwen3_reads_its_head_norms_head_dim_and_biases(tmp_path):
    # q/k norms always; head_dim as given (16, not 48 / 4), else Qwen3Config's 128; attention_bias is q, k, v and o's
    cfg = read_hf_config(_folder(tmp_path, QWEN3)).config
    assert (cfg.qk_norm, cfg.head_dim, cfg.n_kv_heads) == (True, 16, 2)
    assert (cfg.attention_bias, cfg.output_bias) == (False, False)
    assert read_hf_config(_folder(tmp_path, QWEN3 | {"attention_bias": True})).config.output_bias
    assert read_hf_config(_folder(tmp_path, {k: v for k, v in QWEN3.items() if k != "head_dim"})).config.head_dim == 128


def test_mistral_is_llamas_layout_without_biases(tmp_path):
    # MistralForCausalLM's projections have no bias whatever attention_bias says; no q/k norms
    cfg = read_hf_config(_folder(tmp_path, MISTRAL | {"sliding_window": None, "attention_bias": True})).config
    assert (cfg.qk_norm, cfg.attention_bias, cfg.output_bias, cfg.head_dim) == (False, False, False, 12)


WINDOWS = [  # (config.json, the message met refuses it with; None: accepted, the window masking nothing)
    (MISTRAL | {"sliding_window": 64},
     "sliding_window 64 is smaller than the context met serves (max_position_embeddings 256)"),
    (MISTRAL | {"max_position_embeddings": 8192},  # no window named: MistralConfig's 4096
     "sliding_window 4096 (MistralConfig's default) is smaller than the context met serves"),
    (MISTRAL | {"sliding_window": None}, None),
    (MISTRAL | {"sliding_window": 256}, None),  # as long as the context
    (MISTRAL, None),  # 4096 by default, over a context of 256
    (QWEN3 | {"use_sliding_window": True, "sliding_window": 64, "max_window_layers": 1},
     "sliding_window 64 (use_sliding_window true: layers 1.. by max_window_layers) is smaller than the context"),
    (QWEN3 | {"use_sliding_window": True, "sliding_window": 64, "layer_types": ["sliding_attention", "full_attention"]},
     "sliding_window 64 (use_sliding_window true: layers 0 by layer_types) is smaller"),
    (QWEN3 | {"use_sliding_window": True, "sliding_window": 64, "max_window_layers": 2}, None),  # no layer slides
    (QWEN3 | {"use_sliding_window": False, "sliding_window": 64, "max_window_layers": 0}, None),  # the window is off
    (QWEN3 | {"use_sliding_window": True, "sliding_window": None, "max_window_layers": 0}, None),  # no window
    (QWEN3 | {"use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 0}, None),  # longer than 256
    (QWEN3 | {"use_sliding_window": True, "max_window_layers": 0}, None),  # Qwen3Config's 4096
    (QWEN2 | {"use_sliding_window": True, "sliding_window": 128, "max_window_layers": 0},
     "sliding_window 128 (use_sliding_window true: layers 0.. by max_window_layers) is smaller"),
    (QWEN2 | {"use_sliding_window": True, "sliding_window": 32768, "max_window_layers": 0}, None),
]


@pytest.mark.parametrize("doc, message", WINDOWS)
def test_a_sliding_window_is_refused_where_it_would_apply_within_the_context(tmp_path, doc, message):
    # met attends over the whole context: a window is read only where it cannot mask a key there
    if message is None:
        assert read_hf_config(_folder(tmp_path, doc)).config.max_seq_len == 256
    else:
        with pytest.raises(CheckpointError) as err:
            read_hf_config(_folder(tmp_path, doc))
        assert str(err.value).startswith(f"{tmp_path / 'config.json'}: ") and message in str(err.value)


@pytest.mark.parametrize("doc, message", WINDOWS)
def test_the_refused_windows_are_those_transformers_applies(doc, message):
    # the oracle: transformers' own config of each case slides some layer by fewer keys than the context
    transformers = pytest.importorskip("transformers")
    cfg = transformers.AutoConfig.for_model(doc["model_type"], **{k: v for k, v in doc.items() if k != "model_type"})
    kinds = getattr(cfg, "layer_types", None) or ["sliding_attention"] * cfg.num_hidden_layers  # Mistral: all slide
    window = cfg.sliding_window
    slides = window is not None and "sliding_attention" in kinds and window < cfg.max_position_embeddings
    assert slides == (message is not None)


@pytest.mark.parametrize("change, message", [
    ({"layer_types": ["full_attention", "sliding_attention"]},  # transformers cannot build that layer's mask
     "layer_types names sliding_attention layers, but with use_sliding_window not true (or sliding_window null)"),
    ({"layer_types": ["full_attention", "chunked_attention"]}, "layer_types 'chunked_attention' is not supported"),
    ({"layer_types": ["full_attention"]}, "layer_types must list one kind per layer (2), got ['full_attention']"),
    ({"use_sliding_window": True, "max_window_layers": -1}, "max_window_layers must be a whole number >= 0, got -1"),
    ({"use_sliding_window": True, "sliding_window": 0, "max_window_layers": 0},
     "sliding_window must be a positive integer, got 0"),
])
def test_qwen3_layer_kinds_met_does_not_compute_are_refused(tmp_path, change, message):
    # each names the field and its value
    with pytest.raises(CheckpointError) as err:
        read_hf_config(_folder(tmp_path, QWEN3 | change))
    assert str(err.value).startswith(f"{tmp_path / 'config.json'}: ") and message in str(err.value)


@pytest.mark.parametrize("doc", [QWEN3, MISTRAL])
def test_rope_scaling_met_does_not_compute_is_refused_for_the_new_families(tmp_path, doc):
    # YaRN (Qwen3's long-context setting) is refused, as for Llama and Qwen2
    rope = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6, "original_max_position_embeddings": 64}
    with pytest.raises(CheckpointError, match="rope scaling type 'yarn' is not supported"):
        read_hf_config(_folder(tmp_path, doc | {"rope_parameters": rope}))


def test_a_llama_configs_identity_and_digests_are_unchanged_by_the_qk_norm_field(tmp_path):
    # qk_norm is a later field: at its default it is in neither the identity nor the recipe digest, so plan
    # digests and recipe ids measured before it was added stand (literals from before); Qwen3's carries it
    from met.engine.identity import plan_digest
    from met.model.config import ModelConfig
    from met.model.hf_checkpoint import recipe_digest

    cfg = read_hf_config(_folder(tmp_path, BASE)).config
    assert cfg.identity() == {"vocab_size": 320, "dim": 48, "n_layers": 2, "n_heads": 4, "n_kv_heads": 4,
                              "ffn_dim": 96, "max_seq_len": 2048, "rope_theta": 10000.0, "norm_eps": 1e-06,
                              "mtp_depth": 0}
    assert recipe_digest("0123456789abcdef", cfg) == "2d4fe715046a18d7"
    settings = ("float32", "cpu-test", "2.0", 1, "sdpa", "eager", [1, 2], 4)
    assert plan_digest("decode", cfg, *settings) == "30a40ea13465fe2a"
    assert plan_digest("decode", ModelConfig(), *settings) == "502835c6fce32b23"  # the embedded recipe's
    qwen3 = read_hf_config(_folder(tmp_path, QWEN3)).config
    assert qwen3.identity()["qk_norm"] is True and plan_digest("decode", qwen3, *settings) != "30a40ea13465fe2a"
