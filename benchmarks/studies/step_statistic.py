"""Which per-run statistic of a decode's steps prices a step: the median step, or the mean (total over steps).

`met bench spec-cost` times each cell of the cost table as short real decodes (met.bench.loop_sweep)
and reduces each decode's counted steps to one figure, then takes the median of those figures over
repeats. What a decode pays is its total time, so a step's price is the mean; the median leaves out
each step's share of the slow steps. The two differ by depth if slow steps come per step rather than
per second of work: then a plain decode, with more steps per token, pays more of them. This runs the
sweep's own cells (loop_sweep.run_cell) at one width, every depth, interleaved over --repeats, and
prints per depth the median over runs of each run's median step and of each run's mean step, and
each depth's step cost relative to plain decode both ways.

    python3 benchmarks/studies/step_statistic.py [--width 1] [--repeats 12] [--out FILE]
"""

import argparse
import platform
import statistics
import sys
from pathlib import Path

import torch

from met.bench.loop_sweep import LOOP_TOKENS, run_cell, run_figures
from met.engine.runner import ModelRunner
from met.model.corpus import heldout_prompts
from met.model.recipes import embedded
from met.model.tokenizer import encode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: report.py
from report import publish


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=12)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(1)
    recipe = embedded("met-tiny-py")
    model = recipe.load(torch.float32, "cpu")
    prompts = [encode(p) for p in heldout_prompts(args.width, prompt_bytes=256)]  # as the sweep's cells take them
    runner = ModelRunner(model, args.width)
    depths = range(recipe.config.mtp_depth + 1)
    runs: dict[int, list[tuple[float, float]]] = {k: [] for k in depths}  # per depth: (median, mean) step per run
    for k in depths:
        run_cell(runner, recipe.id, prompts, k)  # warm-up
    for repeat in range(args.repeats):
        for k in depths if repeat % 2 == 0 else reversed(depths):
            steps = run_cell(runner, recipe.id, prompts, k).steps
            # the mean as the sweep takes it (run_figures: draft and verify), the median beside it
            runs[k].append((statistics.median(draft + rest for draft, rest in steps), sum(run_figures(steps))))
    by_median = {k: statistics.median(m for m, _ in r) for k, r in runs.items()}
    by_mean = {k: statistics.median(m for _, m in r) for k, r in runs.items()}
    lines = ["# A decode's step: its median against its mean", "",
             f"Command: `python3 {' '.join(sys.argv)}`; recipe `{recipe.id}`; `{platform.platform()}`, torch "
             f"{torch.__version__}, 1 thread; width {args.width}, {LOOP_TOKENS} tokens per request, "
             f"{args.repeats} runs per depth, depths interleaved; a step is its draft plus the rest of its tick.", "",
             "| depth | median step ms | mean step ms | mean / median | x plain, by medians | x plain, by means |",
             "|---:|---:|---:|---:|---:|---:|"]
    for k in depths:
        lines.append(f"| {k} | {by_median[k] * 1e3:.3f} | {by_mean[k] * 1e3:.3f} | {by_mean[k] / by_median[k]:.3f} | "
                     f"{by_median[k] / by_median[0]:.3f} | {by_mean[k] / by_mean[0]:.3f} |")
    return publish(lines, args.out)


if __name__ == "__main__":
    sys.exit(main())
