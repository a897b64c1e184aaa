"""Incremental detokenization with stop strings: tokens in, text deltas out, never a stop string's prefix early.

The tokenizer's stream decoder holds back text a later token could still change (byte tokens: a
character whose bytes have not all arrived; an HF tokenizer: a piece that decodes to U+FFFD).
A delta never ends inside text that could still become a stop string: the longest tail of the
text that is a prefix of some stop string is held back until the next token decides it.
When a stop string appears, the text is cut just before it (OpenAI's rule: the stop string is not
returned) and the stream is finished; the tokens after it are not consumed.

Example, stop ("\\n\\n",): tokens of "a\\n" give delta "a" ("\\n" may start the stop string);
then "b" gives "\\nb"; then "\\n\\n" finishes the stream with no further text.
"""

from met.model.tokenizer import ByteStream, StreamDecoder


class TextStream:
    """One sequence's decoded text, what of it was already sent, and whether a stop string ended it."""

    __slots__ = ("stop", "_decoder", "_text", "_sent", "stopped_by", "tokens")

    def __init__(self, stop: tuple[str, ...] = (), decoder: StreamDecoder | None = None) -> None:
        if any(not s for s in stop):
            raise ValueError("a stop string must not be empty")
        self.stop = stop
        self._decoder = decoder if decoder is not None else ByteStream()  # default: the byte tokenizer's
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
            piece = self._decoder.add(t)  # raises for an id outside the vocabulary, before counting it
            used += 1
            self.tokens += 1
            self._append(piece)
        return self._take(final=self.stopped_by is not None), used

    def finish(self) -> str:
        """Flush everything held back (a partial character becomes U+FFFD); the stream's last delta."""
        if self.stopped_by is None:
            self._append(self._decoder.flush())
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
        # such a tail lies within the unsent text (the tail held back last time and what came since): a longer
        # one would extend a longer tail than the one held back. So a token costs O(new text), not O(all text)
        longest = min(len(text) - self._sent, max((len(s) for s in self.stop), default=1) - 1)
        for n in range(longest, 0, -1):
            tail = text[-n:]
            if any(s.startswith(tail) for s in self.stop):
                return n
        return 0
