"""What one MTP draft pass costs at width 1 against a plain decode step, and what picking its top-1 costs.

Run: python3 benchmarks/studies/draft_pass.py [--repeats 9] [--out FILE]

One sequence of 190 cached tokens of the embedded recipe, one torch thread. Each figure is the least
thread time per call over `--repeats` windows of many calls (the box's other work inflates some
windows, never deflates one):
- plain: ModelRunner.verify with no drafts (a decode step), rolled back after each call;
- draft: ModelRunner.draft_mtp at depth 1 after a verify that accepted one draft (two catch-up rows
  folded into the pass), and at depth 4 (three more passes);
- top-1: the likeliest token and its log-probability of a [1, 258] row, by log_softmax then max (what
  the runner does) and by max, logsumexp and their difference.
"""

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from report import publish  # noqa: E402

from met.engine.identity import box_class  # noqa: E402
from met.engine.runner import Draft, ModelRunner, Sampling  # noqa: E402
from met.model.recipes import embedded  # noqa: E402

OUT = Path(__file__).parent / "results" / "draft_pass.md"
PROMPT = list(b'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n < 2:\n        return n\n' * 2)


def best(f, calls: int, repeats: int) -> float:
    """The least thread time per call of f over `repeats` windows of `calls` calls (after a warm-up window)."""
    for _ in range(calls):
        f()
    times = []
    for _ in range(repeats):
        start = time.thread_time()
        for _ in range(calls):
            f()
        times.append((time.thread_time() - start) / calls)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--out", type=Path, default=OUT, help="report (default: benchmarks/studies/results/draft_pass.md)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    model = embedded().load()
    runner = ModelRunner(model, max_batch=1, max_len=1024)
    runner.prefill([0], [PROMPT], [Sampling()])
    seq = runner.seqs[0]

    def plain():
        length = runner.length(0)
        runner.verify([0], [Draft([], [])])
        runner.cache.rollback(0, length)
        seq.catchup_h, seq.catchup_ids = [], []

    rows = torch.zeros(2, model.cfg.dim)

    def draft(depth: int):
        def f():
            seq.catchup_h, seq.catchup_ids = [rows], [[65, 66]]
            runner.cache.mtp_lengths[0] = runner.length(0) - 2
            runner.draft_mtp([0], [depth])
        return f

    x = torch.randn(1, model.cfg.vocab_size)

    def top_softmax():
        top = x.log_softmax(-1).max(-1)
        return top.indices.tolist(), top.values.tolist()

    def top_logsumexp():
        top = x.max(-1)
        return top.indices.tolist(), (top.values - x.logsumexp(-1)).tolist()

    plain_s = best(plain, 200, args.repeats)
    d1, d4 = best(draft(1), 200, args.repeats), best(draft(4), 100, args.repeats)
    t_soft, t_lse = best(top_softmax, 2000, args.repeats), best(top_logsumexp, 2000, args.repeats)
    return publish([
        f"# One MTP draft pass against a plain step ({box_class()}, `python3 benchmarks/studies/draft_pass.py`)",
        "",
        "| step | us | x plain |",
        "|---|---:|---:|",
        f"| plain decode step (verify, k = 0) | {plain_s * 1e6:.0f} | 1.00 |",
        f"| MTP draft, depth 1 (two catch-up rows in the pass) | {d1 * 1e6:.0f} | {d1 / plain_s:.2f} |",
        f"| each further MTP pass (depth 4 less depth 1, over 3) | {(d4 - d1) / 3 * 1e6:.0f} | "
        f"{(d4 - d1) / 3 / plain_s:.2f} |",
        "",
        f"top-1 of a [1, {model.cfg.vocab_size}] row: log_softmax then max {t_soft * 1e6:.1f} us; max, logsumexp and "
        f"difference {t_lse * 1e6:.1f} us.",
    ], args.out)


if __name__ == "__main__":
    raise SystemExit(main())
