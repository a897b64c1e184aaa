"""Packed projection weights (met.model.packed): the same product by either kernel, each where it is chosen."""

import pytest
import torch

from met.model import packed
from met.model.packed import ONEDNN_MIN_MACS, PackedWeight, onednn_usable

needs_onednn = pytest.mark.skipif(not onednn_usable(torch.zeros(1)), reason="this torch has no oneDNN")


@pytest.mark.parametrize("rows", [1, 2, 5, 16, 80])
@pytest.mark.parametrize("bias", [False, True])
def test_the_product_is_x_at_w_plus_bias_at_every_row_count(rows, bias):
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
def test_onednn_takes_products_from_the_threshold_up_and_mkl_the_rest(monkeypatch):
    calls = []
    real = torch.ops.mkldnn._linear_pointwise
    monkeypatch.setattr(packed, "_onednn_linear", lambda x, w, b: calls.append(x.shape[0]) or real(x, w, b, "none", [], ""))
    w = PackedWeight.of(torch.randn(192, 1024))
    below = ONEDNN_MIN_MACS // (192 * 1024)  # rows whose product is just under the threshold
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
def test_a_single_row_of_a_smaller_weight_goes_to_mkl():
    p = PackedWeight.of(torch.randn(896, 1152))  # past ONEDNN_MIN_MACS at one row, below ONEDNN_ONLY
    assert p.dense is not None and not p.uses_onednn(1) and p.uses_onednn(2)
