"""Decode benchmark: plain and speculative tokens/s at widths 1, 4, 16, and host overhead at width 1.

Run: python3 benchmarks/decode.py [--tokens 96] [--repeats 3] [--out benchmarks/results/<box_class>/decode.md]

Every configuration runs the same held-out prompts through the same engine, interleaved over
repeats (A B C A B C ...), and reports the median. tokens/s counts decode time alone, from a request's
first step to its last (as `met generate --json` reports it): prefill is left out. "x plain" is the
median over repeats of each repeat's ratio to plain decode in the same repeat, with the least and
greatest of those ratios; the greedy texts of every configuration are compared with plain decode's.
"Outside forward" is the share of step wall time not spent inside the model's forward calls (embedding, layers,
heads of the target and the MTP module, cached or not): tensor set-up, acceptance, bookkeeping.
"""

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from met.engine.generate import generate
from met.engine.identity import box_class, device_name
from met.engine.runner import ModelRunner
from met.model.corpus import heldout_prompts
from met.model.recipes import embedded
from met.model.tokenizer import encode

# The model's forward entry points, uncached and cached (the engine's path: packed heads, MTP rows)
FORWARDS = ("hidden", "logits", "mtp_hidden", "mtp_logits", "logits_cached", "mtp_logits_cached", "mtp_input",
            "mtp_hidden_from")


class ForwardTimer:
    """Wraps the model's forward entry points and records the wall-time interval of every outermost call (one entry
    point calling another, as mtp_hidden calls mtp_hidden_from, is timed once)."""

    def __init__(self, model):
        self.model, self.intervals, self.depth = model, [], 0

    def __enter__(self):
        for name in FORWARDS:
            fn = getattr(self.model, name)

            def timed(*a, _fn=fn, **k):
                t = time.perf_counter()
                self.depth += 1
                try:
                    out = _fn(*a, **k)
                finally:
                    self.depth -= 1
                if not self.depth:
                    self.intervals.append((t, time.perf_counter()))
                return out

            setattr(self.model, name, timed)
        return self

    def __exit__(self, *exc):
        for name in FORWARDS:
            delattr(self.model, name)

    def inside(self, start: float, end: float) -> float:
        """Seconds of forward calls that began within [start, end]."""
        return sum(b - a for a, b in self.intervals if start <= a <= end)


def run(model, prompts, width, spec, depth, tokens):
    """(tokens/s, accepted drafts per step, the texts) generating `tokens` per prompt, `width` prompts at a time."""
    runner = ModelRunner(model, max_batch=width)
    emitted, wall, steps, accepted, texts = 0, 0.0, 0, 0, []
    for i in range(0, len(prompts), width):
        outs = generate(runner, prompts[i : i + width], tokens, spec, depth, stop_at_eos=False)
        emitted += sum(len(o.tokens) for o in outs)
        wall += outs[0].decode_s
        steps += sum(o.steps for o in outs)
        accepted += sum(o.accepted for o in outs)
        texts += [o.tokens for o in outs]
    return emitted / wall, accepted / max(1, steps), texts


def outside_share(model, prompts, spec, depth, tokens) -> float:
    """Share of width-1 decode wall time spent outside the model's forward calls."""
    runner = ModelRunner(model, 1)
    wall = forward = 0.0
    with ForwardTimer(model) as ft:
        for p in prompts:
            out = generate(runner, [p], tokens, spec, depth, stop_at_eos=False)[0]
            end = time.perf_counter()
            wall += out.decode_s
            forward += ft.inside(end - out.decode_s, end)
    return 1 - forward / wall


CONFIGS = [("off", 0), ("mtp", 1), ("mtp", 2), ("mtp", 3), ("mtp", 4), ("prompt-lookup", 4)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=96, help="tokens generated per prompt")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=16, help="held-out prompts (width 1 and 4 use 4 of them)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--widths", default="1,4,16", help="comma-separated widths (default: 1,4,16)")
    ap.add_argument("--out", type=Path,
                    help="report (default: benchmarks/results/<box_class>/decode.md; its JSON beside it)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    box = box_class("cpu", threads=args.threads)
    args.out = args.out or Path("benchmarks/results") / box / "decode.md"
    recipe = embedded()
    model = recipe.load()
    prompts = [encode(p) for p in heldout_prompts(args.prompts, prompt_bytes=200)]
    widths = [int(w) for w in args.widths.split(",")]
    configs = [(w, s, d) for w in widths for s, d in CONFIGS]
    rates: dict = {c: [] for c in configs}
    accepts: dict = {}
    texts: dict = {}
    for _ in range(args.repeats):  # interleaved: every config once per repeat
        for c in configs:
            w, s, d = c
            rate, acc, texts[c] = run(model, prompts[: max(w, 4)], w, s, d, args.tokens)
            rates[c].append(rate)
            accepts[c] = acc
    outside = {(s, d): outside_share(model, prompts[:4], s, d, args.tokens) for s, d in (("off", 0), ("mtp", 3))}
    lines = [
        "# Decode: plain and speculative tokens/s by width",
        "",
        f"Command: `python3 {' '.join(sys.argv)}`",
        "",
        f"Machine: box_class `{box}`, device `{device_name('cpu')}`, `{platform.platform()}`, "
        f"{torch.get_num_threads()} torch thread(s), torch {torch.__version__}; "
        f"recipe `{recipe.id}`; {args.tokens} tokens per prompt, {args.repeats} interleaved repeats, median.",
        "",
        "| width | drafting | depth | tokens/s | spread | x plain | x plain, least..greatest | accepted drafts/step "
        "| texts as plain |",
        "|---:|---|---:|---:|---:|---:|---|---:|---|",
    ]
    result = {"command": " ".join(sys.argv), "box_class": box, "recipe": recipe.id, "rows": [], "outside_forward_share": {}}
    for w in widths:
        plain = rates[(w, "off", 0)]
        for s, d in CONFIGS:
            r = rates[(w, s, d)]
            med = statistics.median(r)
            spread = (max(r) - min(r)) / med
            paired = [a / b for a, b in zip(r, plain)]  # each repeat's ratio to plain decode in the same repeat
            ratio = statistics.median(paired)
            same = texts[(w, s, d)] == texts[(w, "off", 0)]
            lines.append(f"| {w} | {s} | {d} | {med:.1f} | {spread:.0%} | {ratio:.2f} | "
                         f"{min(paired):.2f}..{max(paired):.2f} | {accepts[(w, s, d)]:.2f} | {'yes' if same else 'NO'} |")
            result["rows"].append({"width": w, "spec": s, "depth": d, "tokens_per_s": med, "spread": spread,
                                   "vs_plain": ratio, "vs_plain_range": [min(paired), max(paired)],
                                   "accepted_per_step": accepts[(w, s, d)], "texts_as_plain": same})
    lines += ["", "Share of width-1 decode step wall time outside the model forward (bookkeeping, tensors, acceptance):", ""]
    for (s, d), share in outside.items():
        lines.append(f"- {s} depth {d}: {share:.1%}")
        result["outside_forward_share"][f"{s}-{d}"] = share
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
