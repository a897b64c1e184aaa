"""Bounded reads of the files met is given: regular files only, at most a stated size, shapes checked before parsing.

Every file a command reads (cost tables and calibrations, keys files, model cards, a checkpoint
folder's config.json, tokenizer.json and weights, prompt files) goes through here, so a hostile
path can neither hang a command nor make it hold unbounded memory:
- only a regular file is read: a FIFO, a character or block device (/dev/zero), a socket is
  refused (NotRegular) without being opened in a way that blocks (stat first, then os.open with
  O_NONBLOCK and fstat the descriptor, so a file swapped in between is caught too); a symlink is
  judged by what it points to;
- at most `limit` bytes are read (TooLarge past it), whatever the file's size says;
- TOML is scanned before it is parsed (met.speculative.spec_cost.fields.check_toml_shape: brackets
  nested at most MAX_NESTING deep, dotted keys of at most MAX_KEY_PARTS parts), because tomllib
  needs memory far beyond a file's size for a dotted one (a 200 KB dotted key drove it to 23 GB);
  JSON's C decoder refuses deep nesting itself (RecursionError, caught here) within the size bound.

FileRefused is a ValueError: the file was read (or looked at) and is not one met reads, so the
commands answer it with 65 (EX_DATAERR) and one line naming the file; a missing file stays
FileNotFoundError (66) and a folder IsADirectoryError, as from open().
"""

import json
import os
import stat
from pathlib import Path

KIB, MIB = 1 << 10, 1 << 20
TABLE_LIMIT = 64 * MIB  # a cost table or calibration: a 65,536-width table at depth 4 is about 40 MB
KEYS_LIMIT = 1 * MIB  # a keys file: thousands of keys
CONFIG_LIMIT = 4 * MIB  # config.json, generation_config.json, a model card, a weights index
TOKENIZER_LIMIT = 256 * MIB  # tokenizer.json: the largest published ones are tens of MB
PROMPTS_LIMIT = 256 * MIB  # a JSON Lines prompt file, or one prompt file of a folder


class FileRefused(ValueError):
    """A file met does not read: the message is one line, `PATH: why`."""

    def __init__(self, path: os.PathLike | str, reason: str) -> None:
        self.path, self.reason = Path(path), reason
        super().__init__(f"{escape(str(path))}: {reason}")


class NotRegular(FileRefused):
    """The path is a FIFO, a device or a socket: reading it could block forever or never end."""


class TooLarge(FileRefused):
    """The file holds more than the stated limit."""


def escape(text: str) -> str:
    """Text for a one-line message: control characters (and backslashes) escaped as \\n, \\x1b, never dropped."""
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(c if c.isprintable() and c != "\\" else c.encode("unicode_escape").decode("ascii")
                   if c != "\\" else "\\\\" for c in text)


_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def kind_of(mode: int) -> str | None:
    """What a non-regular, non-folder file is ("a FIFO (named pipe)", ...); None for a regular file or a folder."""
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def check_regular(path: os.PathLike | str) -> os.stat_result:
    """The stat of a regular file (symlinks followed); NotRegular for a FIFO, device or socket, and
    FileNotFoundError / IsADirectoryError / OSError as open() would raise them."""
    st = os.stat(path)
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(21, "Is a directory", str(path))
    if (kind := kind_of(st.st_mode)) is not None:
        raise NotRegular(path, f"is {kind}, not a regular file; met reads only regular files")
    return st


def open_regular(path: os.PathLike | str) -> int:
    """A read-only descriptor of a regular file, opened without blocking; the caller closes it."""
    check_regular(path)  # a FIFO is never opened at all
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(21, "Is a directory", str(path))
        if (kind := kind_of(mode)) is not None:  # swapped in after the stat
            raise NotRegular(path, f"is {kind}, not a regular file; met reads only regular files")
        os.set_blocking(fd, True)  # a regular file never blocks: reads below are ordinary
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bytes(path: os.PathLike | str, limit: int) -> bytes:
    """At most `limit` bytes of a regular file; TooLarge if it holds more (the rest is never read)."""
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise TooLarge(path, f"is {size} bytes, more than the {limit} met reads from such a file")
        chunks, total = [], 0
        while total <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:  # it grew while read
            raise TooLarge(path, f"holds more than the {limit} bytes met reads from such a file")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(path: os.PathLike | str, limit: int, encoding: str = "utf-8") -> str:
    """read_bytes decoded; UnicodeDecodeError as bytes.decode raises it."""
    return read_bytes(path, limit).decode(encoding)


def read_json(path: os.PathLike | str, limit: int = CONFIG_LIMIT, encoding: str = "utf-8") -> object:
    """A JSON file read bounded and parsed; FileRefused (one line) for any file that is not JSON."""
    data = read_bytes(path, limit)
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as exc:
        raise FileRefused(path, f"is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise FileRefused(path, f"is not JSON ({' '.join(str(exc).split())})") from None
