"""tokenizer.json through met's Tokenizer interface: round trips, and streamed text equal to decoding it whole."""

import pytest

from checkpoint_helpers import tokenizer
from met.engine.textstream import TextStream
from met.model.hf_config import CheckpointError
from met.model.hf_tokenizer import HfTokenizer, WindowStream
from met.model.tokenizer import BYTES

pytest.importorskip("tokenizers")

TEXTS = ["café, naïve, 日本語 😀 x", "def add(a, b):\n    return a + b\n", "😀😀 ünïcödé"]


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> HfTokenizer:
    folder = tmp_path_factory.mktemp("tok")
    tokenizer(folder)
    return HfTokenizer(folder / "tokenizer.json", [1])


@pytest.mark.parametrize("text", TEXTS)
def test_stream_one_token_at_a_time_equals_decode(tok, text):
    # multi-byte characters split over tokens: no piece holds U+FFFD, the pieces join to the whole text
    ids = tok.encode(text)
    stream = tok.stream()
    pieces = [stream.add(t) for t in ids] + [stream.flush()]
    assert "".join(pieces) == tok.decode(ids) == text
    assert not any("\ufffd" in p for p in pieces)


def test_a_split_character_is_held_until_its_last_token(tok):
    # "😀" is several byte-level tokens here; nothing is emitted until the last of them
    ids = tok.encode("😀")
    assert len(ids) > 1
    stream = tok.stream()
    assert [stream.add(t) for t in ids] == [""] * (len(ids) - 1) + ["😀"]


def test_text_stream_with_a_stop_string_over_hf_tokens(tok):
    # the stop string cuts the text, whichever tokens it spans
    stream = TextStream(("return",), tok.stream())
    sent = []
    for t in tok.encode(TEXTS[1]):
        sent.append(stream.feed([t])[0])
    sent.append(stream.finish())
    assert "".join(sent) == "def add(a, b):\n    " and stream.stopped_by == "return"


def test_window_stream_keeps_a_short_window():
    # after an emission the window restarts at the emitted tokens: decode never sees the whole history
    seen = []

    def decode(tokens):
        seen.append(len(tokens))
        return "".join(chr(97 + t) for t in tokens)

    stream = WindowStream(decode)
    assert "".join(stream.add(t) for t in range(20)) == "abcdefghijklmnopqrst"
    assert max(seen) <= 2


def test_byte_tokenizer_keeps_its_meaning():
    # the embedded recipes' tokenizer: bytes, EOS 257, named "byte" in shared-lookup scopes
    assert BYTES.encode("é") == [0xC3, 0xA9] and BYTES.decode([0xC3, 0xA9, 257]) == "é"
    assert BYTES.eos_ids == {257} and BYTES.name == "byte" and BYTES.vocab_size == 258
    with pytest.raises(ValueError, match="outside the vocabulary"):
        BYTES.stream().add(300)


@pytest.mark.parametrize("content, message", [
    (b"garbage", "is not a tokenizer.json the tokenizers library reads (expected value"),  # was a bare Exception
    (b"{}", "is not a tokenizer.json the tokenizers library reads"),
    (b"\xff\xfe", "cannot read"),  # not UTF-8
])
def test_an_unreadable_tokenizer_json_is_a_checkpoint_error(tmp_path, content, message):
    # CheckpointError (the CLIs' exit 65) naming the file, not the tokenizers library's bare Exception
    (tmp_path / "tokenizer.json").write_bytes(content)
    with pytest.raises(CheckpointError) as err:
        HfTokenizer(tmp_path / "tokenizer.json", [1])
    assert message in str(err.value) and str(tmp_path / "tokenizer.json") in str(err.value)
