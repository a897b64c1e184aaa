"""Whether torch.compile makes the embedded model's decode and verify steps cheaper on this CPU.

A step's forward is one graph here: the embedding, six layers over a KV cache held in the module
(a fixed length of --cache positions, so the graph's shapes never change: a masked attention over
all of them, the step's keys and values written in place) and the head. The same module runs
eagerly and compiled by inductor three ways: its defaults; with `freezing` (weights as constants,
prepacked) and `cpp_wrapper` (the graph called from C++, not Python); and with those plus
max-autotune's C++ GEMM template, which generates AVX-512 micro-kernels for the products instead
of calling MKL. Beside them, met's eager cached path (`Transformer.hidden` over a KVCache, reads
up to the context's length only) on the same context. Each at one token (a decode step) and five
(a verify of four drafts), the minimum of --repeats windows of one torch thread, and each
compiled variant's compile seconds (first call).

    python3 benchmarks/studies/compiled_step.py [--cache 256] [--context 180]
    # writes benchmarks/studies/results/compiled_step.md
"""

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from met.engine.identity import box_class, device_name
from met.model.kv_cache import KVCache
from met.model.recipes import embedded
from met.model.transformer import CacheContext, Transformer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: report.py
from report import publish

OUT = Path(__file__).parent / "results" / "compiled_step.md"
VARIANTS = {
    "inductor": {},
    "inductor, freezing, cpp_wrapper": {"freezing": True, "cpp_wrapper": True},
    "inductor, freezing, cpp_wrapper, C++ GEMM template": {
        "freezing": True, "cpp_wrapper": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP"},
}


class Step(torch.nn.Module):
    """One cached forward of the fused model with its KV cache inside: fixed shapes for a given token count."""

    def __init__(self, model: Transformer, cache_len: int):
        super().__init__()
        cfg = model.cfg
        self.heads, self.head_dim, self.floor = cfg.n_heads, cfg.head_dim, float(model._rms_floor)
        self.weights = torch.nn.ParameterList(
            torch.nn.Parameter(getattr(f, name).dense.clone(), requires_grad=False)
            for f in model._fused for name in ("wqkv", "wo", "w13", "w2"))
        self.head = torch.nn.Parameter(model._head.dense.clone(), requires_grad=False)
        self.embed = torch.nn.Parameter(model.model.embed_tokens.weight.detach().clone(), requires_grad=False)
        self.register_buffer("kv", torch.zeros(cfg.n_layers, 1, 2 * cfg.n_kv_heads, cache_len, cfg.head_dim))
        half = cfg.head_dim // 2  # the fused q and k features are in RoPE pair order (rope_pair_order)
        self.register_buffer("cos", model.rope_cos[:, :half].clone())
        self.register_buffer("sin", model.rope_sin[:, :half].clone())

    def _unit(self, x):
        return x / torch.sqrt((x * x).sum(-1, keepdim=True) + self.floor ** 2)

    def forward(self, tokens, pos, mask):
        B, T = tokens.shape
        H, hd = self.heads, self.head_dim
        x = self.embed[tokens]
        cos, sin = self.cos[pos][:, :, None], self.sin[pos][:, :, None]
        for i in range(self.kv.shape[0]):
            wqkv, wo, w13, w2 = self.weights[4 * i : 4 * i + 4]
            qkv = (self._unit(x) @ wqkv).view(B, T, 3 * H, hd)
            pairs = qkv[:, :, : 2 * H].unflatten(-1, (-1, 2))
            re, im = pairs[..., 0], pairs[..., 1]
            qk = torch.stack([re * cos - im * sin, re * sin + im * cos], -1).flatten(-2)
            self.kv[i].index_copy_(2, pos[0], torch.cat([qk[:, :, H:], qkv[:, :, 2 * H :]], 2).transpose(1, 2))
            a = F.scaled_dot_product_attention(qk[:, :, :H].transpose(1, 2), self.kv[i, :, :H], self.kv[i, :, H:],
                                               attn_mask=mask)
            x = x + a.transpose(1, 2).reshape(B, T, H * hd) @ wo
            gate, up = (self._unit(x) @ w13).chunk(2, -1)
            x = x + (F.silu(gate) * up) @ w2
        return self._unit(x) @ self.head


def _best(f, repeats: int, calls: int = 30) -> float:
    best = float("inf")
    for _ in range(repeats):
        f()
        start = time.thread_time()
        for _ in range(calls):
            f()
        best = min(best, (time.thread_time() - start) / calls)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=int, default=256, help="cache positions the compiled graph attends over")
    ap.add_argument("--context", type=int, default=180, help="tokens already in the cache")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--out", type=Path, default=OUT, help="report (default: benchmarks/studies/results/compiled_step.md)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    import torch._inductor.config as inductor

    model = embedded().load()
    model.fuse()
    step = Step(model, args.cache).eval()
    cache = KVCache.allocate(model.cfg.n_layers + 1, 1, args.cache, model.cfg.n_kv_heads, model.cfg.head_dim)
    rows, inputs = {}, {}
    for T in (1, 5):
        pos = torch.arange(args.context, args.context + T)[None]
        mask = torch.full((1, 1, T, args.cache), float("-inf"))
        for t in range(T):
            mask[0, 0, t, : args.context + t + 1] = 0
        inputs[T] = (torch.full((1, T), 65), pos, mask)
        ctx = CacheContext.build(cache, [0], pos)
        with torch.inference_mode():
            rows[T] = {"met's eager cached path": _best(
                lambda: model.logits_cached(model.hidden(inputs[T][0], ctx)), args.repeats)}
            rows[T]["the module, eager"] = _best(lambda: step(*inputs[T]), args.repeats)
    compile_s = {}
    for name, settings in VARIANTS.items():
        torch._dynamo.reset()
        with inductor.patch(settings), torch.inference_mode():
            compiled = torch.compile(step, dynamic=False)
            for T in (1, 5):
                start = time.perf_counter()
                compiled(*inputs[T])
                compile_s[name, T] = time.perf_counter() - start
                rows[T][name] = _best(lambda: compiled(*inputs[T]), args.repeats)
        print(name, {T: round(rows[T][name] * 1e3, 3) for T in rows}, flush=True)
    lines = ["| step | 1 token ms | 5 tokens ms | 5 / 1 | compile s (1 token, 5 tokens) |", "|---|---:|---:|---:|---|"]
    for name in rows[1]:
        c = f"{compile_s[name, 1]:.0f}, {compile_s[name, 5]:.0f}" if (name, 1) in compile_s else ""
        lines.append(f"| {name} | {rows[1][name] * 1e3:.3f} | {rows[5][name] * 1e3:.3f} | "
                     f"{rows[5][name] / rows[1][name]:.2f} | {c} |")
    return publish([
        "# torch.compile and the embedded model's steps on a CPU",
        "",
        f"`python3 benchmarks/studies/compiled_step.py --cache {args.cache} --context {args.context} --repeats "
        f"{args.repeats}` on `{box_class('cpu', threads=1)}` ({device_name('cpu')}), torch {torch.__version__}, one "
        f"thread: a forward and the head at {args.context} cached tokens, the minimum of {args.repeats} windows.",
        "",
        *lines,
    ], args.out)


if __name__ == "__main__":
    raise SystemExit(main())
