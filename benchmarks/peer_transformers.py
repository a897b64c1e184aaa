"""met against Hugging Face transformers on the same weights and prompts, width 1, greedy.

Run: python3 benchmarks/peer_transformers.py [--prompts 8] [--tokens 128] [--repeats 3] [--device cuda]

The embedded recipe's main model is exported as a LlamaForCausalLM checkpoint; transformers'
generate runs it plain, with prompt lookup and with assisted generation by the embedded draft model
(`--draft-model`, exported the same way), met runs it plain and with its speculation (MTP at depths
1..4, the same draft model at depths 1..3, and prompt lookup); both engines' prompt lookup runs at each of LOOKUP_DEPTHS
drafts per step (met's also with --lookup-min-ngram 3), and each side's best is compared. Each engine runs the same held-out prompts,
interleaved prompt by prompt within each repeat; tokens/s is generated tokens over wall time of the
whole generate call (prefill included for both). The greedy texts are compared token by token.
"""

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

from interleave import interleaved
from met.engine.generate import generate
from met.engine.identity import box_class, device_name
from met.engine.runner import ModelRunner
from met.model.corpus import heldout_prompts
from met.model.hf_export import export_hf
from met.model.recipes import embedded
from met.model.tokenizer import encode


LOOKUP_DEPTHS = (2, 4, 10)  # most drafts per step of prompt lookup (transformers' default is 10)
HF_DEFAULT = "transformers prompt lookup (10)"
STRICT = 3  # met's --lookup-min-ngram for its second set of prompt-lookup runs


def hf_generate(hf, prompt: list[int], tokens: int, lookup: int | None, assistant=None) -> tuple[list[int], float]:
    """transformers' greedy generate (assistant: a draft model's assisted generation); returns (new tokens, seconds)."""
    ids = torch.tensor([prompt], device=hf.device)
    kwargs = {"prompt_lookup_num_tokens": lookup} if lookup else {}
    if assistant is not None:
        kwargs["assistant_model"] = assistant
    t = time.perf_counter()
    with torch.inference_mode():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens, min_new_tokens=tokens,
                          do_sample=False, eos_token_id=None, pad_token_id=0, **kwargs)
    return out[0, len(prompt) :].tolist(), time.perf_counter() - t


def met_generate(runner, prompt: list[int], tokens: int, spec: str, depth: int,
                 lookup_min: int = 1) -> tuple[list[int], float]:
    """met's generate at width 1; returns (new tokens, seconds including prefill)."""
    t = time.perf_counter()
    out = generate(runner, [prompt], tokens, spec, depth, stop_at_eos=False, lookup_min=lookup_min)[0]
    return out.tokens, time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="where both engines run, in float32 (cpu, cuda)")
    ap.add_argument("--draft-model", default="met-tiny-py-draft", help="embedded draft model of both engines")
    ap.add_argument("--out", type=Path,
                    help="report (default: benchmarks/results/<box_class>/peer_transformers.md; JSON beside it)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    box = box_class(args.device, threads=args.threads)
    args.out = args.out or Path("benchmarks/results") / box / "peer_transformers.md"
    recipe = embedded()
    model = recipe.load(torch.float32, args.device)
    runner = ModelRunner(model, 1)
    small = embedded(args.draft_model).load(torch.float32, args.device)
    drafting = ModelRunner(model, 1, track_mtp=False, draft_model=small)
    hf = transformers.LlamaForCausalLM.from_pretrained(export_hf(model, Path(tempfile.mkdtemp())))
    hf = hf.to(args.device).eval()
    hf_small = transformers.LlamaForCausalLM.from_pretrained(export_hf(small, Path(tempfile.mkdtemp())))
    hf_small = hf_small.to(args.device).eval()
    prompts = [encode(p) for p in heldout_prompts(args.prompts, prompt_bytes=256)]
    engines = {
        "transformers plain": lambda p: hf_generate(hf, p, args.tokens, None),
        **{f"transformers prompt lookup ({d})": (lambda p, d=d: hf_generate(hf, p, args.tokens, d))
           for d in LOOKUP_DEPTHS},
        f"transformers assisted ({args.draft_model})": lambda p: hf_generate(hf, p, args.tokens, None, hf_small),
        "met plain": lambda p: met_generate(runner, p, args.tokens, "off", 0),
        **{f"met draft model depth {d}": (lambda p, d=d: met_generate(drafting, p, args.tokens, "draft", d))
           for d in (1, 2, 3)},
        **{f"met mtp depth {d}": (lambda p, d=d: met_generate(runner, p, args.tokens, "mtp", d)) for d in (1, 2, 3, 4)},
        **{f"met prompt lookup ({d})": (lambda p, d=d: met_generate(runner, p, args.tokens, "prompt-lookup", d))
           for d in LOOKUP_DEPTHS},
        # --lookup-min-ngram 3: only a match of 3+ tokens drafts (transformers' lookup has no such setting)
        **{f"met prompt lookup ({d}, matches of {STRICT}+)":
           (lambda p, d=d: met_generate(runner, p, args.tokens, "prompt-lookup", d, STRICT)) for d in LOOKUP_DEPTHS},
    }
    for p in prompts[:1]:  # warm-up: first calls pay one-off costs
        for run in engines.values():
            run(p)
    timed = interleaved(engines, prompts, args.repeats)
    rates, texts = timed.rates, timed.texts
    med = {name: statistics.median(r) for name, r in rates.items()}
    reference = texts["transformers plain"]
    agree = {name: sum(a == b for a, b in zip(outs, reference)) for name, outs in texts.items()}
    best_met = max((n for n in med if n.startswith("met ") and n != "met plain"), key=med.get)
    best_hf = max((n for n in med if n.startswith("transformers prompt lookup")), key=med.get)
    assisted = f"transformers assisted ({args.draft_model})"
    ratios = {
        "met plain / transformers plain": med["met plain"] / med["transformers plain"],
        f"met best speculation ({best_met}) / transformers prompt lookup at its default ({HF_DEFAULT})":
            med[best_met] / med[HF_DEFAULT],
        f"met best speculation ({best_met}) / transformers' best prompt lookup ({best_hf})":
            med[best_met] / med[best_hf],
        "met mtp depth 3 / met plain": med["met mtp depth 3"] / med["met plain"],
        "met draft model depth 2 / met plain": med["met draft model depth 2"] / med["met plain"],
        f"met draft model depth 2 / {assisted}": med["met draft model depth 2"] / med[assisted],
    }
    lines = [
        "# met against transformers on the same weights (width 1, greedy)",
        "",
        f"Command: `python3 {' '.join(sys.argv)}`",
        "",
        f"Machine: `{platform.platform()}`, device {device_name(args.device)}, {torch.get_num_threads()} torch "
        f"thread(s), torch {torch.__version__}, "
        f"transformers {transformers.__version__}; recipe `{recipe.id}`; {len(prompts)} held-out prompts x "
        f"{args.tokens} tokens, {args.repeats} repeats interleaved prompt by prompt, median.",
        "",
        "| engine | tokens/s | spread | x transformers plain | texts equal to transformers plain |",
        "|---|---:|---:|---:|---:|",
    ]
    base = med["transformers plain"]
    for name, r in rates.items():
        lines.append(f"| {name} | {med[name]:.1f} | {(max(r) - min(r)) / med[name]:.0%} | {med[name] / base:.2f} | "
                     f"{agree[name]}/{len(prompts)} |")
    lines += ["", *(f"- {k}: **{v:.2f}x**" for k, v in ratios.items())]
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps(
        {"command": " ".join(sys.argv), "box_class": box, "recipe": recipe.id, "tokens_per_s": rates, "median": med,
         "texts_equal": agree, "ratios": ratios}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
