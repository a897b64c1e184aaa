"""The embedded model on its whole held-out split, with and without the files that are near-copies of training files.

The model card's held-out figures (`met model train`'s evaluation) come from 32 windows of --seq-len bytes
drawn at random from the held-out split (at 256 bytes, 1.35% of it). This scores every byte of the split instead,
in consecutive windows of --window bytes (the first one or two of each window are context, not
scored): bits per byte of the main model, bits per byte of the MTP module (its target is one byte
further, but it also reads the true next byte), and teacher-forced first-draft acceptance (the MTP
module's argmax equal to the main model's argmax one position later: train.losses' `accept1`).

The split holds files out by path; some held-out files are as good as copies of training files
(corpus.near_copies: at least 70% of their line bytes occur as lines of training files, the codec
tables of encodings/ above all). Each figure is given over the whole split, over those files and
over the rest; then it checks that no benchmark prompt or calibration window is cut from them
(`corpus.benchmark_files` leaves them out), and gives the calibration's first-draft acceptance
(greedy MTP decoding, as `met bench spec-cost` fits it) on its windows and on the windows the same
cut would take from the near-copies.

    python3 benchmarks/studies/heldout_quality.py [--window 256] [--threads 1] [--out FILE]
"""

import argparse
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from met.bench.calibrate import CalibrationParams, collect
from met.bench.policies import PROMPT_BYTES, PROMPT_OFFSET
from met.model import corpus
from met.model.recipes import embedded
from met.model.tokenizer import EOS, encode
from met.train.recipe import evaluate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: report.py
from report import publish

BATCH = 32  # windows per forward


@torch.no_grad()
def score(model, tokens: np.ndarray, window: int) -> dict[str, np.ndarray]:
    """Per scored position of consecutive windows: main and MTP log-losses (nats), first-draft match, and files."""
    file_of = np.concatenate([[0], np.cumsum(tokens == EOS)[:-1]])  # a file's EOS belongs to it
    width = window + 2  # [T + 2] as train.losses takes them
    n = len(tokens) // width
    x_all = torch.from_numpy(tokens[: n * width].astype(np.int64)).view(n, width)
    main, mtp, match = [], [], []
    for b in range(0, n, BATCH):
        x = x_all[b : b + BATCH]
        h = model.hidden(x[:, : window + 1])
        logits = model.logits(h)  # [B, T+1, V]: predicts x[:, 1 : T+2]
        main.append(-F.log_softmax(logits.double(), -1).gather(-1, x[:, 1:, None])[..., 0][:, 1:])  # [B, T]
        mh, _ = model.mtp_hidden(h[:, :window], x[:, 1 : window + 1])
        mlog = model.mtp_logits(mh)  # [B, T, V]: predicts x[:, 2 : T+2]
        mtp.append(-F.log_softmax(mlog.double(), -1).gather(-1, x[:, 2:, None])[..., 0])
        match.append(mlog.argmax(-1) == logits[:, 1:].argmax(-1))
    files = file_of[: n * width].reshape(n, width)[:, 2:]  # the file of each scored target (x[:, 2:])
    return {"main": torch.cat(main).numpy().ravel(), "mtp": torch.cat(mtp).numpy().ravel(),
            "match": torch.cat(match).numpy().ravel(), "file": files.ravel()}


def first_draft_acceptance(model, texts: list[str]) -> tuple[int, float]:
    """Judged first drafts and their acceptance under greedy MTP decoding of texts, as the calibration fits them."""
    if not texts:
        return 0, math.nan
    firsts = [o for o in collect(model, [encode(t) for t in texts], CalibrationParams()) if o[2] == 1]
    return len(firsts), sum(o[1] for o in firsts) / len(firsts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    recipe = embedded()
    model = recipe.load().eval()
    split = corpus.load_split(True)
    near = corpus.near_copies()
    t0 = time.perf_counter()
    s = score(model, split.tokens, args.window)
    score_s = time.perf_counter() - t0
    is_near = np.array([name in near for name in split.files])[s["file"]]
    texts = {name: data.decode("utf-8", errors="ignore") for name, data in
             ((p.relative_to(corpus.stdlib_root()).as_posix(), p.read_bytes()) for p in corpus.stdlib_files())
             if name in set(split.files)}

    def from_near(prompts: list[str]) -> list[bool]:
        return [any(p in texts[name] for name in near) for p in prompts]

    card = evaluate(model, split)  # the card's 32 random windows
    model.eval()  # evaluate leaves it in training mode
    lines = [
        "# The embedded model on its whole held-out split", "",
        f"Command: `python3 {' '.join(sys.argv)}`; recipe `{recipe.id}`; `{platform.platform()}`, torch "
        f"{torch.__version__}, {args.threads} thread(s); scored in {score_s:.0f} s.", "",
        f"Held-out split: {len(split.files)} files, {len(split.tokens):,} tokens (bytes, an EOS after each file); "
        f"{len(s['main']):,} positions scored in windows of {args.window}.", "",
        f"Near-copies of training files (`corpus.near_copies`: at least {corpus.NEAR_COPY_SHARE:.0%} of a file's "
        "line bytes in lines that also occur in training files), with that share:", "",
        *(f"- `{name}`: {share:.1%}" for name, share in sorted(near.items())), "",
        "| positions | scored | bits per byte | MTP bits per byte | teacher-forced first-draft acceptance |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, mask in (("whole split", np.ones_like(is_near)), ("near-copy files", is_near),
                        ("the rest", ~is_near)):
        lines.append(f"| {label} | {int(mask.sum()):,} | {s['main'][mask].mean() / math.log(2):.3f} | "
                     f"{s['mtp'][mask].mean() / math.log(2):.3f} | {s['match'][mask].mean():.3f} |")
    lines.append(f"| 32 random windows of 256 (train.evaluate) | 32 x 257 | {card['heldout_bpb']:.3f} | "
                 f"{card['heldout_mtp1_bpb']:.3f} | {card['heldout_accept1_tf']:.3f} |")
    workload = corpus.heldout_code(16, PROMPT_OFFSET, PROMPT_BYTES)  # as heldout_workload_prompts cuts them
    openings = corpus.heldout_prompts(16)
    windows = corpus.calibration_windows(128)
    root = corpus.stdlib_root()
    near_bytes = [(root / name).read_bytes() for name in sorted(near)]
    offsets = range(corpus.CALIBRATION_START, max(map(len, near_bytes), default=0), corpus.CALIBRATION_STRIDE)
    near_windows = list(corpus.cut_windows(near_bytes, offsets, 256))  # cut as calibration_windows cuts its files
    n_near, acc_near = first_draft_acceptance(model, near_windows)
    n_rest, acc_rest = first_draft_acceptance(model, windows)
    lines += [
        "", "Cut from near-copy files (`corpus.benchmark_files` leaves them out, so each should be 0):", "",
        f"- the policies benchmark's prompts (`met bench policies`, {len(workload)}): {sum(from_near(workload))}",
        f"- the file openings of the card's acceptance, `benchmarks/decode.py` and `peer_transformers.py` "
        f"({len(openings)}): {sum(from_near(openings))}",
        f"- the calibration's windows ({len(windows)}): {sum(from_near(windows))}",
        "", "Greedy first-draft acceptance, as `met bench spec-cost` fits the calibration: on the calibration's "
        f"{len(windows)} windows {acc_rest:.3f} ({n_rest:,} judged); on the {len(near_windows)} windows the same cut "
        f"gives from the near-copy files {acc_near:.3f} ({n_near:,} judged).",
    ]
    return publish(lines, args.out)


if __name__ == "__main__":
    sys.exit(main())
