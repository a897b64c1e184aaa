"""A checkpoint folder's tokenizer: tokenizer.json through the `tokenizers` library, and its stream decoder."""

import codecs
import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import met.bounded_read as bounded_read
from met.model.hf_config import CheckpointError

_HELD = 4  # a UTF-8 character is at most 4 bytes, so at most 3 tokens wait for one to finish
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # what the ByteFallback decoder reads as one byte


class WindowStream:
    """Stream decoding for any tokenizer: decode a short window of tokens, emit what grew past the last emission.

    The window starts at the tokens of the previous emission, so a decoder that treats a
    sequence's first token specially (a leading space) sees it as context, not as a first token;
    a piece is held back while its text ends in U+FFFD (a character split across tokens).
    Every token decodes the window, so the window is kept short, whatever the tokens:

    - A UTF-8 character is at most 4 bytes, so past _HELD held tokens the text is not all one
      character still arriving (a model repeating an invalid byte: ÿ ÿ ÿ ...). Then a cut k
      of the window is released when decode(window[:k]) is a prefix of decode(window), longer
      than what was emitted and shorter than the whole: its last character, U+FFFD or not,
      is settled, since bytes after it already began another one.
    - An id `skip` is true of is one decode drops before its decoder runs (a special token, an id
      past the vocabulary): it is passed over, not held.
    - `fallback` maps the byte tokens of a ByteFallback decoder (<0x41> -> 0x41) to their
      bytes. That decoder makes a run of byte tokens its text if the whole run is valid UTF-8
      and one U+FFFD per byte if not: <0x41><0x42> is "AB", <0x41><0x42><0xFF> is "���". So a
      run is held whole while it is valid (checked byte by byte, not decoded); once invalid it
      is emitted, and each later byte of the run is one more U+FFFD.
    """

    __slots__ = ("_decode", "_skip", "_fallback", "_window", "_read", "_done", "_run", "_broken")

    def __init__(self, decode: Callable[[list[int]], str], skip: Callable[[int], bool] | None = None,
                 fallback: Mapping[int, int] | None = None) -> None:
        self._decode = decode
        self._skip = skip or (lambda token: False)  # true of ids decode drops: they change no text
        self._fallback = dict(fallback or {})
        self._window: list[int] = []  # tokens since the start of the previous emission
        self._read = 0  # how many of them were already emitted
        self._done = ""  # decode(window[:read]), the text those emitted tokens give as context
        self._run: codecs.IncrementalDecoder | None = None  # checks the open byte-fallback run is still valid UTF-8
        self._broken = False  # the open byte-fallback run is not valid UTF-8, whatever bytes follow

    def add(self, token: int) -> str:
        if token < 0:
            raise ValueError(f"token {token} is not a token id")
        if self._skip(token):
            return ""
        byte = self._fallback.get(token)
        if byte is not None:
            return self._add_byte(token, byte)
        self._run, self._broken = None, False
        self._window.append(token)
        text = self._decode(self._window)
        if len(text) > len(self._done) and not text.endswith("\ufffd"):
            return self._emit(text, len(self._window))
        if len(self._window) - self._read > _HELD:
            return self._release(text)
        return ""

    def flush(self) -> str:
        text = self._decode(self._window)
        piece = text[len(self._done):]
        self._window, self._read, self._done, self._run, self._broken = [], 0, "", None, False
        return piece

    def _add_byte(self, token: int, byte: int) -> str:
        if self._broken:
            return "\ufffd"  # the window holds the run's start, which already makes the whole run U+FFFD
        self._window.append(token)
        if self._run is None:
            self._run = codecs.getincrementaldecoder("utf-8")()
        try:
            self._run.decode(bytes((byte,)))
            return ""
        except UnicodeDecodeError:
            self._run, self._broken = None, True
            return self._emit(self._decode(self._window), len(self._window))

    def _release(self, text: str) -> str:
        """Emit the longest settled text of the last few cuts of the window (text: its whole decode)."""
        window = self._window
        for k in range(len(window) - 1, max(self._read, len(window) - _HELD - 1), -1):
            if window[k - 1] in self._fallback and window[k] in self._fallback:
                continue  # never inside a byte-fallback run, whose text is all or nothing
            head = self._decode(window[:k])
            if len(self._done) < len(head) < len(text) and text.startswith(head):
                return self._emit(head, k)
        return ""

    def _emit(self, text: str, k: int) -> str:
        """Emit text, the decode of window[:k], past the last emission; window[read:k] becomes the context."""
        piece = text[len(self._done):]
        self._window = self._window[self._read:]
        self._read = k - self._read
        self._done = self._decode(self._window[: self._read])
        return piece


class HfTokenizer:
    """tokenizer.json of a Hugging Face checkpoint; encode adds the special tokens its template adds (e.g. BOS).

    Raises CheckpointError, naming the file, for one that cannot be read or parsed.
    """

    def __init__(self, path: Path, eos_ids: Iterable[int]) -> None:
        try:
            from tokenizers import Tokenizer as _Tokenizer
        except ImportError:  # pragma: no cover - tokenizers ships with transformers
            raise RuntimeError("reading tokenizer.json needs the `tokenizers` package: pip install tokenizers") from None
        try:  # a FIFO, a device or a file past the limit is refused unread
            data = bounded_read.read_bytes(path, bounded_read.TOKENIZER_LIMIT)
            self._tok = _Tokenizer.from_str(data.decode("utf-8"))
        except bounded_read.FileRefused as exc:
            raise CheckpointError(str(exc)) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"cannot read {path}: {exc}") from None
        except Exception as exc:  # the tokenizers library raises a bare Exception for a file it cannot parse
            raise CheckpointError(f"{path} is not a tokenizer.json the tokenizers library reads ({exc}); save one "
                                  "with AutoTokenizer.from_pretrained(...).save_pretrained(folder)") from None
        self.name = f"hf-{hashlib.sha256(data).hexdigest()[:16]}"
        self.eos_ids = frozenset(eos_ids)
        # ids a prompt may hold are 0..vocab_size-1 (the Tokenizer protocol): one past the highest id, which is
        # above the token count where ids skip numbers
        self.vocab_size = max(self._tok.get_vocab(with_added_tokens=True).values(), default=-1) + 1
        # what a stream needs to know of decode: the special texts it drops, the byte tokens of a ByteFallback decoder.
        # decode drops a token by its text: any text an entry of "added_tokens" marks special (and not empty), even
        # where a later entry of the same text is not special; get_added_tokens_decoder shows that later entry alone
        doc = json.loads(data)
        self._special = frozenset(t["content"] for t in doc.get("added_tokens") or ()
                                  if t.get("special") and t["content"])
        self._fallback = _byte_tokens(self._tok.get_vocab(with_added_tokens=True)) if _has_byte_fallback(
            doc.get("decoder")) else {}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of text, with the template's special tokens (as transformers' tokenizer(text) gives).

        add_special_tokens=False: the text's own tokens only (a rendered chat prompt, which writes its own).
        """
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, tokens: list[int]) -> str:
        """Text of tokens, special tokens skipped (as transformers' decode(..., skip_special_tokens=True))."""
        return self._tok.decode(list(tokens), skip_special_tokens=True)

    def stream(self) -> WindowStream:
        """A stream decoder for one sequence's generated tokens."""
        return WindowStream(self.decode, self._drops, self._fallback)

    def _drops(self, token: int) -> bool:
        """Whether decode drops token: a special token, or an id no token has (a padded output row, a gap)."""
        # not `token >= vocab_size`: ids may skip numbers, so an id past the token count can still be text
        text = self._tok.id_to_token(token)
        return text is None or text in self._special


def _has_byte_fallback(decoder: dict | None) -> bool:
    """Whether a tokenizer.json decoder, or one in its Sequence, is ByteFallback."""
    if not decoder:
        return False
    return decoder.get("type") == "ByteFallback" or any(_has_byte_fallback(d) for d in decoder.get("decoders") or ())


def _byte_tokens(vocab: dict[str, int]) -> dict[int, int]:
    """Token id -> byte of the tokens ByteFallback reads as one byte (<0x41> -> 0x41)."""
    return {i: int(m[1], 16) for t, i in vocab.items() if (m := _BYTE_TOKEN.fullmatch(t))}
