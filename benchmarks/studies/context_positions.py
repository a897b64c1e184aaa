"""How the embedded model and its MTP module score at each depth into their context, on held-out code.

A model trained on windows of 256 bytes has never seen a position past 256; met serves contexts of
the recipe's max_seq_len (1,024). Greedy decoding from a 256-byte prompt, as the model card's
acceptance and the policies benchmark decode, runs entirely past that point. This scores windows of
--window bytes cut from the held-out files less their near-copies (`corpus.benchmark_files`), one
window per file long enough, from a seeded offset, and scores them as `heldout_quality.py` scores the
whole split (its `score`): per band of the predicted byte's position (the first two of a window are
context), the main model's bits per byte and the MTP module's teacher-forced first-draft acceptance
(its argmax equal to the main model's argmax for the same byte, as train.losses' `accept1`). Each
--weights file is scored on the same windows, so their bands compare directly.

    python3 benchmarks/studies/context_positions.py [--weights FILE ...] [--window 1022] [--out FILE]
"""

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import torch

from met.model.corpus import benchmark_files
from met.model.recipes import embedded
from met.model.weights import file_digest, load_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: report.py
from heldout_quality import score  # this script's folder is on the path when it runs
from report import publish

BANDS = (0, 128, 256, 320, 384, 512, 768, 1024)


def windows(size: int, count: int, seed: int) -> np.ndarray:
    """count windows of size + 2 byte tokens [count, size + 2], one per held-out file long enough, seeded offsets."""
    rng = np.random.default_rng(seed)
    files = [data for data in benchmark_files().values() if len(data) >= size + 2]
    picks = rng.choice(len(files), size=min(count, len(files)), replace=False)
    rows = []
    for i in sorted(picks):
        data = files[i]
        start = int(rng.integers(0, len(data) - size - 1))
        rows.append(np.frombuffer(data[start : start + size + 2], dtype=np.uint8))
    return np.stack(rows)


def by_band(model, x: np.ndarray) -> list[tuple[int, int, float, float]]:
    """(first position, last + 1, bits per byte, first-draft acceptance) per band of the predicted byte's position."""
    n, width = x.shape
    scored = score(model, x.ravel(), width - 2)  # its windows are these, back to back
    main, match = (scored[key].reshape(n, width - 2) for key in ("main", "match"))  # column j: the byte at j + 2
    rows = []
    for lo, hi in zip(BANDS, BANDS[1:]):
        if lo >= width:
            break
        lo, hi = max(lo, 2), min(hi, width)
        rows.append((lo, hi, main[:, lo - 2 : hi - 2].mean() / math.log(2), match[:, lo - 2 : hi - 2].mean()))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", type=Path, nargs="*", default=[],
                    help="safetensors files of the embedded recipe's config (default: the shipped weights)")
    ap.add_argument("--window", type=int, default=1022, help="bytes per window (at most max_seq_len - 2)")
    ap.add_argument("--windows", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="report file (markdown)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    recipe = embedded()
    paths = args.weights or [recipe.weights]
    x = windows(args.window, args.windows, args.seed)
    lines = ["# The embedded model by position in its context", "",
             f"Command: `python3 benchmarks/studies/{Path(__file__).name} {' '.join(sys.argv[1:])}`; {x.shape[0]} "
             f"windows of {args.window} bytes from the held-out files less their near-copies, one per file, seed "
             f"{args.seed}; one torch thread.", "",
             "| weights | positions | bits per byte | MTP first-draft acceptance (teacher-forced) |",
             "|---|---|---:|---:|"]
    for path in paths:
        model = load_model(recipe.config, path).eval()
        for lo, hi, bpb, acc in by_band(model, x):
            lines.append(f"| `{path.name}` ({file_digest(path)}) | {lo}-{hi - 1} | {bpb:.3f} | {acc:.3f} |")
    return publish(lines, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
