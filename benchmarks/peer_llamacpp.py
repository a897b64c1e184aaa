"""met against llama.cpp (llama-cpp-python) on the same weights and prompts, width 1, greedy, one thread each.

Run: python3 benchmarks/peer_llamacpp.py [--prompts 8] [--tokens 128] [--repeats 3] [--flash-attn]
Needs the `peers` extra (`pip install -e '.[peers]'`: gguf, and llama-cpp-python, which builds llama.cpp).

The embedded recipe's main model is written as a GGUF file the way llama.cpp's HF converter writes a
LlamaForCausalLM: float32 tensors under llama.cpp's names, q and k projections permuted from HF's
rotate-half RoPE layout (each head's first half rotates against its second) to the adjacent pairs
llama.cpp's `llama` architecture rotates. Its tokenizer is a byte vocabulary, so that llama.cpp
tokenizes and detokenizes exactly as met does: a byte-level BPE ("gpt2") whose token i is byte i in
GPT-2's byte-to-character table, no merges that any text reaches, then BOS and EOS as control tokens
(256, 257). The script checks that round trip on every prompt and output, and feeds both engines the
same token ids.

llama.cpp runs plain greedy and with the binding's own speculation, `LlamaPromptLookupDecoding` as
`draft_model` (prompt n-gram lookup, verified in one batch), at each of LOOKUP_DEPTHS drafts per step;
met runs plain, `--spec mtp` at depths 1..4 and `--spec prompt-lookup` at 4 and 10 drafts (also with
--lookup-min-ngram 3), as peer_transformers runs them (met.engine.generate at width 1). Both use
float32 weights and a float32 KV cache. The engines run interleaved prompt by prompt within each
repeat; tokens/s is generated tokens over the wall time of the whole generate call, prefill included.
Token ids are compared between llama.cpp plain and met plain. A second table splits each engine's
time per token: prefill, the engine's own decode (llama.cpp's perf counters; met's decode loop), and
the host wrapper around it, against the same weights' matrix-vector products in torch at width 1 (one
op per weight, and one op for all: the work alone).
"""

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch

from interleave import interleaved
from met.engine.identity import box_class, device_name
from met.model.tokenizer import BOS, EOS, VOCAB_SIZE

LOOKUP_DEPTHS = (2, 4, 10)  # drafts per step of llama.cpp's prompt lookup (the binding's default is 10)
MET_LOOKUP_DEPTHS = (4, 10)  # met's prompt lookup: peer_transformers' best two (its depth 2 never led)
MTP_DEPTHS = (1, 2, 3, 4)
LLAMA_NGRAM = 2  # LlamaPromptLookupDecoding's max_ngram_size, its default
STRICT = 3  # met's --lookup-min-ngram for its second set of prompt-lookup runs, as peer_transformers'
CONTROL = {BOS: "<s>", EOS: "</s>"}
# llama.cpp's BPE loader requires a merges array and gguf refuses an empty one: one merge of the two
# control tokens' texts, which no text's byte symbols ever form, changes no tokenization.
INERT_MERGE = f"{CONTROL[BOS]} {CONTROL[EOS]}"


def byte_chars() -> list[str]:
    """GPT-2's byte-to-character table: the character a byte-level BPE vocabulary spells byte i with."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def byte_vocab() -> tuple[list[str], list[int]]:
    """Token texts and gguf token types of met's byte vocabulary: 256 bytes (NORMAL), BOS and EOS (CONTROL)."""
    import gguf

    texts = byte_chars() + [CONTROL[BOS], CONTROL[EOS]]
    types = [gguf.TokenType.NORMAL] * 256 + [gguf.TokenType.CONTROL] * 2
    assert len(texts) == VOCAB_SIZE
    return texts, [int(t) for t in types]


def permute_rope(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Rows of a q or k projection ([n_heads * head_dim, dim]) from HF's rotate-half order to GGUF's pairs.

    HF rotates row j of a head against row j + head_dim/2; llama.cpp rotates row 2j against 2j + 1.
    Within each head, new row 2j is old row j and new row 2j + 1 is old row j + head_dim/2, as
    llama.cpp's convert_hf_to_gguf.py permutes (LlamaModel.permute). Attention scores are unchanged:
    q and k are permuted alike.
    """
    rows = w.shape[0]
    return w.reshape(n_heads, 2, rows // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_tensors(state: dict[str, torch.Tensor], n_heads: int, n_kv_heads: int) -> dict[str, np.ndarray]:
    """The main model's tensors (HF LlamaForCausalLM names) under llama.cpp's names, float32, q/k permuted."""
    import gguf

    n_layers = 1 + max(int(k.split(".")[2]) for k in state if k.startswith("model.layers."))
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, n_layers)
    out = {}
    for key, value in state.items():
        if key.startswith("mtp."):  # the MTP module has no place in a llama GGUF
            continue
        w = value.detach().to("cpu", torch.float32).numpy()
        if key.endswith("self_attn.q_proj.weight"):
            w = permute_rope(w, n_heads)
        elif key.endswith("self_attn.k_proj.weight"):
            w = permute_rope(w, n_kv_heads)
        name = names.get_name(key, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ValueError(f"no llama.cpp name for tensor {key!r}")
        out[name] = np.ascontiguousarray(w)
    return out


def write_gguf(model, path: Path, name: str = "met-tiny-py") -> Path:
    """Write model's main model (a met Transformer) as a float32 llama GGUF with the byte vocabulary."""
    import gguf

    cfg = model.cfg
    if cfg.attention_bias or cfg.output_bias or cfg.tie_word_embeddings:
        raise ValueError("only the embedded recipes' layout is written (no biases, untied lm_head)")
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(name)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(cfg.max_seq_len)
    writer.add_embedding_length(cfg.dim)
    writer.add_block_count(cfg.n_layers)
    writer.add_feed_forward_length(cfg.ffn_dim)
    writer.add_head_count(cfg.n_heads)
    writer.add_head_count_kv(cfg.n_kv_heads)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_layer_norm_rms_eps(cfg.norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    texts, types = byte_vocab()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(texts)
    writer.add_token_types(types)
    writer.add_token_merges([INERT_MERGE])
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOS)
    writer.add_add_bos_token(False)  # met's prompts carry no BOS
    writer.add_add_eos_token(False)
    for tensor_name, w in gguf_tensors(model.state_dict(), cfg.n_heads, cfg.n_kv_heads).items():
        writer.add_tensor(tensor_name, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two token lists differ (the shorter one's length if one is a prefix); None if equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


@dataclass(slots=True)
class LlamaCounts:
    """What one llama.cpp engine did over the timed runs: llama.cpp's perf counters and its drafter's calls."""

    batch_ms: float = 0.0  # llama.cpp's t_p_eval: every decode of more than one token (the prompt, verifies)
    prompt_ms: float = 0.0  # the prompts' share of batch_ms
    decode_ms: float = 0.0  # llama.cpp's t_eval: single-token decodes (plain steps, steps with no draft)
    decodes: int = 0
    proposals: int = 0  # drafter calls: one per step after the first token
    verifies: int = 0  # drafter calls that drafted something (a batched verify follows)
    drafted: int = 0  # tokens the drafter proposed


class CountingLookup:
    """LlamaPromptLookupDecoding that counts its calls and drafts (the binding calls it once per step).

    Its first call in a generation comes right after the prompt's decode, so it reads the prompt's
    time off llama.cpp's counters there (reset when the generation starts).
    """

    def __init__(self, num_pred_tokens: int, counts: LlamaCounts, ctx):
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self.inner = LlamaPromptLookupDecoding(max_ngram_size=LLAMA_NGRAM, num_pred_tokens=num_pred_tokens)
        self.counts, self.ctx, self.fresh = counts, ctx, True

    def __call__(self, input_ids, /, **kwargs):
        if self.fresh:
            import llama_cpp

            self.counts.prompt_ms += llama_cpp.llama_perf_context(self.ctx).t_p_eval_ms
            self.fresh = False
        drafts = self.inner(input_ids, **kwargs)
        self.counts.proposals += 1
        self.counts.verifies += len(drafts) > 0
        self.counts.drafted += len(drafts)
        return drafts


def llama_generate(llm, prompt: list[int], tokens: int,
                   counts: LlamaCounts | None = None) -> tuple[list[int], float]:
    """llama.cpp's greedy generate from token ids, prompt evaluated afresh; returns (new tokens, seconds)."""
    import llama_cpp

    llama_cpp.llama_perf_context_reset(llm.ctx)
    if isinstance(llm.draft_model, CountingLookup):
        llm.draft_model.fresh = True
    t = time.perf_counter()
    llm.reset()  # no KV-cache prefix reuse across calls: met prefills every prompt too
    out = []
    for tok in llm.generate(prompt, temp=0.0, top_k=1, repeat_penalty=1.0):
        out.append(tok)
        if len(out) == tokens:
            break
    seconds = time.perf_counter() - t
    if counts is not None:
        perf = llama_cpp.llama_perf_context(llm.ctx)
        counts.batch_ms += perf.t_p_eval_ms
        counts.decode_ms += perf.t_eval_ms
        counts.decodes += perf.n_eval if perf.t_eval_ms else 0  # the counters report at least 1
        if llm.draft_model is None:
            counts.prompt_ms += perf.t_p_eval_ms
    return out, seconds


def met_generate(runner, prompt: list[int], tokens: int, spec: str, depth: int, lookup_min: int = 1,
                 split: dict | None = None) -> tuple[list[int], float]:
    """met's generate at width 1, as peer_transformers times it; returns (new tokens, seconds including prefill).

    split: where to add this call's wall, prefill and decode seconds and its tokens.
    """
    from met.engine.generate import generate

    t = time.perf_counter()
    out = generate(runner, [prompt], tokens, spec, depth, stop_at_eos=False, lookup_min=lookup_min)[0]
    seconds = time.perf_counter() - t
    if split is not None:
        split["wall_s"] += seconds
        split["prefill_s"] += out.prefill_s
        split["decode_s"] += out.decode_s
        split["tokens"] += len(out.tokens)
    return out.tokens, seconds


def matvec_floors_ms(model, reps: int = 300) -> tuple[float, float]:
    """ms of one width-1 token's weight matrix-vector products in torch: (one op per weight, one op for all).

    The main model's 2-D weights less the embedding (every layer's projections and the head; no
    attention, norms or RoPE), each as an [in, out] matrix (met's cached path's layout). The second
    figure multiplies the same number of weights as a single [dim, N] product: the work without the
    per-op cost, which the first adds back. Best of reps: a floor, as free of the box's noise as it gets.
    """
    weights = [v.detach().float().T.contiguous() for k, v in model.state_dict().items()
               if v.dim() == 2 and not k.startswith("mtp.") and "embed_tokens" not in k]  # [in, out] each
    dim = model.cfg.dim
    stacked = torch.cat([w.reshape(dim, -1) for w in weights], 1)  # [dim, N]: the same weights, one matrix
    xs = {w.shape[0]: torch.randn(1, w.shape[0]) for w in weights}
    each, one = [], []
    with torch.inference_mode():
        for _ in range(reps):
            t = time.perf_counter()
            for w in weights:
                xs[w.shape[0]] @ w
            each.append(time.perf_counter() - t)
            t = time.perf_counter()
            xs[dim] @ stacked
            one.append(time.perf_counter() - t)
    return 1e3 * min(each), 1e3 * min(one)


def spread(values: list[float]) -> str:
    """median [min, max] of a list of figures."""
    return f"{statistics.median(values):.2f} [{min(values):.2f}, {max(values):.2f}]"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--flash-attn", action="store_true",
                    help="llama.cpp's flash attention (the binding's default: off)")
    ap.add_argument("--out", type=Path, default=None,
                    help="markdown file (default: benchmarks/results/<box class>/peer_llamacpp.md); JSON beside it")
    args = ap.parse_args()
    torch.set_num_threads(1)

    import llama_cpp

    from met.engine.runner import ModelRunner
    from met.model.corpus import heldout_prompts
    from met.model.recipes import embedded
    from met.model.tokenizer import encode

    recipe = embedded()
    model = recipe.load(torch.float32, "cpu")
    runner = ModelRunner(model, 1)
    box = box_class("cpu", threads=1)
    out_md = args.out or Path("benchmarks/results") / box / "peer_llamacpp.md"
    path = write_gguf(model, Path(tempfile.mkdtemp()) / "met-tiny-py-f32.gguf")
    n_ctx = min(model.cfg.max_seq_len, 256 + args.tokens + max(LOOKUP_DEPTHS) + 16)
    common = dict(n_ctx=n_ctx, n_batch=512, n_threads=1, n_threads_batch=1, type_k=llama_cpp.GGML_TYPE_F32,
                  type_v=llama_cpp.GGML_TYPE_F32, flash_attn=args.flash_attn, seed=0, verbose=False)
    plain_llm = llama_cpp.Llama(str(path), **common)
    # The binding keeps every row's logits only when a draft model is set (it samples each verified row).
    lookup_llm = llama_cpp.Llama(str(path), draft_model=CountingLookup(LOOKUP_DEPTHS[0], LlamaCounts(), None),
                                 **common)
    prompts = [encode(p) for p in heldout_prompts(args.prompts, prompt_bytes=256)]

    # The byte vocabulary round trip: llama.cpp's tokenizer on the prompt bytes gives met's ids.
    tokenized = sum(plain_llm.tokenize(bytes(p), add_bos=False, special=False) == p for p in prompts)

    met_split = {"prefill_s": 0.0, "decode_s": 0.0, "wall_s": 0.0, "tokens": 0}  # met plain's timed calls
    counts = {"llama.cpp plain": LlamaCounts(),
              **{f"llama.cpp prompt lookup ({d})": LlamaCounts() for d in LOOKUP_DEPTHS}}

    def lookup_run(p: list[int], d: int) -> tuple[list[int], float]:
        c = counts[f"llama.cpp prompt lookup ({d})"]
        lookup_llm.draft_model = CountingLookup(d, c, lookup_llm.ctx)
        return llama_generate(lookup_llm, p, args.tokens, c)

    engines = {
        "llama.cpp plain": lambda p: llama_generate(plain_llm, p, args.tokens, counts["llama.cpp plain"]),
        **{f"llama.cpp prompt lookup ({d})": (lambda p, d=d: lookup_run(p, d)) for d in LOOKUP_DEPTHS},
        "met plain": lambda p: met_generate(runner, p, args.tokens, "off", 0, split=met_split),
        **{f"met mtp depth {d}": (lambda p, d=d: met_generate(runner, p, args.tokens, "mtp", d)) for d in MTP_DEPTHS},
        **{f"met prompt lookup ({d})": (lambda p, d=d: met_generate(runner, p, args.tokens, "prompt-lookup", d))
           for d in MET_LOOKUP_DEPTHS},
        **{f"met prompt lookup ({d}, matches of {STRICT}+)":
           (lambda p, d=d: met_generate(runner, p, args.tokens, "prompt-lookup", d, STRICT))
           for d in MET_LOOKUP_DEPTHS},
    }
    load_before = os.getloadavg()
    for p in prompts[:1]:  # warm-up: first calls pay one-off costs
        for run in engines.values():
            run(p)
    for c in counts.values():
        c.__init__()  # the warm-up's counts are not the timed runs'
    met_split.update(prefill_s=0.0, decode_s=0.0, wall_s=0.0, tokens=0)
    timed = interleaved(engines, prompts, args.repeats)
    rates, texts, seconds_of, tokens_of = timed.rates, timed.texts, timed.seconds, timed.tokens

    floor_ms, work_ms = matvec_floors_ms(model)
    load_after = os.getloadavg()

    med = {name: statistics.median(r) for name, r in rates.items()}
    reference = texts["met plain"]
    agree = {name: sum(a == b for a, b in zip(outs, reference)) for name, outs in texts.items()}
    differences = {name: [{"prompt": i, "position": first_difference(a, b)}
                          for i, (a, b) in enumerate(zip(outs, reference)) if a != b]
                   for name, outs in texts.items()}
    detokenized = sum(plain_llm.detokenize(t) == bytes(x for x in t if x < 256) for t in texts["llama.cpp plain"])
    best_met = max((n for n in med if n.startswith("met ") and n != "met plain"), key=med.get)
    best_llama = max((n for n in med if n.startswith("llama.cpp prompt lookup")), key=med.get)

    def paired(a: str, b: str) -> list[float]:
        """a's rate over b's, repeat by repeat (the engines share each repeat's box)."""
        return [x / y for x, y in zip(rates[a], rates[b])]

    ratios = {
        "met plain / llama.cpp plain": paired("met plain", "llama.cpp plain"),
        f"met best speculation ({best_met}) / llama.cpp best prompt lookup ({best_llama})":
            paired(best_met, best_llama),
        f"met best speculation ({best_met}) / llama.cpp plain": paired(best_met, "llama.cpp plain"),
        f"llama.cpp best prompt lookup ({best_llama}) / llama.cpp plain": paired(best_llama, "llama.cpp plain"),
        f"met best speculation ({best_met}) / met plain": paired(best_met, "met plain"),
    }

    # Per generated token, ms: wall = prefill + decode + host (what neither engine's step counts).
    lp, n_plain, n_met = counts["llama.cpp plain"], tokens_of["llama.cpp plain"], met_split["tokens"]
    split = {  # both from the timed, interleaved runs
        "llama.cpp plain": {"wall": 1e3 * seconds_of["llama.cpp plain"] / n_plain, "prefill": lp.prompt_ms / n_plain,
                            "decode": lp.decode_ms / n_plain, "step": lp.decode_ms / max(lp.decodes, 1)},
        "met plain": {"wall": 1e3 * met_split["wall_s"] / n_met, "prefill": 1e3 * met_split["prefill_s"] / n_met,
                      "decode": 1e3 * met_split["decode_s"] / n_met,
                      "step": 1e3 * met_split["decode_s"] / max(n_met - len(prompts) * args.repeats, 1)},
    }
    for v in split.values():
        v["host"] = v["wall"] - v["prefill"] - v["decode"]
    # accepted per verify: the tokens a step adds beyond its one decoded token, over the steps that verified
    lookups = {name: {"tokens_per_step": tokens_of[name] / max(c.proposals, 1),
                      "accepted_per_verify": (tokens_of[name] - c.proposals - len(prompts) * args.repeats)
                      / max(c.verifies, 1),
                      "drafted_per_verify": c.drafted / max(c.verifies, 1),
                      "verifies_per_step": c.verifies / max(c.proposals, 1),
                      "verify_ms": (c.batch_ms - c.prompt_ms) / max(c.verifies, 1),
                      "decode_ms": c.decode_ms / c.decodes if c.decodes else None}  # steps with no draft
               for name, c in counts.items() if name != "llama.cpp plain"}
    m, ll = split["met plain"], split["llama.cpp plain"]
    n_matvecs = sum(v.dim() == 2 and not k.startswith("mtp.") and "embed_tokens" not in k
                    for k, v in model.state_dict().items())
    gap = {k: m[k] - ll[k] for k in ("wall", "prefill", "decode", "host")}
    best_lookup = lookups[best_llama]
    reading = [
        f"- Per generated token met plain takes {m['wall']:.3f} ms and llama.cpp plain {ll['wall']:.3f} ms: "
        f"a gap of {gap['wall']:+.3f} ms, of which {gap['decode']:+.3f} ms is in the decode steps, "
        f"{gap['prefill']:+.3f} ms in the prefill and {gap['host']:+.3f} ms in the host code around them.",
        f"- A decode step: met {m['step']:.3f} ms, llama.cpp {ll['step']:.3f} ms. The weights' work is "
        f"{work_ms:.3f} ms (all of them as one matrix-vector product in torch); as the model's "
        f"{n_matvecs} separate products it is {floor_ms:.3f} ms, so {floor_ms - work_ms:.3f} ms of a torch "
        f"step is the products' per-op cost alone. met's step is {m['step'] / work_ms:.1f}x the work, "
        f"llama.cpp's {ll['step'] / work_ms:.1f}x: at dim {model.cfg.dim} a step's arithmetic is small and "
        f"per-op cost dominates; met spends {m['step'] - floor_ms:.3f} ms beyond the products (attention, "
        "norms, RoPE, cache writes, the sampler's ops, Python), llama.cpp "
        f"{ll['step'] - work_ms:.3f} ms beyond the work (its graph built and scheduled for each call, "
        "its per-op kernels).",
        f"- llama.cpp's binding adds {ll['host']:.3f} ms per token in Python (its generator, the sampler call "
        f"through ctypes); met's host share is {m['host']:.3f} ms.",
        f"- llama.cpp's prompt lookup ({best_llama}): {best_lookup['tokens_per_step']:.2f} tokens per step, "
        f"{best_lookup['accepted_per_verify']:.2f} of {best_lookup['drafted_per_verify']:.1f} drafts accepted per "
        f"verify; a batched verify of {best_lookup['drafted_per_verify']:.1f} drafts costs "
        f"{best_lookup['verify_ms']:.3f} ms ({best_lookup['verify_ms'] / max(ll['step'], 1e-9):.2f}x a plain "
        "single-token step); "
        f"{best_lookup['verifies_per_step']:.0%} of steps drafted anything. The binding keeps every row's "
        "logits when a draft model is set (a copy per step) and drafts in numpy.",
    ]

    cmd = "python3 " + " ".join(sys.argv)
    lines = [
        "# met against llama.cpp on the same weights (width 1, greedy, one thread each)",
        "",
        f"Command: `{cmd}`",
        "",
        f"Box: `{box}` ({device_name('cpu')}), `{platform.platform()}`; torch {torch.__version__} at "
        f"{torch.get_num_threads()} thread, llama-cpp-python {llama_cpp.__version__} (n_threads=1, "
        f"n_threads_batch=1, float32 KV cache, flash attention {'on' if args.flash_attn else 'off'}), "
        f"gguf {version('gguf')}; recipe `{recipe.id}` as a float32 GGUF "
        f"with the byte vocabulary; {len(prompts)} held-out prompts x {args.tokens} tokens, {args.repeats} repeats "
        "interleaved prompt by prompt; median [min, max] over repeats. Load average (1, 5, 15 min) "
        f"{', '.join(f'{x:.1f}' for x in load_before)} before the timed runs, "
        f"{', '.join(f'{x:.1f}' for x in load_after)} after, on {os.cpu_count()} CPUs.",
        "",
        f"Byte vocabulary: llama.cpp tokenizes {tokenized}/{len(prompts)} prompts to met's ids and detokenizes "
        f"{detokenized}/{len(prompts)} of its outputs to their bytes; both engines are fed the same ids.",
        "",
        "| engine | tokens/s | x met plain | x llama.cpp plain | token ids equal to met plain |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, r in rates.items():
        first = [d["position"] for d in differences[name]]
        where = f" (first differences at {first})" if first else ""
        lines.append(f"| {name} | {spread(r)} | {med[name] / med['met plain']:.2f} | "
                     f"{med[name] / med['llama.cpp plain']:.2f} | {agree[name]}/{len(prompts)}{where} |")
    lines += ["", "Ratios, repeat by repeat (median [min, max]):", "",
              *(f"- {k}: **{spread(v)}x**" for k, v in ratios.items())]
    lines += [
        "",
        "Where the time per token goes (plain decode, ms per generated token; step: ms per decode step):",
        "",
        "| engine | wall | prefill | decode | host around them | one decode step |",
        "|---|---:|---:|---:|---:|---:|",
        *(f"| {name} | {v['wall']:.3f} | {v['prefill']:.3f} | {v['decode']:.3f} | {v['host']:.3f} | "
          f"{v['step']:.3f} |" for name, v in split.items()),
        "",
        f"Floors: one token's weight matrix-vector products in torch at width 1 (all {model.cfg.n_layers} layers' "
        f"projections and the head, no attention, no norms): {floor_ms:.3f} ms as {n_matvecs} ops, "
        f"{work_ms:.3f} ms as one op over the same weights (best of 300 each: floors, while the steps are means "
        "over the run and carry the box's load). llama.cpp's prefill and decode are its perf "
        "counters (t_p_eval, t_eval: graph build and compute in C); met's are generate's prefill_s and decode_s "
        "(its decode loop, Python scheduling included), both over the timed runs.",
        "",
        "llama.cpp's prompt lookup (a step: one drafter call and the decode after it):",
        "",
        "| engine | tokens per step | steps that drafted | drafts per verify | accepted per verify | verify ms | "
        "single-token step ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *(f"| {name} | {v['tokens_per_step']:.2f} | {v['verifies_per_step']:.0%} | {v['drafted_per_verify']:.2f} | "
          f"{v['accepted_per_verify']:.2f} | {v['verify_ms']:.3f} | "
          f"{'-' if v['decode_ms'] is None else format(v['decode_ms'], '.3f')} |"
          for name, v in lookups.items()),
        "",
        "Where the difference goes:",
        "",
        *reading,
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    out_md.parent.mkdir(parents=True, exist_ok=True)
    out_md.write_text(text)
    out_md.with_suffix(".json").write_text(json.dumps(
        {"command": cmd, "box_class": box, "cpu": device_name("cpu"), "platform": platform.platform(),
         "recipe": recipe.id, "torch": torch.__version__, "llama_cpp_python": llama_cpp.__version__,
         "gguf": version("gguf"),
         "flash_attn": args.flash_attn, "loadavg": {"before": load_before, "after": load_after},
         "prompts": len(prompts), "tokens": args.tokens, "repeats": args.repeats,
         "tokenized_equal": tokenized, "detokenized_equal": detokenized,
         "tokens_per_s": rates, "median": med, "texts_equal_to_met_plain": agree, "differences": differences,
         "ratios": ratios, "time_split_ms": split, "matvec_ms": {"separate": floor_ms, "one_op": work_ms},
         "llama_lookup": lookups},
        indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
