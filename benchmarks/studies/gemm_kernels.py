"""Which CPU kernel multiplies the embedded model's projections faster, by row count: MKL (x @ w) or oneDNN.

A decode step multiplies one row per sequence by each projection; a verify of k drafts k + 1 rows.
This times both kernels on every projection shape of the embedded model (and on all 24 of a
step's products in turn, the weights then streaming from the last-level cache as in a step), in
alternating windows of one torch thread, the minimum window of each. `met.model.packed` sends a
product to oneDNN by this CPU's rule (packed.RULE: by product size, or on an Intel CPU by weight size);
the last column says which kernel that rule picks, so a row where it picks the slower one shows
where the rule is off on this box.

    python3 benchmarks/studies/gemm_kernels.py [--rows 1,2,3,4,5,8,16,80]
    # writes benchmarks/studies/results/gemm_kernels.md (training or other work on the box inflates oneDNN's
    # fixed cost per call most: run it on a quiet box)
"""

import argparse
import sys
import time
from pathlib import Path

import torch

from met.engine.identity import box_class, device_name
from met.model.packed import ONEDNN_ONLY, RULE, PackedWeight, _onednn_linear, onednn_usable
from met.model.recipes import embedded

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: report.py
from report import publish

OUT = Path(__file__).parent / "results" / "gemm_kernels.md"


def _window(f, calls: int) -> float:
    f()
    start = time.thread_time()
    for _ in range(calls):
        f()
    return (time.thread_time() - start) / calls


def _best(fs: dict, calls: int, repeats: int) -> dict:
    """The minimum window of each callable, windows alternating between them, the order rotated every repeat (what
    runs after oneDNN's layout finds the caches holding that layout, not MKL's)."""
    best = dict.fromkeys(fs, float("inf"))
    names = list(fs)
    for r in range(repeats):
        for name in names[r % len(names):] + names[: r % len(names)]:
            best[name] = min(best[name], _window(fs[name], calls))
    return best


def _both(w: PackedWeight) -> PackedWeight:
    """The weight with both layouts, whichever kernel the rule gives it."""
    onednn = w.onednn if w.onednn is not None else torch.ops.mkldnn._reorder_linear_weight(w.dense.t().contiguous(), 16)
    return PackedWeight(w.shape, w.dense, onednn, w.bias)


def _kernels(w: PackedWeight, x: torch.Tensor) -> dict:
    """The product x @ w by MKL, by oneDNN, and by the kernel met.model.packed's rule picks."""
    both = _both(w)
    return {"mkl": lambda: x @ both.dense, "onednn": lambda: _onednn_linear(x, both.onednn, w.bias), "rule": lambda: w(x)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,2,3,4,5,8,16,80")
    ap.add_argument("--big-rows", default="1,2,5,16", help="row counts of the checkpoint-sized products")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--out", type=Path, default=OUT, help="report (default: benchmarks/studies/results/gemm_kernels.md)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if not onednn_usable(torch.zeros(1)):
        sys.exit("this torch has no oneDNN: nothing to compare")
    model = embedded().load()
    model.fuse()
    layer = model._fused[0]
    weights = {"q/k/v": layer.wqkv, "output": layer.wo, "gate/up": layer.w13, "down": layer.w2, "head": model._head}
    rows = [int(r) for r in args.rows.split(",")]
    lines = ["| product | rows | MKL us | oneDNN us | oneDNN / MKL | the rule picks |", "|---|---:|---:|---:|---:|---|"]
    totals = ["| rows | MKL us | oneDNN us | by the rule us | the rule / MKL |", "|---:|---:|---:|---:|---:|"]
    step = [w for f in model._fused for w in (f.wqkv, f.wo, f.w13, f.w2)]
    for m in rows:
        for name, w in weights.items():
            x = torch.randn(m, w.shape[0])
            t = _best(_kernels(w, x), calls=200, repeats=args.repeats)
            pick = "oneDNN" if w.uses_onednn(m) else "MKL"
            lines.append(f"| {name} [{w.shape[0]}, {w.shape[1]}] | {m} | {t['mkl'] * 1e6:.1f} | "
                         f"{t['onednn'] * 1e6:.1f} | {t['onednn'] / t['mkl']:.2f} | {pick} |")
        xs = {d: torch.randn(m, d) for d in {w.shape[0] for w in step}}
        kernels = [_kernels(w, xs[w.shape[0]]) for w in step]
        t = _best({name: lambda name=name: [k[name]() for k in kernels] for name in ("mkl", "onednn", "rule")},
                  calls=20, repeats=args.repeats)
        totals.append(f"| {m} | {t['mkl'] * 1e6:.0f} | {t['onednn'] * 1e6:.0f} | {t['rule'] * 1e6:.0f} | "
                      f"{t['rule'] / t['mkl']:.2f} |")
        print(totals[-1], flush=True)
    big = ["| product | rows | MKL us | oneDNN us | oneDNN / MKL | the rule picks |", "|---|---:|---:|---:|---:|---|"]
    for d_in, d_out in ((896, 1152), (896, 4864), (4864, 896), (2048, 8192)):  # a 0.5B and a 1B checkpoint's
        weight = torch.randn(d_in, d_out)
        w = PackedWeight.of(weight)
        full = _both(PackedWeight(weight.shape, weight))
        for m in (int(r) for r in args.big_rows.split(",")):
            x = torch.randn(m, d_in)
            t = _best(_kernels(full, x), calls=20, repeats=args.repeats)
            big.append(f"| [{d_in}, {d_out}] | {m} | {t['mkl'] * 1e6:.0f} | {t['onednn'] * 1e6:.0f} | "
                       f"{t['onednn'] / t['mkl']:.2f} | {'oneDNN' if w.uses_onednn(m) else 'MKL'} |")
        print(big[-1], flush=True)
    return publish([
        "# MKL or oneDNN for the embedded model's projections, by rows",
        "",
        f"`python3 benchmarks/studies/gemm_kernels.py --rows {args.rows} --repeats {args.repeats}` on "
        f"`{box_class('cpu', threads=1)}` ({device_name('cpu')}), "
        f"torch {torch.__version__}, one thread: the minimum of {args.repeats} alternating windows, hot caches "
        "except the step's 24 products (their weights stream from the last-level cache as in a step). "
        f"The rule: {RULE.name}.",
        "",
        "A step's 24 products (6 layers x 4 projections) in turn:",
        "",
        *totals,
        "",
        "Each product alone:",
        "",
        *lines,
        "",
        f"Checkpoint-sized products (a weight of {ONEDNN_ONLY} elements or more goes to oneDNN at every row count, "
        "and its [in, out] copy is not kept):",
        "",
        *big,
    ], args.out)


if __name__ == "__main__":
    raise SystemExit(main())
