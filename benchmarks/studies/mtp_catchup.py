"""What an MTP draft costs after a run of plain steps: catch-up passes by size class against one per sequence.

A plain step leaves the MTP block behind by one row per sequence; the next draft first catches up
on all of them (met.speculative.catchup.catchup_groups decides how rows share passes). Each sample
prefills `width` held-out prompts, drafts and verifies once (row "prompt": not; the draft then
catches up on the whole prompt), takes p plain steps, then times one depth-1 draft, under both
grouping rules in turn (order alternated per repeat); medians. The last plain step before the
draft is timed too, for scale.

    python3 benchmarks/studies/mtp_catchup.py      # prints a markdown table; --out FILE also writes it
"""

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from met.engine import runner as runner_mod
from met.engine.runner import Draft, ModelRunner, Sampling
from met.model.corpus import heldout_code
from met.model.recipes import embedded
from met.model.tokenizer import encode
from met.speculative.catchup import CATCHUP_SHARED_ROWS

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: report.py
from report import publish

PLAIN_STEPS = ("prompt", 0, 1, 4, 16, 32)  # "prompt": the first draft after prefill


def one_pass_each(rows: list[int]) -> list[list[int]]:
    """The rule before size classes: short catch-ups in one pass, every long one in a pass of its own."""
    short = [b for b, r in enumerate(rows) if r <= CATCHUP_SHARED_ROWS]
    return ([short] if short else []) + [[b] for b, r in enumerate(rows) if r > CATCHUP_SHARED_ROWS]


RULES = {"size classes": runner_mod.catchup_groups, "one pass each": one_pass_each}


def sample(model, prompts: list[list[int]], plain: int | str, rule) -> tuple[float, float | None]:
    """Seconds of a depth-1 draft after `plain` plain steps under a catch-up grouping rule; of the last plain step."""
    slots = list(range(len(prompts)))
    runner = ModelRunner(model, len(prompts), max(map(len, prompts)) + 48)
    runner.prefill(slots, prompts, [Sampling()] * len(slots))
    step = None
    if plain != "prompt":
        runner.verify(slots, runner.draft_mtp(slots, [1] * len(slots)))  # the prompts' catch-up done
        for _ in range(plain):
            t = time.perf_counter()
            runner.verify(slots, [Draft([], []) for _ in slots])
            step = time.perf_counter() - t
    runner_mod.catchup_groups = rule
    try:
        t = time.perf_counter()
        runner.draft_mtp(slots, [1] * len(slots))
        return time.perf_counter() - t, step
    finally:
        runner_mod.catchup_groups = RULES["size classes"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", default="4,16")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = embedded().load()
    texts = [encode(t)[:200] for t in heldout_code(16)]
    lines = ["# MTP draft after p plain steps: catch-up passes by size class vs one per sequence", "",
             f"Command: `python3 benchmarks/studies/mtp_catchup.py --widths {args.widths} --repeats {args.repeats}`; "
             f"{platform.platform()}, torch {torch.__version__}, 1 thread; held-out prompts of 200 tokens; "
             "median ms of a depth-1 draft.", "",
             "| width | plain steps before | size classes ms | one pass each ms | one pass each / size classes "
             "| a plain step ms |",
             "|---:|---:|---:|---:|---:|---:|"]
    for width in (int(w) for w in args.widths.split(",")):
        prompts = texts[:width]
        for plain in PLAIN_STEPS:
            got: dict[str, list[float]] = {name: [] for name in RULES}
            steps: list[float] = []
            for r in range(args.repeats):
                for name in (list(RULES) if r % 2 == 0 else list(RULES)[::-1]):
                    draft_s, step_s = sample(model, prompts, plain, RULES[name])
                    got[name].append(draft_s)
                    steps += [step_s] if step_s is not None else []
            new, old = (statistics.median(got[n]) * 1e3 for n in RULES)
            step = f"{statistics.median(steps) * 1e3:.2f}" if steps else "-"
            lines.append(f"| {width} | {plain} | {new:.2f} | {old:.2f} | {old / new:.2f}x | {step} |")
            print(lines[-1], flush=True)
    publish(lines, args.out)


if __name__ == "__main__":
    main()
