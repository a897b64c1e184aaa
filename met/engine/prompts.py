"""Prompt files: JSON Lines of strings or {"prompt": ...} objects, read with errors that name the line."""

import json
import re
from pathlib import Path

import met.bounded_read as bounded_read

_LINE_END = re.compile(r"\r\n|\r|\n")


class PromptError(Exception):
    """Prompts that cannot be used; the message names the file (and line) and what is wrong."""


class PromptsMissing(PromptError):
    """The prompts' file or folder does not exist."""


def read_jsonl_prompts(path: Path, hint: str = "") -> list[str]:
    """Non-empty prompt strings from a JSON Lines file; hint is appended to a not-JSON message."""
    try:
        # utf-8-sig: a BOM (Windows editors write one) is not part of the first line. Lines end at \n, \r\n
        # or \r only: str.splitlines also splits at U+2028, U+2029 and NEL, which json.dumps leaves raw in strings
        lines = _LINE_END.split(bounded_read.read_text(path, bounded_read.PROMPTS_LIMIT, "utf-8-sig"))
    except FileNotFoundError:
        raise PromptsMissing(f"{path}: no such file or folder") from None
    except IsADirectoryError:
        raise PromptError(f"{path}: is a folder; pass a JSON Lines file") from None
    except bounded_read.FileRefused as exc:  # a FIFO, a device, a file past the limit
        raise PromptError(str(exc)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptError(f"{path}: cannot be read as UTF-8 text ({exc})") from None
    prompts = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:  # RecursionError: arrays nested past the stack
            why = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deep"
            raise PromptError(f'{path}:{i}: not JSON ({why}); each line is a JSON string or {{"prompt": "..."}}'
                              f"{hint}") from None
        text = item.get("prompt") if isinstance(item, dict) else item
        if not isinstance(text, str) or not text:
            raise PromptError(f'{path}:{i}: expected a non-empty string or {{"prompt": "..."}}')
        if (bad := unencodable(text)) is not None:
            raise PromptError(f"{path}:{i}: {bad}")
        prompts.append(text)
    if not prompts:
        raise PromptError(f"{path}: holds no prompts")
    return prompts


def unencodable(text: str) -> str | None:
    """Why text has no UTF-8 bytes (a lone surrogate, as JSON's \\ud800 decodes to), or None when it has."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"is not valid Unicode text ({exc.reason} at character {exc.start})"
    return None
