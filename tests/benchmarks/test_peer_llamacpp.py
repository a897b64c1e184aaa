"""benchmarks/peer_llamacpp.py's pure parts: the byte vocabulary, the RoPE permutation and the GGUF it writes.

They need only the `gguf` package (the `peers` extra); without it the module skips. llama.cpp itself is
not run here.
"""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from random_models import random_micro  # noqa: E402

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))  # the script imports its sibling modules (interleave), as it does when run
_spec = importlib.util.spec_from_file_location("peer_llamacpp", BENCHMARKS / "peer_llamacpp.py")
peer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(peer)


def rope_rotate_half(x: np.ndarray, pos: int, theta: float = 10000.0) -> np.ndarray:
    """HF Llama's RoPE of one head's vector: element j turns with element j + d/2 by frequency j."""
    d = x.shape[-1]
    angle = pos / theta ** (np.arange(0, d, 2) / d)
    cos, sin = np.tile(np.cos(angle), 2), np.tile(np.sin(angle), 2)
    half = np.concatenate([-x[d // 2:], x[: d // 2]])
    return x * cos + half * sin


def rope_pairs(x: np.ndarray, pos: int, theta: float = 10000.0) -> np.ndarray:
    """llama.cpp's RoPE for the llama architecture: elements 2j and 2j + 1 turn together by frequency j."""
    d = x.shape[-1]
    angle = pos / theta ** (np.arange(0, d, 2) / d)
    even, odd = x[0::2], x[1::2]
    out = np.empty_like(x)
    out[0::2] = even * np.cos(angle) - odd * np.sin(angle)
    out[1::2] = even * np.sin(angle) + odd * np.cos(angle)
    return out


def test_byte_chars_spell_each_byte_once():
    chars = peer.byte_chars()
    assert len(set(chars)) == 256
    # printable ASCII is itself; space and newline get GPT-2's stand-ins
    assert (chars[ord("a")], chars[ord(" ")], chars[ord("\n")]) == ("a", "Ġ", "Ċ")


def test_permuted_rows_under_pair_rope_are_hf_rope_permuted():
    # 2 heads of 8: per head, pair RoPE of the permuted projection = the same permutation of HF's RoPE
    rng = np.random.default_rng(0)
    n_heads, head_dim, dim = 2, 8, 5
    w, x = rng.normal(size=(n_heads * head_dim, dim)), rng.normal(size=dim)
    hf = (w @ x).reshape(n_heads, head_dim)
    ours = (peer.permute_rope(w, n_heads) @ x).reshape(n_heads, head_dim)
    order = np.stack([np.arange(head_dim // 2), np.arange(head_dim // 2) + head_dim // 2], 1).reshape(-1)
    for h in range(n_heads):
        np.testing.assert_allclose(rope_pairs(ours[h], 7), rope_rotate_half(hf[h], 7)[order], atol=1e-12)


def test_attention_scores_survive_the_permutation():
    # q.k after RoPE at positions 3 and 11: the same in both layouts (q and k are permuted alike)
    rng = np.random.default_rng(1)
    wq, wk, x, y = rng.normal(size=(8, 6)), rng.normal(size=(8, 6)), rng.normal(size=6), rng.normal(size=6)
    hf = rope_rotate_half(wq @ x, 3) @ rope_rotate_half(wk @ y, 11)
    ours = rope_pairs(peer.permute_rope(wq, 1) @ x, 3) @ rope_pairs(peer.permute_rope(wk, 1) @ y, 11)
    assert ours == pytest.approx(hf, abs=1e-12)


def test_gguf_tensors_names_and_permutes():
    # the micro preset (GQA: 4 heads, 2 kv heads): llama.cpp names, MTP dropped, only q and k reordered
    model = random_micro()
    state = model.state_dict()
    tensors = peer.gguf_tensors(state, model.cfg.n_heads, model.cfg.n_kv_heads)
    main = [k for k in state if not k.startswith("mtp.")]
    assert len(tensors) == len(main)
    assert {"token_embd.weight", "output_norm.weight", "output.weight", "blk.1.ffn_down.weight"} <= set(tensors)
    q = state["model.layers.0.self_attn.q_proj.weight"].numpy()
    k = state["model.layers.0.self_attn.k_proj.weight"].numpy()
    np.testing.assert_array_equal(tensors["blk.0.attn_q.weight"], peer.permute_rope(q, 4))
    np.testing.assert_array_equal(tensors["blk.0.attn_k.weight"], peer.permute_rope(k, 2))
    assert not np.array_equal(tensors["blk.0.attn_q.weight"], q)
    np.testing.assert_array_equal(tensors["blk.0.attn_v.weight"], state["model.layers.0.self_attn.v_proj.weight"])


def test_written_gguf_reads_back_with_the_byte_vocabulary(tmp_path):
    # 258 tokens: bytes, then BOS and EOS as control tokens; float32 tensors in ggml's reversed shape
    model = random_micro()
    reader = gguf.GGUFReader(str(peer.write_gguf(model, tmp_path / "m.gguf")))
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    assert tokens[:256] == peer.byte_chars() and tokens[256:] == ["<s>", "</s>"]
    assert reader.fields["tokenizer.ggml.bos_token_id"].contents() == 256
    assert reader.fields["tokenizer.ggml.eos_token_id"].contents() == 257
    assert reader.fields["llama.attention.head_count_kv"].contents() == 2
    shapes = {t.name: (t.tensor_type.name, [int(s) for s in t.shape]) for t in reader.tensors}
    assert shapes["blk.0.ffn_gate.weight"] == ("F32", [model.cfg.dim, model.cfg.ffn_dim])


def test_first_difference():
    assert peer.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert peer.first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert peer.first_difference([1, 2], [1, 2, 3]) == 2  # a prefix differs where it ends


def test_llama_cpp_computes_what_met_computes(tmp_path):
    # the micro preset's GGUF through llama.cpp: every position's logits as met's (needs llama-cpp-python)
    llama_cpp = pytest.importorskip("llama_cpp")
    model = random_micro()
    llm = llama_cpp.Llama(str(peer.write_gguf(model, tmp_path / "m.gguf")), n_ctx=64, n_threads=1,
                          n_threads_batch=1, logits_all=True, type_k=llama_cpp.GGML_TYPE_F32,
                          type_v=llama_cpp.GGML_TYPE_F32, verbose=False)
    prompt = list(b"def f(x):\n    return x + 1")
    assert llm.tokenize(bytes(prompt), add_bos=False) == prompt
    llm.eval(prompt)
    with torch.inference_mode():
        ours = model(torch.tensor([prompt]))[0].numpy()
    np.testing.assert_allclose(np.asarray(llm.scores[: len(prompt)]), ours, rtol=1e-4, atol=1e-4 * np.abs(ours).max())
