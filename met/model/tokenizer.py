"""The byte-level tokenizer of the embedded recipe: one token per UTF-8 byte, plus BOS and EOS."""

BOS = 256
EOS = 257
VOCAB_SIZE = 258


def encode(text: str) -> list[int]:
    """UTF-8 bytes of text as token ids."""
    return list(text.encode("utf-8"))


def decode(tokens: list[int]) -> str:
    """Text of byte tokens; special tokens are dropped and broken UTF-8 is replaced."""
    return bytes(t for t in tokens if t < 256).decode("utf-8", errors="replace")
