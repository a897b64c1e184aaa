"""The training corpus: the running interpreter's standard-library source, split by file."""

import hashlib
import os
import sysconfig
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from met.model.tokenizer import EOS

HELDOUT_PERCENT = 3  # share of files (by path hash) held out from training


CORPUS_ROOT_ENV = "MET_CORPUS_ROOT"


def stdlib_root() -> Path:
    """The standard library the corpus is read from: $MET_CORPUS_ROOT where set, else the running interpreter's.

    The override is for a box whose python is another version than the one a model was trained on
    (the model card's corpus root): its own stdlib would give other held-out files, so other
    benchmark prompts and calibration windows, than the card's split.
    """
    return Path(os.environ.get(CORPUS_ROOT_ENV) or sysconfig.get_paths()["stdlib"])


def root_named() -> str:
    """Where the corpus is read from, for a message: the folder, and whether MET_CORPUS_ROOT named it."""
    return f"{stdlib_root()} ({CORPUS_ROOT_ENV})" if os.environ.get(CORPUS_ROOT_ENV) else \
        f"{stdlib_root()} (this python's stdlib; {CORPUS_ROOT_ENV} names another)"


THIRD_PARTY = frozenset({"site-packages", "dist-packages"})


def stdlib_files(root: Path | None = None) -> list[Path]:
    """Every .py file of the standard library, third-party packages excluded, in a stable order."""
    root = root or stdlib_root()
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in THIRD_PARTY]  # not walked at all: site-packages holds torch's tree
        found += [Path(folder, f) for f in files if f.endswith(".py")]
    return sorted(p for p in found if THIRD_PARTY.isdisjoint(p.parts))


def is_heldout(relpath: str) -> bool:
    """Whether a file (by its path relative to the stdlib root) belongs to the held-out split."""
    return int(hashlib.sha256(relpath.encode()).hexdigest()[:8], 16) % 100 < HELDOUT_PERCENT


@dataclass(frozen=True)
class Split:
    """Token stream of one split, files joined by EOS, and the files it holds."""

    tokens: np.ndarray  # [N] uint16
    files: tuple[str, ...]  # relative paths


def load_split(heldout: bool, root: Path | None = None) -> Split:
    """Concatenate the files of one split into a token stream."""
    root = root or stdlib_root()
    chunks, names = [], []
    for path in stdlib_files(root):
        rel = path.relative_to(root).as_posix()
        if is_heldout(rel) != heldout:
            continue
        data = path.read_bytes()
        chunks.append(np.frombuffer(data, dtype=np.uint8).astype(np.uint16))
        chunks.append(np.array([EOS], dtype=np.uint16))
        names.append(rel)
    tokens = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.uint16)
    return Split(tokens, tuple(names))


def heldout_prompts(count: int, prompt_bytes: int = 256, root: Path | None = None) -> list[str]:
    """Prompts cut from the starts of held-out files (deterministic): code the model never trained on.

    Like every cut below, from `benchmark_files`: near-copies of training files left out.
    """
    texts = (data[:prompt_bytes].decode("utf-8", errors="ignore") for data in benchmark_files(root).values())
    return [text for text in texts if len(text) >= prompt_bytes // 2][:count]


def heldout_code(count: int, offset: int = 1024, size: int = 256, root: Path | None = None) -> list[str]:
    """`count` prompts of about `size` bytes from held-out files, from the first line start after `offset`.

    Benchmarks use these (offset 1024): the drafter's calibration is fitted on `calibration_windows`,
    which start at CALIBRATION_START or later, so the two never share a byte: a window cut before
    CALIBRATION_START that would run past it (a long line after `offset`) is not given. Files shorter
    than offset + size / 2 give none, so fewer than `count` may come back.
    """
    end = CALIBRATION_START if offset < CALIBRATION_START else None
    return [text for _, text in zip(range(count), cut_windows(benchmark_files(root).values(), [offset], size, end))]


CALIBRATION_START, CALIBRATION_STRIDE = 2048, 2048  # past the benchmarks' prompts and their continuations


def calibration_windows(count: int, size: int = 256, root: Path | None = None) -> list[str]:
    """`count` windows of held-out code for the drafter's calibration: mid-file, clear of `heldout_code`'s.

    Each held-out file gives a window at CALIBRATION_START bytes, then one every CALIBRATION_STRIDE
    bytes: every file's first window, then every file's second, and so on, so a small `count` still
    spans many files. Mid-file code, as a completion serve sees it, not the files' openings (licence
    headers and imports, where the drafter is accepted less often).
    """
    files = list(benchmark_files(root).values())
    offsets = range(CALIBRATION_START, max((len(d) for d in files), default=0), CALIBRATION_STRIDE)
    return [text for _, text in zip(range(count), cut_windows(files, offsets, size))]


NEAR_COPY_SHARE = 0.7  # a held-out file this much made of lines that also occur in training files


def near_copies(share: float = NEAR_COPY_SHARE, root: Path | None = None) -> dict[str, float]:
    """Held-out files that are near-copies of training files: path -> share of their line bytes seen in training.

    A line counts by its stripped text, blank lines left out; a file whose counted bytes lie at least
    `share` in lines that also occur in some training file is a near-copy (the generated codec tables
    of encodings/, say, which differ from their training siblings only in their table rows' values,
    or an empty __init__.py). The split holds them out by path, but the model has as good as read them.
    """
    return _near_copies(*_read_split(root), share)


def _near_copies(held: dict[str, bytes], seen: set[bytes], share: float) -> dict[str, float]:
    out = {}
    for rel, data in held.items():
        lines = [line for line in (raw.strip() for raw in data.splitlines()) if line]
        total = sum(map(len, lines))
        found = sum(len(line) for line in lines if line in seen) / total if total else 1.0
        if found >= share:
            out[rel] = found
    return out


def benchmark_files(root: Path | None = None) -> dict[str, bytes]:
    """The held-out files every benchmark prompt and calibration window is cut from: path -> bytes, in path order.

    The held-out split less its near-copies of training files (`near_copies`), which would flatter
    every acceptance and calibration figure: the model has as good as read them. Reading the
    whole stdlib takes about a second, so it is read once per process for a root and its files
    (their paths, sizes and modification times); each call gets its own dict.
    """
    root = (root or stdlib_root()).resolve()
    return dict(_benchmark_files(root, _listing(root)))


def _listing(root: Path) -> tuple[tuple[str, int, int], ...]:
    """Each file of stdlib_files(root): its path relative to root, size and modification time (ns)."""
    stats = ((p, p.stat()) for p in stdlib_files(root))
    return tuple((p.relative_to(root).as_posix(), st.st_size, st.st_mtime_ns) for p, st in stats)


@lru_cache(maxsize=4)
def _benchmark_files(root: Path, listing: tuple[tuple[str, int, int], ...]) -> tuple[tuple[str, bytes], ...]:
    """benchmark_files of a resolved root, as (path, bytes) pairs; `listing` (_listing(root)) keys the cache."""
    held, seen = _read_split(root)
    near = _near_copies(held, seen, NEAR_COPY_SHARE)
    return tuple((rel, data) for rel, data in held.items() if rel not in near)


def _read_split(root: Path | None) -> tuple[dict[str, bytes], set[bytes]]:
    """The held-out files (path -> bytes, in path order) and every stripped line of the training files."""
    root = root or stdlib_root()
    held: dict[str, bytes] = {}
    seen: set[bytes] = set()
    for path in stdlib_files(root):
        rel, data = path.relative_to(root).as_posix(), path.read_bytes()
        if is_heldout(rel):
            held[rel] = data
        else:
            seen.update(line.strip() for line in data.splitlines())
    return held, seen


def cut_windows(files: Collection[bytes], offsets: Iterable[int], size: int, end: int | None = None) -> Iterator[str]:
    """For each offset in turn, each file's `size` bytes from its first line start after the offset.

    end: a window that would reach past this byte is left out.
    """
    for offset in offsets:
        for data in files:
            start = data.find(b"\n", offset) + 1
            text = data[start : start + size].decode("utf-8", errors="ignore")
            if start > 0 and len(text) >= size // 2 and (end is None or start + size <= end):
                yield text
