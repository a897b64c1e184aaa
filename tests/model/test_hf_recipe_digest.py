"""A checkpoint folder's recipe digest (weights + met's reading of config.json): stable, and checked where tables are."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from met.bench.tables_cli import tables_app
from met.engine import identity
from met.exit_codes import EX_CONFIG, EX_NOINPUT, EX_OK
from met.model.recipes import hf_recipe
from met.speculative.spec_cost import Cell, CostTable

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64, "hidden_size": 16,
          "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
          "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 500.0, "eos_token_id": 1,
          "transformers_version": "4.0.0"}


def folder(path: Path, **changes) -> Path:
    """A folder hf_recipe reads (config.json, one safetensors file; no transformers needed: nothing is loaded)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(CONFIG | changes))
    if not (path / "model.safetensors").exists():
        save_file({"model.embed_tokens.weight": torch.arange(64 * 16, dtype=torch.float32).reshape(64, 16)},
                  str(path / "model.safetensors"))
    return path


def edit(path: Path, **changes) -> None:
    doc = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({k: v for k, v in (doc | changes).items() if v is not None}))


def test_tables_check_compares_a_folder_tables_key_and_names_the_recipe_after_a_config_edit(tmp_path):
    # met bench spec-cost --model FOLDER writes a table keyed by the folder's recipe; met tables check takes the
    # same --model FOLDER (was: --recipe took embedded names only, so no folder table could pass its key check)
    m = folder(tmp_path / "tiny")
    recipe = hf_recipe(m)
    settings = identity.resolve_run("cpu", "float32", set_threads=False)
    key = identity.serve_table_key(recipe.id, recipe.config, settings, "none", ["decode"], "test-box")
    out = tmp_path / "t.toml"
    out.write_text(CostTable(key, [Cell(n, 0, 0.001, 0.0) for n in (1, 2)]).to_toml())
    check = ["check", str(out), "--box-class", "test-box", "--device", "cpu", "--dtype", "float32"]
    result = CliRunner().invoke(tables_app, [*check, "--model", str(m)])
    assert result.exit_code == EX_OK, result.output
    assert CliRunner().invoke(tables_app, [*check, "--recipe", str(m)]).exit_code == EX_OK
    edit(m, rms_norm_eps=1e-5)
    after = hf_recipe(m)
    result = CliRunner().invoke(tables_app, [*check, "--model", str(m)])
    assert result.exit_code == EX_CONFIG
    assert (f"table measured under recipe '{recipe.id}', this serve has '{after.id}'; run met bench spec-cost"
            in result.stderr)
    result = CliRunner().invoke(tables_app, [*check, "--model", str(tmp_path / "nope")])
    assert result.exit_code == EX_NOINPUT and "no checkpoint folder" in result.stderr


def test_fields_met_does_not_read_and_spellings_of_one_config_keep_the_recipe(tmp_path):
    m = folder(tmp_path / "m")
    before = hf_recipe(m).id
    same = [dict(transformers_version="9.9.9", torch_dtype="bfloat16", initializer_range=0.5, use_cache=False),
            dict(head_dim=8, num_key_value_heads=None),  # both at what met takes when they are absent
            dict(rope_theta=None, rope_parameters={"rope_type": "default", "rope_theta": 500}),  # int, nested
            dict(rms_norm_eps=None)]  # absent: met's default, 1e-6
    for changes in same:
        edit(m, **changes)
        assert hf_recipe(m).id == before, changes
    seen = {before}
    for changes in [dict(rms_norm_eps=1e-5), dict(rope_parameters={"rope_theta": 10000.0}),
                    dict(tie_word_embeddings=True), dict(max_position_embeddings=128)]:
        edit(m, **changes)
        assert hf_recipe(m).id not in seen, changes
        seen.add(hf_recipe(m).id)


def test_the_digest_is_the_same_in_another_process_and_with_the_cache_cold_warm_or_unusable(tmp_path, monkeypatch):
    m = folder(tmp_path / "m")
    code = "import sys; from pathlib import Path; from met.model.recipes import hf_recipe; " \
           "print(hf_recipe(Path(sys.argv[1])).id)"
    env = os.environ | {"MET_CACHE_DIR": str(tmp_path / "other-cache"), "PYTHONHASHSEED": "123"}
    there = subprocess.run([sys.executable, "-c", code, str(m)], env=env, capture_output=True, text=True, check=True)
    ids = [there.stdout.strip()]
    monkeypatch.setenv("MET_CACHE_DIR", str(tmp_path / "cache"))
    ids += [hf_recipe(m).id, hf_recipe(m).id]  # cold, then warm
    assert (tmp_path / "cache" / "digests.json").exists()
    (tmp_path / "not-a-folder").write_text("")
    monkeypatch.setenv("MET_CACHE_DIR", str(tmp_path / "not-a-folder"))  # cannot be read or written: ignored
    ids.append(hf_recipe(m).id)
    assert len(set(ids)) == 1 and ids[0].startswith("m@")
    # the cache keeps the weights' digest alone: a config edit on a warm cache is seen at once
    monkeypatch.setenv("MET_CACHE_DIR", str(tmp_path / "cache"))
    edit(m, rms_norm_eps=1e-3)
    assert hf_recipe(m).id != ids[0]
    edit(m, rms_norm_eps=1e-6)
    assert hf_recipe(m).id == ids[0]
