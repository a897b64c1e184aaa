"""A checkpoint folder's tokenizer: tokenizer.json through the `tokenizers` library, and its stream decoder."""

import hashlib
from collections.abc import Callable, Iterable
from pathlib import Path

from met.model.hf_config import CheckpointError


class WindowStream:
    """Stream decoding for any tokenizer: decode a short window of tokens, emit what grew past the last emission.

    The window starts at the tokens of the previous emission, so a decoder that treats a
    sequence's first token specially (a leading space) sees it as context, not as a first token;
    a piece is held back while its text ends in U+FFFD (a character split across tokens).
    """

    __slots__ = ("_decode", "_window", "_read")

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self._window: list[int] = []  # tokens since the start of the previous emission
        self._read = 0  # how many of them were already emitted

    def add(self, token: int) -> str:
        if token < 0:
            raise ValueError(f"token {token} is not a token id")
        self._window.append(token)
        done = self._decode(self._window[: self._read])
        text = self._decode(self._window)
        if len(text) <= len(done) or text.endswith("\ufffd"):
            return ""
        self._window = self._window[self._read :]
        self._read = len(self._window)
        return text[len(done) :]

    def flush(self) -> str:
        done = self._decode(self._window[: self._read])
        text = self._decode(self._window)
        self._window, self._read = [], 0
        return text[len(done) :]


class HfTokenizer:
    """tokenizer.json of a Hugging Face checkpoint; encode adds the special tokens its template adds (e.g. BOS).

    Raises CheckpointError, naming the file, for one that cannot be read or parsed.
    """

    def __init__(self, path: Path, eos_ids: Iterable[int]) -> None:
        try:
            from tokenizers import Tokenizer as _Tokenizer
        except ImportError:  # pragma: no cover - tokenizers ships with transformers
            raise RuntimeError("reading tokenizer.json needs the `tokenizers` package: pip install tokenizers") from None
        try:
            data = path.read_bytes()
            self._tok = _Tokenizer.from_str(data.decode("utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"cannot read {path}: {exc}") from None
        except Exception as exc:  # the tokenizers library raises a bare Exception for a file it cannot parse
            raise CheckpointError(f"{path} is not a tokenizer.json the tokenizers library reads ({exc}); save one "
                                  "with AutoTokenizer.from_pretrained(...).save_pretrained(folder)") from None
        self.name = f"hf-{hashlib.sha256(data).hexdigest()[:16]}"
        self.eos_ids = frozenset(eos_ids)
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of text, with the template's special tokens (as transformers' tokenizer(text) gives)."""
        return self._tok.encode(text).ids

    def decode(self, tokens: list[int]) -> str:
        """Text of tokens, special tokens skipped (as transformers' decode(..., skip_special_tokens=True))."""
        return self._tok.decode(list(tokens), skip_special_tokens=True)

    def stream(self) -> WindowStream:
        """A stream decoder for one sequence's generated tokens."""
        return WindowStream(self.decode)
