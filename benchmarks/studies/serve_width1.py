"""Served tokens/s at width 1: --spec off against --spec mtp (static) and --spec mtp --spec-cost-model measured.

Run: python3 benchmarks/studies/serve_width1.py [--prompts 16] [--max-tokens 128] [--out benchmarks/studies/results/serve_width1.md]

One process, one model, one real server per configuration on loopback (ephemeral ports), all up
at once; the official openai client sends each held-out prompt to every server in turn
(off, mtp, measured, off, mtp, measured, ...), one request at a time (width 1), greedy. A
configuration's figure is its completion tokens over the client-side wall seconds of its
requests (HTTP included, the same for all). The measured server boots exactly as
`met serve --spec mtp --spec-cost-model measured` does (same key checks: a table of another key
exits 78 here too). Greedy outputs must be identical across configurations; the script says so.

Prompts are code the model never trained on: held-out stdlib files, cut from byte 1024 on (the
calibration uses the files' openings), starting at a line boundary.
"""

import argparse
import json
import platform
import sys
import threading
import time
from pathlib import Path

import openai
import torch
import uvicorn

from met.bench.measured_boot import BootError, MeasuredBoot, boot_measured, default_calibration, default_table
from met.engine.identity import RunSettings, apply_threads, box_class, default_device, default_dtype
from met.engine.policy import PolicyConfig
from met.model.corpus import heldout_code
from met.model.recipes import DEFAULT_RECIPE, embedded
from met.serve.app import Service, create_app
from met.serve.server import bound_port
from met.speculative.spec_cost.plan import unknown


def start(service: Service) -> tuple[uvicorn.Server, str]:
    """A started server for the service on 127.0.0.1 (ephemeral port) in a background thread."""
    server = uvicorn.Server(uvicorn.Config(create_app(service), host="127.0.0.1", port=0, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return server, f"http://127.0.0.1:{bound_port(server)}/v1"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default=DEFAULT_RECIPE)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--table", type=Path, help="cost table (default: tables/<box_class>/<recipe>.toml)")
    ap.add_argument("--calibration", type=Path, help="calibration (default: beside the table)")
    ap.add_argument("--slack", type=float, default=0.1)
    ap.add_argument("--energy", default="auto")
    ap.add_argument("--box-class", default=None)
    ap.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu (as met serve)")
    ap.add_argument("--out", type=Path, help="append the markdown result here")
    args = ap.parse_args()

    recipe = embedded(args.recipe)
    device = args.device or default_device()
    settings = RunSettings(args.dtype or default_dtype(device), device, apply_threads(device))
    box = box_class(device, args.box_class)
    table = args.table or default_table(box, recipe.name)
    try:
        state = boot_measured(recipe, settings, MeasuredBoot(table, args.calibration or default_calibration(table),
                                                             args.slack, args.energy, args.box_class))
    except BootError as exc:
        print("\n".join(exc.lines), file=sys.stderr)
        return exc.code
    model = recipe.load(getattr(torch, settings.dtype), settings.device)
    names = (recipe.name,)
    configs = {
        "off": Service.build(model, recipe.id, names, PolicyConfig("off"), 1),
        "mtp (static)": Service.build(model, recipe.id, names, PolicyConfig("mtp"), 1),
        "mtp, measured": Service.build(model, recipe.id, names, PolicyConfig("mtp"), 1, cost_state=state),
    }
    servers = {name: start(svc) for name, svc in configs.items()}
    prompts = heldout_code(args.prompts)
    totals = {name: [0, 0.0] for name in configs}
    texts: dict[str, list[str]] = {name: [] for name in configs}
    for name, (_, url) in servers.items():  # warm-up
        openai.OpenAI(base_url=url, api_key="-").completions.create(model=names[0], prompt="x", max_tokens=4)
    for prompt in prompts:
        for name, (_, url) in servers.items():
            client = openai.OpenAI(base_url=url, api_key="-", max_retries=0, timeout=600)
            t0 = time.perf_counter()
            r = client.completions.create(model=names[0], prompt=prompt, max_tokens=args.max_tokens, temperature=0)
            totals[name][1] += time.perf_counter() - t0
            totals[name][0] += r.usage.completion_tokens
            texts[name].append(r.choices[0].text)
    for server, _ in servers.values():
        server.should_exit = True
    base = totals["off"][0] / totals["off"][1]
    same = all(texts[name] == texts["off"] for name in configs)
    lines = [f"## served tokens/s at width 1 ({recipe.id}, {box}, {settings.threads} threads, torch "
             f"{torch.__version__}, python {platform.python_version()})", "",
             f"`python3 benchmarks/studies/serve_width1.py --prompts {args.prompts} --max-tokens {args.max_tokens}` "
             f"with table {table}; {len(prompts)} held-out code prompts, greedy; outputs identical: {same}", "",
             "| spec | tokens | seconds | tok/s | vs off | accepted drafts per verify | planned depth (why) |",
             "|---|---|---|---|---|---|---|"]
    for name, svc in configs.items():
        tokens, seconds = totals[name]
        snap = svc.scheduler.cell.latest()
        per_verify = snap.drafts_accepted / snap.draft_steps if snap.draft_steps else 0.0
        why = state.plan(unknown(1)).why if name == "mtp, measured" else "-"
        lines.append(f"| {name} | {tokens} | {seconds:.2f} | {tokens / seconds:.1f} | {tokens / seconds / base:.2f}x "
                     f"| {per_verify:.2f} | {why} |")
    text = "\n".join(lines) + "\n"
    print(text)
    print(json.dumps({n: {"tokens": t, "seconds": round(s, 3)} for n, (t, s) in totals.items()}))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("a") as f:
            f.write(text + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
