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
