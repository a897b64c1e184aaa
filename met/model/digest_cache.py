"""Remembered weight digests: a checkpoint folder's digest kept with its files' stat, hashed once, not at each start.

Hashing a 16 GB checkpoint takes tens of seconds; every `met serve --model PATH` and every sweep
of it needs the digest (tables are keyed by it). The cache maps a folder to the digest and, per
weight file, (name, size, mtime_ns, ctime_ns, inode, device). A hit needs every one of those to
be equal: rewriting a file changes its ctime even when its size and mtime are put back, so a
changed file is always hashed again. The cache lives in $MET_CACHE_DIR, else
$XDG_CACHE_HOME/met, else ~/.cache/met, as digests.json, replaced atomically. It is only an
optimisation: an unreadable, corrupt or unwritable cache is ignored and the files are hashed.
"""

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import met.bounded_read as bounded_read

CACHE_FILE = "digests.json"
MAX_ENTRIES = 256  # folders remembered; the oldest entries go first


def cache_dir() -> Path | None:
    """Where the cache lives: $MET_CACHE_DIR, else $XDG_CACHE_HOME/met, else ~/.cache/met; None: there is no home."""
    if explicit := os.environ.get("MET_CACHE_DIR"):
        return Path(explicit)
    if (base := os.environ.get("XDG_CACHE_HOME")) and Path(base).is_absolute():  # the XDG spec: ignore a relative one
        return Path(base) / "met"
    try:
        return Path.home() / ".cache" / "met"
    except RuntimeError:  # no $HOME and a uid with no passwd entry (a container run as an arbitrary user)
        return None


def cached_digest(folder: Path, files: list[Path], compute: Callable[[list[Path]], str]) -> str:
    """compute(files), or what it returned before for these very files (same name, size, times, inode)."""
    try:
        stamp = [_stamp(f) for f in files]
    except OSError:
        return compute(files)  # a file that cannot be stat'ed: let compute report it
    key = str(folder.resolve())
    entries = _read()
    entry = entries.get(key)
    if isinstance(entry, dict) and entry.get("files") == stamp and isinstance(entry.get("digest"), str):
        return entry["digest"]
    digest = compute(files)
    entries.pop(key, None)
    entries[key] = {"files": stamp, "digest": digest}
    _write(dict(list(entries.items())[-MAX_ENTRIES:]))
    return digest


def _stamp(path: Path) -> list:
    st = path.stat()
    return [path.name, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def _read() -> dict:
    if (folder := cache_dir()) is None:
        return {}
    try:
        doc = bounded_read.read_json(folder / CACHE_FILE, bounded_read.CONFIG_LIMIT)
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _write(entries: dict) -> None:
    if (folder := cache_dir()) is None:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=f".{CACHE_FILE}.", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(entries, f)
            os.replace(temp, folder / CACHE_FILE)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
    except OSError:
        pass  # a cache that cannot be written costs a hash next time, nothing more
