"""How well a step's draft confidence predicts acceptance: its own draft's, against the next step's first draft.

The measured planner decides whether a step drafts at all before any draft of that step exists,
from the confidence of the sequence's previous step's first draft. It first read it through the
calibration's bins, fitted on each draft's own confidence; this benchmark showed how far that is
from the next step's acceptance, and the calibration now fits that relation on its own (its
carry-over, `AcceptanceCalibration.p_carried`). This measures both relations on the same greedy
MTP decode (calibration windows of the held-out files, depth 3 every step, width 16): per bin of
a first draft's top-1 log-prob, how often that draft was accepted and how many tokens its step
emitted, and how often the *next* step's first draft was accepted and how many tokens the next
step emitted.

    python3 benchmarks/studies/confidence_carryover.py   # writes benchmarks/studies/results/confidence_carryover.md
"""

import argparse
import platform
import sys
from pathlib import Path

import torch

from met.engine.runner import ModelRunner, Sampling
from met.model.corpus import calibration_windows
from met.model.recipes import embedded
from met.model.tokenizer import encode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: report.py
from report import publish

EDGES = (0.0, -0.05, -0.2, -0.5, -1.0, -2.0, float("-inf"))  # log-prob bins (upper, lower]
DEPTH, WIDTH, CONTEXT = 3, 16, 256


def decode_steps(model, prompts: list[list[int]], steps: int) -> list[tuple[float, float, bool, int, bool, int]]:
    """Per sequence-step with a step before it: (previous first-draft confidence, own first-draft confidence,
    previous first draft accepted, previous step emitted, own first draft accepted, own step emitted)."""
    rows = []
    for start in range(0, len(prompts), WIDTH):
        batch = prompts[start : start + WIDTH]
        slots = list(range(len(batch)))
        runner = ModelRunner(model, WIDTH, CONTEXT + steps * (DEPTH + 1) + 8)
        runner.prefill(slots, batch, [Sampling()] * len(batch))
        prev: dict[int, tuple[float, bool, int]] = {}
        for _ in range(steps):
            drafts = runner.draft_mtp(slots, [DEPTH] * len(slots))
            results = runner.verify(slots, drafts)
            for slot, draft, result in zip(slots, drafts, results):
                own = (draft.confidences[0], result.accepted >= 1, result.accepted + 1)
                if slot in prev:
                    rows.append((prev[slot][0], own[0], prev[slot][1], prev[slot][2], own[1], own[2]))
                prev[slot] = own
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/studies/results/confidence_carryover.md"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = embedded().load()
    prompts = [encode(t)[:CONTEXT] for t in calibration_windows(args.prompts)]
    rows = decode_steps(model, prompts, args.steps)
    lines = ["# A draft's confidence: what it says about its own acceptance, and about the next step's", "",
             f"Command: `python3 benchmarks/studies/confidence_carryover.py --prompts {args.prompts} --steps {args.steps}`; "
             f"{platform.platform()}, torch {torch.__version__}; {len(prompts)} calibration windows, greedy MTP at "
             f"depth {DEPTH} every step, width {WIDTH}; {len(rows)} sequence-steps with a step before them.", "",
             "| first draft's log-prob | steps | that draft accepted | its step emitted "
             "| next step's first draft accepted | next step emitted |",
             "|---|---:|---:|---:|---:|---:|"]
    for upper, lower in zip(EDGES, EDGES[1:]):
        sel = [r for r in rows if lower < r[0] <= upper]
        if sel:
            n = len(sel)
            lines.append(f"| ({lower:g}, {upper:g}] | {n} | {sum(r[2] for r in sel) / n:.2f} | "
                         f"{sum(r[3] for r in sel) / n:.2f} | {sum(r[4] for r in sel) / n:.2f} | "
                         f"{sum(r[5] for r in sel) / n:.2f} |")
    publish(lines, args.out)


if __name__ == "__main__":
    main()
