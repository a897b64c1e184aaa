"""Projection weights packed for the CPU matrix kernel that serves each product size best.

torch multiplies float32 matrices on the CPU with MKL, which takes its fast paths on Intel
processors only: on an AMD EPYC with AVX-512 a [5, 192] @ [192, 1024] product (a verify of four
drafts) ran at a fifth of the rate oneDNN reached on the same core, while MKL stayed the faster
of the two for single rows (a decode step), where oneDNN's fixed cost per call dominates. On an
Intel Xeon, and on an AMD EPYC without AVX-512 (where oneDNN's kernels run on AVX2), MKL is the
faster for every product of the embedded model up to 80 rows (oneDNN took 1.1-6.5x its time on the
Xeon), and oneDNN only for a checkpoint's larger weights from two rows on.
`benchmarks/studies/gemm_kernels.py` times both kernels per shape. A `PackedWeight` keeps the
weight as MKL reads it and, where the CPU's `KernelRule` ever sends its products to oneDNN (a
float32 CPU weight), in oneDNN's blocked layout too, and sends each product to the kernel that
is faster for its size; a large weight goes to oneDNN at every size. Float64, half precision and
GPU weights always take `x @ w`.
"""

import sys
from dataclasses import dataclass, field

import torch

from met.model.cpuinfo import CPUINFO as _CPUINFO
from met.model.cpuinfo import cpuinfo_field

# A weight of at least this many elements (in x out) is multiplied by oneDNN at every row count, a
# single row included (one row by [2048, 8192]: 1,582 us against MKL's 2,508 on the AMD EPYC; on the
# Intel Xeon MKL's 1.2-1.4x faster there), and its [in, out] copy is not kept: a checkpoint's large
# matrices are held once.
ONEDNN_ONLY = 1 << 22


@dataclass(frozen=True)
class KernelRule:
    """Which products of two rows or more go to oneDNN on a kind of CPU: those of at least min_macs
    multiply-adds (rows x in x out) by a weight of at least min_weight elements (in x out)."""

    name: str
    min_macs: int
    min_weight: int
    path_version: int  # the CPU cached path's version under this rule (met.model.transformer.cached_path_version)


# An AMD EPYC with AVX-512: the q/k/v projection of the embedded model from 5 rows, its gate/up
# projection from 3, down from 6, the output projection and the head from 11 to 15.
BY_SIZE = KernelRule("oneDNN from 2^19 multiply-adds", 1 << 19, 0, 12)
# An Intel Xeon: MKL for every product of the embedded model (weights up to 196,608 elements) up to
# 80 rows; oneDNN from two rows for a 0.5B checkpoint's smallest weight (1,032,192 elements: 0.79x
# MKL's time at 2 rows) and every larger one. The bound lies between the two. An AMD EPYC without
# AVX-512 too: there oneDNN's brgemm runs on AVX2 and a step's 24 products of the embedded model took
# 1.0-1.5x MKL's time at every row count from 1 to 80, by the size rule 1.06-1.47x
# (benchmarks/studies/results/gemm_kernels_amd_avx2.md), while oneDNN stayed the faster from two rows
# for a checkpoint's weights (0.50-0.84x MKL's time).
BIG_WEIGHTS = KernelRule("oneDNN for weights of 2^19 elements or more", 0, 1 << 19, 13)


def cpu_vendor() -> str:
    """The CPU's vendor as /proc/cpuinfo names it (GenuineIntel, AuthenticAMD), or "" where it does not."""
    return cpuinfo_field(("vendor_id",), _CPUINFO)


def cpu_has_avx512() -> bool:
    """Whether /proc/cpuinfo lists AVX-512 (avx512f) among this CPU's flags."""
    return "avx512f" in cpuinfo_field(("flags",), _CPUINFO).split()


def rule_for(vendor: str, avx512: bool = True) -> KernelRule:
    """The kernel rule for a CPU: MKL's fast paths on Intel's and where oneDNN lacks AVX-512, product size
    elsewhere."""
    return BIG_WEIGHTS if vendor == "GenuineIntel" or not avx512 else BY_SIZE


RULE = rule_for(cpu_vendor(), cpu_has_avx512())  # this CPU's


def onednn_usable(weight: torch.Tensor) -> bool:
    """Whether oneDNN can multiply by this weight here: a float32 CPU tensor and a torch built with it."""
    return (weight.device.type == "cpu" and weight.dtype == torch.float32 and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def _onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [rows, in] times a weight in oneDNN's layout (+ bias): the kernel torch.compile's freezing pass uses."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


@dataclass(slots=True)
class PackedWeight:
    """One projection's weight: [in, out] for `x @ w`, and oneDNN's layout of it where oneDNN runs."""

    shape: torch.Size  # [in, out]
    dense: torch.Tensor | None  # [in, out], contiguous; None: a weight oneDNN multiplies at every row count
    onednn: torch.Tensor | None = None  # oneDNN's blocked copy; None: every product takes `x @ dense`
    bias: torch.Tensor | None = None  # [out]
    # elements of x (rows x in) from which oneDNN takes the product: one comparison a call, on the decode path
    onednn_from: int = field(init=False)

    def __post_init__(self) -> None:
        d_in, d_out = self.shape
        if self.dense is None:
            rows = 1
        elif self.onednn is None or d_in * d_out < RULE.min_weight:
            rows = None
        else:
            rows = max(2, -(-RULE.min_macs // (d_in * d_out)))
        self.onednn_from = rows * d_in if rows else sys.maxsize

    @classmethod
    def of(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> "PackedWeight":
        """Pack an [in, out] weight (and its bias), with oneDNN's copy where oneDNN can run it and this CPU's rule
        sends it products."""
        weight = weight.detach()
        onednn = None
        if onednn_usable(weight) and weight.numel() >= RULE.min_weight:
            # oneDNN reads [out, in] (a view, for the transposed nn.Linear weight `_pack` hands in). The layout it
            # picks for a batch of 16 rows served every row count from 2 to 80 as well as its own.
            onednn = torch.ops.mkldnn._reorder_linear_weight(weight.t().contiguous(), 16)
        # a weight oneDNN multiplies at every row count keeps no [in, out] copy, not even for a moment
        dense = None if onednn is not None and weight.numel() >= ONEDNN_ONLY else weight.contiguous()
        return cls(weight.shape, dense, onednn, bias.detach() if bias is not None else None)

    def uses_onednn(self, rows: int) -> bool:
        """Whether a product of this many rows goes to oneDNN."""
        return rows * self.shape[0] >= self.onednn_from

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] @ w (+ bias) -> [..., out], by the faster kernel for this many rows."""
        if x.numel() < self.onednn_from:
            y = x @ self.dense
            return y if self.bias is None else y + self.bias
        d_in, d_out = self.shape
        return _onednn_linear(x.reshape(-1, d_in), self.onednn, self.bias).view(*x.shape[:-1], d_out)
