"""Tokenizers: the interface the engine uses, and the byte-level tokenizer of the embedded recipes."""

import codecs
from typing import Protocol

BOS = 256
EOS = 257
VOCAB_SIZE = 258


def encode(text: str) -> list[int]:
    """UTF-8 bytes of text as token ids."""
    return list(text.encode("utf-8"))


def decode(tokens: list[int]) -> str:
    """Text of byte tokens; special tokens are dropped and broken UTF-8 is replaced."""
    return bytes(t for t in tokens if t < 256).decode("utf-8", errors="replace")


class StreamDecoder(Protocol):
    """Text of a token stream, piece by piece: never a piece that a later token could still change."""

    def add(self, token: int) -> str:
        """The text this token completes ("" while it is held back); ValueError for an id outside the vocabulary."""
        ...

    def flush(self) -> str:
        """Everything held back (an unfinished character becomes U+FFFD); the stream's last piece."""
        ...


class Tokenizer(Protocol):
    """What the engine needs of a tokenizer: text to ids and back, the ids that end a sequence, a name."""

    name: str  # keys the shared-lookup scope: token ids are only comparable under one tokenizer
    eos_ids: frozenset[int]  # any of these ends generation (HF models may have several)
    vocab_size: int  # ids a prompt may hold: 0..vocab_size-1

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, tokens: list[int]) -> str: ...

    def stream(self) -> StreamDecoder: ...


class ByteStream:
    """Byte tokens to text through an incremental UTF-8 decoder; BOS and EOS carry no text."""

    __slots__ = ("_decoder",)

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, token: int) -> str:
        if not 0 <= token < VOCAB_SIZE:
            raise ValueError(f"token {token} is outside the vocabulary of {VOCAB_SIZE}")
        return self._decoder.decode(bytes((token,))) if token < 256 else ""

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)


class ByteTokenizer:
    """One token per UTF-8 byte, plus BOS and EOS: the embedded recipes' tokenizer."""

    name = "byte"
    eos_ids = frozenset({EOS})
    vocab_size = VOCAB_SIZE

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return encode(text)  # no special tokens are added to a text

    def decode(self, tokens: list[int]) -> str:
        return decode(tokens)

    def stream(self) -> ByteStream:
        return ByteStream()


BYTES = ByteTokenizer()
"""The byte tokenizer (stateless, so one instance serves everyone)."""
