"""What seeding a sampled request costs its drafts: acceptance by draft position, seeded against unseeded.

A seeded request picks every token as the Gumbel-max of its distribution under noise drawn from
(seed, position) alone (met.engine.accept.position_noise), the drafter's picks included, so its text
is the same under every drafter, depth and batch width; a draft is then kept exactly when it is the
token plain decoding picks. An unseeded request runs the standard speculative rule (keep draft x
with probability min(1, p(x) / q(x)), else sample the residual), which keeps a sampled draft (MTP,
DFlash) more often. Host drafts (prompt lookup) are one-hot: both rules keep them with probability
p(x). This decodes the policies benchmark's held-out prompts at a fixed depth under each rule and
sets their acceptance side by side.

    python3 benchmarks/studies/seeded_acceptance.py [--prompts 16] [--tokens 128] [--rounds 2] [--out FILE]
"""

import argparse
import dataclasses
import platform
import sys
from pathlib import Path

import torch

from met.bench import policies as pol
from met.engine.generate import generate
from met.engine.runner import ModelRunner, Sampling
from met.model.recipes import embedded

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: report.py
from report import publish

CONFIGS = [("mtp", 3), ("prompt-lookup", 4)]
TEMPERATURES = (0.5, 1.0)


def acceptance(model, prompts, spec: str, depth: int, sampling: Sampling, seeds: list[int] | None) -> dict:
    """Per position: steps that verified a draft there, and the share of them whose drafts 1..j were all kept."""
    runner = ModelRunner(model, len(prompts))
    if seeds is not None:  # one seed per request, as a serve gives each request its own
        sampling = [dataclasses.replace(sampling, seed=seed) for seed in seeds]
    outs = generate(runner, prompts, ARGS.tokens, spec, depth, sampling, stop_at_eos=False)
    proposed = [sum(o.proposed_at[j] for o in outs if j < len(o.proposed_at)) for j in range(depth)]
    accepted = [sum(o.accepted_at[j] for o in outs if j < len(o.accepted_at)) for j in range(depth)]
    return {"proposed": proposed, "accepted": accepted}


def main() -> int:
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2, help="runs of every prompt per rule (other seeds each round)")
    ap.add_argument("--out", type=Path)
    ARGS = ap.parse_args()
    torch.set_num_threads(1)
    recipe = embedded()
    model = recipe.load().eval()
    prompts = [list(p) for p in pol.heldout_workload_prompts(ARGS.prompts)]
    lines = ["# Acceptance of seeded and unseeded sampled requests", "",
             f"Command: `python3 {' '.join(sys.argv)}`; recipe `{recipe.id}`; `{platform.platform()}`, torch "
             f"{torch.__version__}; {len(prompts)} held-out prompts (`met bench policies`' workload) x "
             f"{ARGS.tokens} tokens x {ARGS.rounds} rounds per rule, top-p 1.", "",
             "| drafter, depth | temperature | rule | drafts verified | kept at position 1 / 2 / ... | "
             "drafts kept per step that drafted |", "|---|---:|---|---:|---|---:|"]
    for spec, depth in CONFIGS:
        for temperature in TEMPERATURES:
            sampling = Sampling(temperature, 1.0, None)
            for rule in ("unseeded (standard rule)", "seeded (by position)"):
                total = {"proposed": [0] * depth, "accepted": [0] * depth}
                for r in range(ARGS.rounds):
                    seeds = None if rule.startswith("unseeded") else [r * 1000 + i for i in range(len(prompts))]
                    got = acceptance(model, prompts, spec, depth, sampling, seeds)
                    for key in ("proposed", "accepted"):
                        total[key] = [a + b for a, b in zip(total[key], got[key])]
                shares = " / ".join(f"{a / p:.3f}" for a, p in zip(total["accepted"], total["proposed"]) if p)
                lines.append(f"| {spec} {depth} | {temperature} | {rule} | {sum(total['proposed']):,} | {shares} | "
                             f"{sum(total['accepted']) / total['proposed'][0]:.3f} |")  # steps that verified a draft
                print(lines[-1], flush=True)
    return publish(lines, ARGS.out)


if __name__ == "__main__":
    sys.exit(main())
