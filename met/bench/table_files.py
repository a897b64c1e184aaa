"""Table files on disk: the run lock, atomic replacement, and what changed against the table already there.

A run holds a non-blocking exclusive lock on `<table>.lock` from before it measures until after
it writes, so a second run (a cron job overlapping a hand run) fails at once and touches nothing.
A write goes to a temp file in the table's folder, is fsynced, and replaces the table with
os.replace, so a reader (or a run killed at any moment) sees the old table or the new one whole,
never a mix. A table and its calibration are both staged (written and fsynced) before either is
replaced, so a full disk or a failed write replaces neither. Temp files a killed run left behind
are removed by the next run that holds the lock.
"""

import fcntl
import os
import stat
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from met import bounded_read
from met.speculative.spec_cost import fields
from met.speculative.spec_cost import Cell, CostTable, TableKey, TableParseError, VerifyCell

TEMP_SUFFIX = ".tmp"


class LockHeld(Exception):
    """Another run holds the table's lock; the message names the lock file and its holder."""


class Unwritable(Exception):
    """The table cannot be written there: its path is a folder, or its folder or lock file cannot be created."""


def _refuse_special(path: Path, what: str) -> None:
    """Unwritable if something that is no regular file (a FIFO, a device, a socket) is at path: never opened."""
    try:
        mode = os.stat(path).st_mode
    except OSError:  # absent (or a dangling link, refused by resolve_out): nothing to refuse here
        return
    if (kind := bounded_read.kind_of(mode)) is not None:
        raise Unwritable(f"{what} {bounded_read.escape(str(path))} is {kind}, not a regular file; pass another "
                         "path or remove it")


def resolve_out(path: Path) -> Path:
    """The file a run replaces at `path`: a symlink's target (replacing the link would leave its target stale).

    Unwritable for a dangling link: its target's folder is not one the user named.
    """
    try:
        if not path.is_symlink():
            return path
        target = Path(os.path.realpath(path))
    except OSError:  # a name too long to look up: the lock or the write check refuses it in one line
        return path
    if not target.exists():
        raise Unwritable(f"{path} is a symbolic link to {target}, which does not exist; point it at a table "
                         "or pass the path itself")
    return target


def lock_path(table: Path) -> Path:
    """The lock file beside a table: `x.toml` -> `x.toml.lock`."""
    return table.with_name(table.name + ".lock")


class TableLock:
    """An exclusive, non-blocking flock on the lock file beside `table`, held for a whole run.

    The lock file itself is never removed (removing it would let two runs lock two different
    files); it holds the pid of its last holder, for the message a second run prints.
    """

    def __init__(self, table: Path) -> None:
        self.table = table
        self.path = lock_path(table)
        self._fd: int | None = None

    def __enter__(self) -> "TableLock":
        if self.table.is_dir():
            raise Unwritable(f"{self.table} is a directory; pass the table's file path")
        _refuse_special(self.table, "the table's path")
        above = next((p for p in self.table.parents if p.exists()), None)
        if above is not None and not above.is_dir():
            raise Unwritable(f"cannot put the table under {above}: it is a file, not a folder")
        _refuse_special(self.path, "the lock file")
        created = False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:  # O_EXCL first: a lock file this run made is removed again if it cannot be written
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
                created = True
            except FileExistsError:
                fd = os.open(self.path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise Unwritable(f"cannot create the lock file {self.path}: {exc.strerror or exc}") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped for a FIFO after the check above
            os.close(fd)
            raise Unwritable(f"the lock file {self.path} is not a regular file; remove it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
            os.close(fd)
            who = f" (pid {holder})" if holder.isdigit() else ""
            raise LockHeld(f"another met bench spec-cost run holds {self.path}{who}; the table was not "
                           "touched, try again when it has finished") from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:  # a full disk: nothing measured, and no empty lock file left behind
            if created:
                self.path.unlink(missing_ok=True)
            os.close(fd)
            raise Unwritable(f"cannot write the lock file {self.path}: {exc.strerror or exc}") from None
        self._fd = fd
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def _temp_prefix(path: Path) -> str:
    return f".{path.name}."


def remove_stale_temps(path: Path) -> list[Path]:
    """Remove temp files an earlier, killed write of `path` left in its folder (call with the lock held)."""
    removed = []
    for temp in path.parent.glob(f"{_temp_prefix(path)}*{TEMP_SUFFIX}"):
        try:
            temp.unlink()
            removed.append(temp)
        except FileNotFoundError:
            pass
    return removed


def stage(path: Path, text: str) -> Path:
    """Write `text` to a new temp file beside `path` and fsync it; `path` itself is not touched yet."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=TEMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temp, 0o644)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return Path(temp)


def check_writable(path: Path) -> None:
    """Stage an empty temp file beside `path` and remove it: OSError now where the write would fail later.

    A read-only folder or a name too long for a temp file beside it is found before a sweep, not after.
    """
    stage(path, "").unlink()


def commit(temp: Path, path: Path) -> None:
    """Replace `path` with a staged temp file (os.replace), then fsync the folder so the rename survives a power cut."""
    try:
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def commit_pair(staged: list[tuple[Path, Path]]) -> None:
    """Replace each path with its staged temp file, all of them or none: a failed rename puts back what it replaced.

    Each file there before is kept under a hard link (a temp name the next run clears) until every
    rename has succeeded; on an OSError the paths replaced so far get their old files back (or are
    removed where there was none), the temps are removed, and the error is raised. A reader may see
    the new first file beside the old second one for the moment between two renames; a run killed
    in that moment leaves them so.
    """
    done: list[tuple[Path, Path | None]] = []  # (path replaced, its old file's hard link or None)
    links: list[Path] = []
    try:
        for temp, path in staged:
            old = None
            if path.exists():
                old = Path(tempfile.mktemp(prefix=_temp_prefix(path), suffix=TEMP_SUFFIX, dir=path.parent))
                os.link(path, old)
                links.append(old)
            os.replace(temp, path)
            done.append((path, old))
    except BaseException:
        for path, old in reversed(done):
            try:
                if old is not None:
                    os.replace(old, path)
                else:
                    path.unlink(missing_ok=True)
            except OSError:
                pass
        for temp in [t for t, _ in staged] + links:
            temp.unlink(missing_ok=True)
        raise
    for link in links:
        link.unlink(missing_ok=True)
    for folder in dict.fromkeys(path.parent for _, path in staged):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` whole: temp file in the same folder, fsync, os.replace, fsync the folder."""
    commit(stage(path, text), path)


@dataclass(frozen=True, slots=True)
class Existing:
    """The table already at the path: parsed, or why it could not be (None and None when there is none).

    foreign: the file is not a met cost table at all (not TOML, or TOML without `schema` and `[key]`),
    so it is someone's other file, not a table to replace; an invalid table of ours is not foreign.
    """

    table: CostTable | None = None
    problem: str | None = None
    foreign: bool = False


def read_existing(path: Path) -> Existing:
    """The table now at `path`, if any, for the change report (never raises for a bad file)."""
    text, problem = _read(path)
    if text is None:
        return Existing(problem=problem, foreign=problem is not None)
    try:
        return Existing(CostTable.parse(text))
    except TableParseError as exc:
        return Existing(problem=f"is not a valid table ({exc})", foreign=not _ours(text, "key"))


def foreign_calibration(path: Path) -> str | None:
    """Why the file at `path` is no met calibration (not TOML, or no `schema` and `[drafter]`); None: absent or ours."""
    text, problem = _read(path)
    if text is None or _ours(text, "drafter"):
        return problem
    return "is not a met calibration (no `schema` and `[drafter]`)"


def _read(path: Path) -> tuple[str | None, str | None]:
    """(the file's text, None), or (None, why it cannot be read as UTF-8 text); (None, None) when there is none."""
    try:
        return bounded_read.read_text(path, bounded_read.TABLE_LIMIT), None
    except FileNotFoundError:
        return None, None
    except bounded_read.FileRefused as exc:
        return None, exc.reason
    except UnicodeDecodeError as exc:
        return None, f"is not UTF-8 text ({exc.reason} at byte {exc.start})"
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror or exc})"


def _ours(text: str, section: str) -> bool:
    """Whether text is TOML with an integer `schema` and a [section] table: a met file, valid or not."""
    try:
        doc = fields.load(text)  # shape-checked first: a bomb at --out is refused, not parsed
    except TableParseError:
        return False
    return isinstance(doc.get("schema"), int) and isinstance(doc.get(section), dict)


def changes(old: Existing, new: CostTable) -> list[str]:
    """One line per cell (and copy verify cell) of `new`: its costs and their change against the old table's."""
    if old.table is None and not old.problem:
        return ["no table there before; every cell is new"]
    lines = []  # a file that was no valid table is said on stderr by the caller; its cells are all new
    if old.table is not None and old.table.key != new.key:
        lines.append(f"the key changed: {key_changes(old.table.key, new.key)}")
    before = {} if old.table is None else {(c.n, c.k): c for c in old.table.cells}
    for cell in new.cells:
        was = before.get((cell.n, cell.k))
        parts = [_change("verify", cell.verify_s, was and was.verify_s, 1e3, "ms")]
        if cell.k:
            parts.append(_change("draft", cell.draft_s, was and was.draft_s, 1e3, "ms"))
        if cell.verify_j is not None:
            parts.append(_change("verify", cell.verify_j, was and was.verify_j, 1.0, "J"))
            if cell.k:
                parts.append(_change("draft", cell.draft_j, was and was.draft_j, 1.0, "J"))
        lines.append(f"n={cell.n} k={cell.k}: " + ", ".join(parts))
    for cell in new.verify_cells:
        was = _old_copy(old.table, cell.n, cell.k)
        parts = [_change("verify", cell.verify_s, was and was.verify_s, 1e3, "ms")]
        if cell.verify_j is not None:
            parts.append(_change("verify", cell.verify_j, was and was.verify_j, 1.0, "J"))
        lines.append(f"n={cell.n} k={cell.k} copies: " + ", ".join(parts))
    if before:
        lines.append(median_change(old.table, new))
    return lines


def _old_copy(old: CostTable | None, n: int, k: int) -> Cell | VerifyCell | None:
    """What the old table priced verifying k copies at at width n, where it measured the width that deep.

    Its verify_cell(n, k): its own verify cell, or (an older table's, verify cells past kmax only)
    its cell's verify, which the planner priced copies at; only verify_s and verify_j are compared.
    """
    if old is None or n not in old.widths or k > old.verify_depth(n):
        return None
    return old.verify_cell(n, k)


def median_change(old: CostTable, new: CostTable) -> str:
    """The repeatability line: median over shared cells of |relative change| of step time (verify, draft, both)."""
    pairs = [(before, cell) for cell in new.cells
             if (before := next((c for c in old.cells if (c.n, c.k) == (cell.n, cell.k)), None))]

    def median(values: list[float]) -> str:
        return f"{statistics.median(values):.1%}" if values else "n/a"

    wall = [abs(c.wall_s - b.wall_s) / b.wall_s for b, c in pairs]
    verify = [abs(c.verify_s - b.verify_s) / b.verify_s for b, c in pairs]
    draft = [abs(c.draft_s - b.draft_s) / b.draft_s for b, c in pairs if c.k and b.draft_s]
    return (f"median |change| over {len(pairs)} cells: step time {median(wall)} "
            f"(verify {median(verify)}, draft {median(draft)})")


def key_changes(old: TableKey, new: TableKey) -> str:
    """What differs between two keys, old -> new, in one line."""
    found = [f"{attr} '{getattr(old, attr)}' -> '{getattr(new, attr)}'"
             for attr in ("box_class", "recipe", "energy_source", "schema") if getattr(old, attr) != getattr(new, attr)]
    for mode in sorted(set(old.modes) | set(new.modes)):
        if old.digest(mode) != new.digest(mode):
            found.append(f"plan digest of {mode} {old.digest(mode) or '(none)'} -> {new.digest(mode) or '(none)'}")
    return "; ".join(found)


def _change(name: str, value: float, was: float | None, scale: float, unit: str) -> str:
    if not was:
        return f"{name} {value * scale:.4g} {unit} (new)"
    return f"{name} {value * scale:.4g} {unit} ({(value - was) / was:+.1%})"
