"""Incremental detokenization with stop strings: byte tokens in, text deltas out, never a stop string's prefix early.

Tokens are UTF-8 bytes; an incremental decoder holds back a character whose bytes have not all
arrived. A delta never ends inside text that could still become a stop string: the longest tail
of the text that is a prefix of some stop string is held back until the next token decides it.
When a stop string appears, the text is cut just before it (OpenAI's rule: the stop string is not
returned) and the stream is finished; the tokens after it are not consumed.

Example, stop ("\\n\\n",): tokens of "a\\n" give delta "a" ("\\n" may start the stop string);
then "b" gives "\\nb"; then "\\n\\n" finishes the stream with no further text.
"""

import codecs

from met.model.tokenizer import VOCAB_SIZE

BYTE_TOKENS = 256  # ids below this are bytes; the rest (BOS, EOS) carry no text


class TextStream:
    """One sequence's decoded text, what of it was already sent, and whether a stop string ended it."""

    __slots__ = ("stop", "_decoder", "_text", "_sent", "stopped_by", "tokens")

    def __init__(self, stop: tuple[str, ...] = ()) -> None:
        if any(not s for s in stop):
            raise ValueError("a stop string must not be empty")
        self.stop = stop
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._text = ""
        self._sent = 0
        self.stopped_by: str | None = None  # the stop string that ended the stream
        self.tokens = 0  # tokens consumed (the ones after a stop string are not)

    @property
    def text(self) -> str:
        """All text decoded so far (cut before a stop string once one appeared)."""
        return self._text

    def feed(self, tokens: list[int]) -> tuple[str, int]:
        """Consume tokens until a stop string appears; returns (new text safe to send, tokens consumed)."""
        used = 0
        for t in tokens:
            if self.stopped_by is not None:
                break
            if not 0 <= t < VOCAB_SIZE:
                raise ValueError(f"token {t} is outside the vocabulary of {VOCAB_SIZE}")
            used += 1
            self.tokens += 1
            if t < BYTE_TOKENS:
                self._append(self._decoder.decode(bytes((t,))))
        return self._take(final=self.stopped_by is not None), used

    def finish(self) -> str:
        """Flush everything held back (a partial character becomes U+FFFD); the stream's last delta."""
        if self.stopped_by is None:
            self._append(self._decoder.decode(b"", final=True))
        return self._take(final=True)

    def _append(self, piece: str) -> None:
        if not piece:
            return
        start = max(0, len(self._text) - max((len(s) for s in self.stop), default=0))
        self._text += piece
        hits = [(i, s) for s in self.stop if (i := self._text.find(s, start)) >= 0]
        if hits:
            cut, which = min(hits)
            self._text = self._text[:cut]
            self.stopped_by = which

    def _take(self, final: bool) -> str:
        end = len(self._text) if final else len(self._text) - self._held_tail()
        end = max(end, self._sent)
        delta = self._text[self._sent : end]
        self._sent = end
        return delta

    def _held_tail(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of a stop string."""
        text = self._text
        for n in range(min(len(text), max((len(s) for s in self.stop), default=1) - 1), 0, -1):
            tail = text[-n:]
            if any(s.startswith(tail) for s in self.stop):
                return n
        return 0
