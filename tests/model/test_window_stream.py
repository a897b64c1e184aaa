"""WindowStream: streamed text equals decoding all tokens at once, and each token costs a bounded decode.

Over a byte-level BPE (GPT-2, Llama 3, Qwen2: lossy UTF-8 over all bytes), a SentencePiece-style
tokenizer with byte-fallback tokens (Llama 2, Mistral: a run of <0xHH> is its text if valid UTF-8,
else one U+FFFD per byte) and a pure-Python lossy decoder.
"""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from checkpoint_helpers import tokenizer
from met.model.hf_tokenizer import HfTokenizer, WindowStream

pytest.importorskip("tokenizers")

# bytes that matter to UTF-8: ASCII, continuations, 2/3/4-byte leads (E0, ED, F0, F4 restrict their
# second byte), and bytes never valid (C0, C1, F5..FF)
BYTES = [0x41, 0x20, 0x80, 0x8F, 0x97, 0xA5, 0xBF, 0xC0, 0xC3, 0xE0, 0xE6, 0xED, 0xF0, 0xF4, 0xF5, 0xFF]
TEXTS = ["日本語", "😀 é", " the x", "a😀b"]


def _gpt2_byte_chars() -> dict[int, str]:
    """Byte -> the character a byte-level BPE writes it as (GPT-2's bytes_to_unicode)."""
    shown = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    hidden = [b for b in range(256) if b not in shown]
    return {b: chr(b) for b in shown} | {b: chr(256 + n) for n, b in enumerate(hidden)}


@pytest.fixture(scope="module")
def byte_level(tmp_path_factory) -> tuple[HfTokenizer, dict[int, int]]:
    """The checkpoint tests' byte-level BPE (<s> 0, </s> 1), and byte -> its token id."""
    from tokenizers import Tokenizer

    folder = tmp_path_factory.mktemp("bl")
    tokenizer(folder)
    vocab = Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab()
    return HfTokenizer(folder / "tokenizer.json", [1]), {b: vocab[c] for b, c in _gpt2_byte_chars().items()}


@pytest.fixture(scope="module")
def byte_fallback(tmp_path_factory) -> tuple[HfTokenizer, dict[int, int]]:
    """A Llama-2-style tokenizer: <unk> <s> </s>, <0x00>..<0xFF> as ids 3..258, a few words; Llama 2's decoder."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    words = ["▁x", "▁", "▁the", "x", "é", "日", "▁a"]  # "▁x" is 259
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"<0x{b:02X}>": 3 + b for b in range(256)}
    vocab |= {w: 259 + i for i, w in enumerate(words)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    path = tmp_path_factory.mktemp("bf") / "tokenizer.json"
    tok.save(str(path))
    return HfTokenizer(path, [2]), {b: 3 + b for b in range(256)}


def streamed(stream, ids: list[int]) -> list[str]:
    """The pieces a stream gives for ids, its flush last."""
    return [stream.add(t) for t in ids] + [stream.flush()]


def _lossy(chunks: list[bytes]):
    """A decode over token -> bytes: UTF-8 with U+FFFD for what is broken, as a byte-level BPE decodes."""
    return lambda tokens: b"".join(chunks[t] for t in tokens).decode("utf-8", errors="replace")


@pytest.mark.parametrize("kind", ["byte_level", "byte_fallback"])
def test_a_long_run_of_invalid_bytes_costs_linear_decoding(kind, request, monkeypatch):
    # 3000 times byte 0xFF: each token decodes a few tokens, not the whole run (the run was re-decoded
    # on every token: about n^2/2 = 4.5M tokens), and the U+FFFD come out as the run goes
    tok, byte_id = request.getfixturevalue(kind)
    n, decoded = 3000, []
    one_shot = tok.decode([byte_id[0xFF]] * n)
    monkeypatch.setattr(tok, "decode", lambda tokens: decoded.append(len(tokens)) or HfTokenizer.decode(tok, tokens))
    pieces = streamed(tok.stream(), [byte_id[0xFF]] * n)
    assert "".join(pieces) == one_shot == "\ufffd" * n
    assert sum(decoded) <= 20 * n and len(decoded) <= 3 * n
    assert len("".join(pieces[:-1])) >= n - 4  # the flush holds at most a character's worth


def test_ids_decode_drops_cost_no_decoding(byte_level, monkeypatch):
    # special tokens and ids past the vocabulary (a padded output layer) add no text: they were held
    # and re-decoded like an unfinished character
    tok, _ = byte_level
    ids, decoded = tok.encode("x") + [1, tok.vocab_size + 7] * 1500, []
    monkeypatch.setattr(tok, "decode", lambda tokens: decoded.append(len(tokens)) or HfTokenizer.decode(tok, tokens))
    assert "".join(streamed(tok.stream(), ids)) == "x" and sum(decoded) <= 10


def test_a_byte_fallback_run_is_held_while_a_later_byte_can_still_break_it(byte_fallback):
    # the decoder makes an invalid run one U+FFFD per byte, its valid start too: "AB" is never sent
    tok, b = byte_fallback
    x = 259  # "▁x"
    ids = [b[0x41], b[0x42], b[0xFF], b[0x43], x]
    assert tok.decode(ids) == "\ufffd" * 4 + " x"
    assert streamed(tok.stream(), ids) == ["", "", "\ufffd" * 3, "\ufffd", " x", ""]
    # a valid run comes out whole when a word ends it; a special token inside the run does not end it
    ids = [x, b[0xE6], 2, b[0x97], b[0xA5], x]
    assert tok.decode(ids) == "x日 x"
    assert streamed(tok.stream(), ids) == ["x", "", "", "", "", "日 x", ""]


@given(st.lists(st.one_of(st.sampled_from(BYTES).map(lambda b: bytes((b,))), st.sampled_from(TEXTS).map(str.encode)),
                max_size=30),
       st.lists(st.integers(1, 4), min_size=1, max_size=8))
def test_lossy_stream_equals_one_shot_decode(parts, sizes):
    # tokens of 1..4 bytes cut from invalid bytes and split characters: the pieces join to the one-shot text
    data = b"".join(parts)
    chunks, i = [], 0
    while i < len(data):
        chunks.append(data[i: i + sizes[len(chunks) % len(sizes)]])
        i += len(chunks[-1])
    decode = _lossy(chunks)
    ids = list(range(len(chunks)))
    assert "".join(streamed(WindowStream(decode), ids)) == decode(ids)


def _token_lists(tok: HfTokenizer, byte_id: dict[int, int], specials: list[int]):
    """Id lists mixing single byte tokens, whole texts (characters split over byte tokens), special tokens, any id."""
    one = st.one_of(st.sampled_from(BYTES).map(lambda b: [byte_id[b]]), st.sampled_from(TEXTS).map(tok.encode),
                    st.sampled_from(specials).map(lambda s: [s]), st.integers(0, tok.vocab_size + 2).map(lambda i: [i]))
    return st.lists(one, max_size=25).map(lambda parts: [t for p in parts for t in p])


@given(st.data())
def test_byte_level_stream_equals_one_shot_decode(byte_level, data):
    # invalid bytes, characters split over tokens, merged tokens, dropped ids: streamed text is the decoded text
    tok, byte_id = byte_level
    ids = data.draw(_token_lists(tok, byte_id, [0, 1]))
    assert "".join(streamed(tok.stream(), ids)) == tok.decode(ids)


@given(st.data())
def test_byte_fallback_stream_equals_one_shot_decode(byte_fallback, data):
    # as above, where a byte run is its text or all U+FFFD and a special token does not end a run
    tok, byte_id = byte_fallback
    ids = data.draw(_token_lists(tok, byte_id, [0, 1, 2]))
    assert "".join(streamed(tok.stream(), ids)) == tok.decode(ids)


def test_an_id_above_a_gap_in_the_vocabulary_is_text_not_dropped(tmp_path):
    # ids need not be contiguous: "▁far" is 400 in a vocabulary of 261 tokens, and decode reads it; the
    # stream took every id at or past the token count for a padded output row and dropped it
    from tokenizers import Tokenizer, decoders, models

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"<0x{b:02X}>": 3 + b for b in range(256)}
    vocab |= {"▁x": 259, "▁far": 400}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    tok.save(str(tmp_path / "tokenizer.json"))
    hf = HfTokenizer(tmp_path / "tokenizer.json", [2])
    assert hf.vocab_size == 401  # ids 0..400, as the Tokenizer protocol reads it, though it holds 261 tokens
    for ids in ([259, 400, 259], [3 + 0x41, 400, 3 + 0x42], [259, 401, 259]):  # 401: no token, dropped
        assert "".join(streamed(hf.stream(), ids)) == hf.decode(ids)


def test_a_token_decode_drops_by_its_special_text_is_skipped_inside_a_byte_run(tmp_path):
    # a hand-edited tokenizer.json lists "<s>" twice, the later entry not special: the library's decode still
    # drops id 1 (it drops special tokens by text), so inside a byte run it must not end the run, as a special does
    import json

    from tokenizers import Tokenizer, decoders, models

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"<0x{b:02X}>": 3 + b for b in range(256)} | {"▁x": 259}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    doc = json.loads(tok.to_str())
    doc["added_tokens"].append(dict(doc["added_tokens"][1], special=False))  # "<s>" again, id 1, not special
    (tmp_path / "tokenizer.json").write_text(json.dumps(doc))
    hf = HfTokenizer(tmp_path / "tokenizer.json", [2])
    ids = [259, 3 + 0xE6, 1, 3 + 0x97, 3 + 0xA5, 259]  # 日 is E6 97 A5
    assert hf.decode(ids) == "x日 x"
    assert streamed(hf.stream(), ids) == ["x", "", "", "", "", "日 x", ""]
