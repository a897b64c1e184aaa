"""EAGLE-3 heads: the published layout loads, a head that does not fit its target is refused, and the target hands
over the hidden states of the head's layers."""

import json

import pytest
import torch

from met.exit_codes import EX_DATAERR, EX_NOINPUT
from met.model.config import ModelConfig
from met.model.dflash import DrafterError
from met.model.eagle3 import load_eagle3
from met.model.kv_cache import KVCache
from met.model.transformer import CacheContext, Transformer
from eagle3_helpers import random_head, save_head

TARGET = ModelConfig.from_name("micro").with_(mtp_depth=0)  # dim 32, 2 layers, 258 tokens


def _status(folder, target=TARGET) -> tuple[int, str]:
    with pytest.raises(DrafterError) as e:
        load_eagle3(folder, target)
    return e.value.status, str(e.value)


def test_a_saved_head_loads_with_its_weights_and_its_draft_to_target_map(tmp_path):
    head = random_head(TARGET, draft_vocab=40, dim=24).float()
    loaded = load_eagle3(save_head(tmp_path / "h", head), TARGET)
    assert loaded.cfg == head.cfg and loaded.embed_tokens is not None
    for k, v in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    assert loaded.d2t.dtype == torch.long and loaded.t2d.dtype == torch.bool
    # logits over the target vocabulary: the head's 40 ids hold its logits, the rest -inf
    out = torch.randn(3, 24)
    logits = loaded.logits(out)
    assert logits.shape == (3, 258)
    assert torch.equal(logits[:, loaded.targets], loaded.lm_head(loaded.norm(out)))
    assert int(torch.isfinite(logits[0]).sum()) == 40 and torch.equal(torch.isfinite(logits[0]), loaded.t2d)


def test_a_head_without_an_embedding_reads_the_targets_and_the_layers_default_to_vllms(tmp_path):
    # an 8-layer target: vLLM's default layers are 2, 8 // 2 and 8 - 3
    target = TARGET.with_(n_layers=8)
    head = random_head(target, layers=(2, 4, 5), own_embedding=False).float()
    loaded = load_eagle3(save_head(tmp_path / "h", head, layer_ids=False), target)
    assert loaded.cfg.layers == (2, 4, 5) and loaded.embed_tokens is None and loaded.identity
    net = Transformer(target)
    assert loaded.embedding(net) is net.model.embed_tokens


def test_heads_that_do_not_fit_the_target_are_refused_with_what_differs(tmp_path):
    head = random_head(TARGET, draft_vocab=40).float()
    # no such folder: 66; a file where the folder should be: 65
    assert _status(tmp_path / "nothing")[0] == EX_NOINPUT
    (tmp_path / "file").write_text("x")
    assert _status(tmp_path / "file")[0] == EX_DATAERR
    # a head for a target of hidden size 64
    status, message = _status(save_head(tmp_path / "wide", random_head(TARGET.with_(dim=64), dim=32)))
    assert status == EX_DATAERR and "hidden size 64; this model's is 32" in message
    # another vocabulary
    status, message = _status(save_head(tmp_path / "h", head), TARGET.with_(vocab_size=300))
    assert status == EX_DATAERR and "vocabulary of 258 tokens; this model's has 300" in message
    # layers past the target's (vLLM's default for a 2-layer target reads layer -1)
    status, message = _status(save_head(tmp_path / "default", head, layer_ids=False))
    assert status == EX_DATAERR and "reads target layers [-1, 1, 2]" in message
    # a d2t that maps two draft ids onto one target id
    bad = random_head(TARGET, draft_vocab=40).float()
    bad.d2t[1] = bad.d2t[0] - 1
    status, message = _status(save_head(tmp_path / "d2t", bad))
    assert status == EX_DATAERR and "two onto one" in message
    # a t2d that marks other ids than d2t maps to
    bad = random_head(TARGET, draft_vocab=40).float()
    bad.t2d.copy_(bad.t2d.roll(1))
    status, message = _status(save_head(tmp_path / "t2d", bad))
    assert status == EX_DATAERR and "t2d does not mark" in message
    # two layers, not one; another architecture; no config.json
    assert _status(save_head(tmp_path / "deep", head, num_hidden_layers=2))[0] == EX_DATAERR
    status, message = _status(save_head(tmp_path / "arch", head, architectures=["LlamaForCausalLM"]))
    assert status == EX_DATAERR and "not an EAGLE-3 head" in message
    (tmp_path / "empty").mkdir()
    assert _status(tmp_path / "empty")[0] == EX_NOINPUT
    (save_head(tmp_path / "bin", head) / "model.safetensors").rename(tmp_path / "bin" / "pytorch_model.bin")
    status, message = _status(tmp_path / "bin")
    assert status == EX_NOINPUT and "holds no *.safetensors weights" in message


def test_a_fc_of_another_width_than_the_config_says_is_refused(tmp_path):
    folder = save_head(tmp_path / "h", random_head(TARGET).float())
    doc = json.loads((folder / "config.json").read_text())
    doc["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [0, 1]  # two layers: fc would read 64 columns, not 96
    (folder / "config.json").write_text(json.dumps(doc))
    status, message = _status(folder)
    assert status == EX_DATAERR and "fc.weight" in message


@torch.inference_mode()
def test_the_cached_path_hands_over_the_hidden_states_entering_the_heads_layers():
    # taps (0, 1, 2, 2): the embedding, layer 0's output, the last layer's (twice); the plain hidden is unchanged
    torch.manual_seed(0)
    model = Transformer(TARGET).double().eval()
    model.fuse()
    tokens = torch.tensor([[5, 6, 7, 8, 9]])
    x = model.model.embed_tokens(tokens)
    expected = [x]
    cos, sin = model._rope(torch.arange(5)[None])
    for layer in model.model.layers:
        x, _ = layer(x, cos, sin)
        expected.append(x)
    for fused in (True, False):
        cache = KVCache.allocate(TARGET.n_layers, 1, 16, TARGET.n_kv_heads, TARGET.head_dim, torch.float64)
        ctx = CacheContext.build(cache, [0], torch.arange(5)[None])
        if not fused:
            del model._fused
        h, taps = model.hidden(tokens, ctx, (0, 1, 2, 2))
        assert taps.shape == (1, 5, 4 * TARGET.dim)
        torch.testing.assert_close(taps, torch.cat(expected[:3] + expected[2:], -1))
        torch.testing.assert_close(h, expected[-1])
    model.fuse()
    cache = KVCache.allocate(TARGET.n_layers, 1, 16, TARGET.n_kv_heads, TARGET.head_dim, torch.float64)
    plain = model.hidden(tokens, CacheContext.build(cache, [0], torch.arange(5)[None]))
    assert isinstance(plain, torch.Tensor)
    torch.testing.assert_close(plain, expected[-1])
