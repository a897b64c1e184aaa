"""Packed projection weights (met.model.packed): the same product by either kernel, each where it is chosen."""

import pytest
import torch

from met.model import packed
from met.model.packed import BIG_WEIGHTS, BY_SIZE, PackedWeight, onednn_usable, rule_for
from met.model.transformer import cached_path_version

needs_onednn = pytest.mark.skipif(not onednn_usable(torch.zeros(1)), reason="this torch has no oneDNN")


EACH_RULE = pytest.mark.parametrize("rule", [BY_SIZE, BIG_WEIGHTS], ids=["by-size", "big-weights"], indirect=True)


@pytest.fixture
def rule(request, monkeypatch):
    """Each CPU kind's kernel rule in turn, whatever this CPU is."""
    monkeypatch.setattr(packed, "RULE", request.param)
    return request.param


@pytest.mark.parametrize("rows", [1, 2, 5, 16, 80])
@pytest.mark.parametrize("bias", [False, True])
@EACH_RULE
def test_the_product_is_x_at_w_plus_bias_at_every_row_count(rows, bias, rule):
    g = torch.Generator().manual_seed(rows)
    w, b = torch.randn(192, 576, generator=g), torch.randn(576, generator=g) if bias else None
    x = torch.randn(rows, 192, generator=g)
    want = x.double() @ w.double() + (b.double() if bias else 0)
    got = PackedWeight.of(w, b)(x)
    assert got.shape == (rows, 576) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)


def test_leading_dimensions_are_kept():
    w, x = torch.randn(64, 48), torch.randn(3, 7, 64)
    torch.testing.assert_close(PackedWeight.of(w)(x), x @ w, rtol=1e-5, atol=1e-5)


@needs_onednn
def test_by_size_onednn_takes_products_from_the_threshold_up_and_mkl_the_rest(monkeypatch):
    monkeypatch.setattr(packed, "RULE", BY_SIZE)
    calls = []
    real = torch.ops.mkldnn._linear_pointwise
    monkeypatch.setattr(packed, "_onednn_linear", lambda x, w, b: calls.append(x.shape[0]) or real(x, w, b, "none", [], ""))
    w = PackedWeight.of(torch.randn(192, 1024))
    below = BY_SIZE.min_macs // (192 * 1024)  # rows whose product is just under the threshold
    w(torch.randn(below, 192))
    assert calls == []
    w(torch.randn(below + 1, 192))
    assert calls == [below + 1]


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_other_dtypes_keep_no_onednn_copy_and_multiply_as_torch_does(dtype):
    w = torch.randn(192, 1024, dtype=dtype)
    p = PackedWeight.of(w)
    assert p.onednn is None
    x = torch.randn(16, 192, dtype=dtype)
    assert torch.equal(p(x), x @ w)


@needs_onednn
def test_a_large_weight_is_held_once_and_multiplied_by_onednn_at_every_row_count():
    w = torch.randn(1024, 4096) / 32  # ONEDNN_ONLY elements
    p = PackedWeight.of(w)
    assert p.dense is None and p.shape == (1024, 4096)
    for rows in (1, 3):
        assert p.uses_onednn(rows)
        x = torch.randn(rows, 1024)
        torch.testing.assert_close(p(x).double(), x.double() @ w.double(), rtol=1e-5, atol=1e-4)


@needs_onednn
@EACH_RULE
def test_a_single_row_of_a_smaller_checkpoint_weight_goes_to_mkl_and_two_to_onednn(rule):
    p = PackedWeight.of(torch.randn(896, 1152))  # past 2^19 multiply-adds at one row, below ONEDNN_ONLY
    assert p.dense is not None and not p.uses_onednn(1) and p.uses_onednn(2)


@needs_onednn
def test_by_weights_the_embedded_models_products_go_to_mkl_at_every_row_count_and_keep_no_onednn_copy(monkeypatch):
    monkeypatch.setattr(packed, "RULE", BIG_WEIGHTS)
    calls = []
    monkeypatch.setattr(packed, "_onednn_linear", lambda x, w, b: calls.append(x.shape[0]))
    p = PackedWeight.of(torch.randn(192, 1024))
    assert p.onednn is None
    for rows in (1, 5, 80):
        p(torch.randn(rows, 192))
    assert calls == []


def test_the_rule_follows_the_vendor_and_the_cpu_path_version_the_rule(tmp_path, monkeypatch):
    assert rule_for("GenuineIntel") is rule_for("GenuineIntel", avx512=False) is BIG_WEIGHTS
    assert rule_for("AuthenticAMD", avx512=True) is rule_for("", avx512=True) is BY_SIZE
    assert rule_for("AuthenticAMD", avx512=False) is BIG_WEIGHTS  # oneDNN on AVX2 loses to MKL there
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R)\n"
                    "flags\t\t: fpu sse2 avx2 avx512f avx512bw\n")
    monkeypatch.setattr(packed, "_CPUINFO", info)
    assert packed.cpu_vendor() == "GenuineIntel" and packed.cpu_has_avx512()
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx avx2 fma\n")
    assert packed.cpu_vendor() == "AuthenticAMD" and not packed.cpu_has_avx512()
    monkeypatch.setattr(packed, "_CPUINFO", tmp_path / "none")
    assert packed.cpu_vendor() == "" and not packed.cpu_has_avx512()
    assert BY_SIZE.path_version != BIG_WEIGHTS.path_version  # a table measured under one is refused under the other
    for r in (BY_SIZE, BIG_WEIGHTS):
        monkeypatch.setattr(packed, "RULE", r)
        assert cached_path_version("cpu") == r.path_version
