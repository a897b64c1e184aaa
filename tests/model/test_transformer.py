"""The transformer: HF LlamaForCausalLM parity and cached forward equal to an uncached one."""

import pytest
import torch

from met.model.config import ModelConfig
from met.model.hf_export import export_hf
from met.model.kv_cache import KVCache
from met.model.recipes import embedded
from met.model.transformer import CacheContext

from random_models import random_micro


@pytest.mark.parametrize("which", ["random-gqa", "shipped"])
def test_logits_match_transformers_llama(tmp_path, which):
    # the same weights in transformers' LlamaForCausalLM give the same logits: a random GQA model, the shipped recipe
    transformers = pytest.importorskip("transformers")
    model = random_micro() if which == "random-gqa" else embedded().load()
    hf = transformers.LlamaForCausalLM.from_pretrained(export_hf(model, tmp_path)).eval()
    x = torch.randint(0, 256, (2, 40))
    with torch.no_grad():
        assert torch.allclose(model(x), hf(x).logits, atol=1e-4, rtol=0)


def test_cached_forward_in_chunks_equals_uncached():
    # prefill 7 tokens, then 1, then 4: same logits as one causal pass over all 12
    model = random_micro().double()
    cfg = model.cfg
    cache = KVCache.allocate(cfg.n_layers + 1, 1, 64, cfg.n_kv_heads, cfg.head_dim, torch.float64)
    x = torch.randint(0, 256, (1, 12))
    with torch.no_grad():
        full = model(x)
        pieces, start = [], 0
        for n in (7, 1, 4):
            pos = torch.arange(start, start + n)[None]
            pieces.append(model.logits(model.hidden(x[:, start : start + n], CacheContext.build(cache, [0], pos))))
            start += n
    assert torch.allclose(torch.cat(pieces, 1), full, atol=1e-10)


def test_packed_path_equals_the_modules():
    # fuse(): norms folded into [in, out] weights, the unit-RMS form, the packed heads; the same logits
    # as the module path, main model and MTP, prefill then a verify-shaped chunk
    model = random_micro().double()
    cfg = model.cfg
    x = torch.randint(0, 256, (2, 9))
    caches = [KVCache.allocate(cfg.n_layers + 1, 2, 64, cfg.n_kv_heads, cfg.head_dim, torch.float64) for _ in "ab"]
    out = []
    with torch.no_grad():
        for packed, cache in zip((False, True), caches):
            if packed:
                model.fuse()
            logits, mtp = [], []
            for start, n in ((0, 6), (6, 3)):
                pos = torch.arange(start, start + n).expand(2, n)
                h = model.hidden(x[:, start : start + n], CacheContext.build(cache, [0, 1], pos))
                nxt = torch.roll(x, -1, 1)[:, start : start + n]
                mh, _ = model.mtp_hidden(h, nxt, CacheContext.build(cache, [0, 1], pos))
                logits.append(model.logits_cached(h) if packed else model.logits(h))
                mtp.append(model.mtp_logits_cached(mh) if packed else model.mtp_logits(mh))
            out.append((torch.cat(logits, 1), torch.cat(mtp, 1)))
    assert torch.allclose(out[0][0], out[1][0], atol=1e-10)
    assert torch.allclose(out[0][1], out[1][1], atol=1e-10)
    assert not torch.allclose(out[0][0], out[0][1], atol=1e-3)  # the two heads differ: the check can fail


def test_hidden_of_the_last_rows_alone_equals_those_rows_of_the_full_pass_and_caches_every_token():
    # last=: the final layer computes one token per row; every layer still caches all of them, so the step
    # after reads the same cache (a draft model's catch-up), for a row context and a ragged batch alike
    model = random_micro().double()
    model.fuse()
    cfg = model.cfg
    x = torch.randint(0, 256, (2, 9))
    caches = [KVCache.allocate(cfg.n_layers + 1, 2, 64, cfg.n_kv_heads, cfg.head_dim, torch.float64) for _ in "ab"]
    with torch.no_grad():
        pos = torch.arange(0, 6).expand(2, 6)
        full = model.hidden(x[:, :6], CacheContext.build(caches[0], [0, 1], pos))
        ends = torch.tensor([5, 3])
        some = model.hidden(x[:, :6], CacheContext.build(caches[1], [0, 1], pos), last=ends)
        assert some.shape == (2, 1, cfg.dim)
        assert torch.allclose(some[:, 0], full[torch.arange(2), ends], atol=1e-10)
        row = model.hidden(x[:1, 6:9], CacheContext.row(caches[1], 0, 6, 3), last=2)
        after = model.hidden(x[:1, 6:9], CacheContext.build(caches[0], [0], torch.arange(6, 9)[None]))
        assert torch.allclose(row[:, 0], after[:, 2], atol=1e-10)
    assert torch.equal(caches[0].kv[:, 0, :, :9], caches[1].kv[:, 0, :, :9])
    assert not torch.allclose(full[:, 5], full[:, 3], atol=1e-3)  # the rows differ: picking the wrong one fails
    with pytest.raises(ValueError, match="cached path"):
        model.hidden(x, last=0)
    with pytest.raises(ValueError, match="taps"):
        model.hidden(x, CacheContext.build(caches[0], [0, 1], pos), taps=(1,), last=0)


def test_config_rejects_bad_shapes():
    # head count must divide the width; kv heads must divide heads
    with pytest.raises(ValueError, match="n_heads"):
        ModelConfig(dim=30, n_heads=4)
    with pytest.raises(ValueError, match="n_kv_heads"):
        ModelConfig(n_heads=6, n_kv_heads=4)
    with pytest.raises(KeyError, match="known"):
        ModelConfig.from_name("nope")
