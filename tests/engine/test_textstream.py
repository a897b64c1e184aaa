"""Incremental detokenization: deltas concatenate to the one-shot decode; stop strings cut and are never leaked early."""

from hypothesis import given
from hypothesis import strategies as st

from met.engine.textstream import TextStream
from met.model.tokenizer import EOS, decode, encode


def _run(stream: TextStream, tokens: list[int], step: int = 1) -> str:
    out = []
    for i in range(0, len(tokens), step):
        delta, _ = stream.feed(tokens[i : i + step])
        out.append(delta)
    out.append(stream.finish())
    return "".join(out)


@given(st.lists(st.integers(0, 257), max_size=60), st.integers(1, 5))
def test_deltas_join_to_the_one_shot_decode(tokens, step):
    # any bytes, even broken UTF-8, any chunking: the same text as decode() of all tokens at once
    assert _run(TextStream(), tokens, step) == decode(tokens)


def test_a_multibyte_character_is_held_until_whole():
    # "é" is two bytes: the first alone yields nothing, the second yields the character
    s = TextStream()
    first, second = encode("é")
    assert s.feed([first]) == ("", 1)
    assert s.feed([second]) == ("é", 1)


def test_stop_string_cuts_and_is_not_returned():
    # stop "\n\n": text up to it; tokens after it are not consumed
    s = TextStream(("\n\n",))
    tokens = encode("ab\n\ncd")
    delta, used = s.feed(tokens)
    assert (delta, used, s.stopped_by) == ("ab", 4, "\n\n")
    assert s.finish() == ""


def test_a_possible_stop_prefix_is_held_back():
    # "a\n" may be the start of "\n\n": only "a" goes out until the next byte decides
    s = TextStream(("\n\n",))
    assert s.feed(encode("a\n"))[0] == "a"
    assert s.feed(encode("b"))[0] == "\nb"
    assert s.stopped_by is None


def test_stop_string_spanning_feeds():
    # "STOP" arrives one byte per feed; nothing of it is ever sent
    s = TextStream(("STOP",))
    sent = "".join(s.feed([t])[0] for t in encode("xxSTOPyy"))
    assert sent + s.finish() == "xx"
    assert s.tokens == 6  # "xxSTOP": the bytes after the stop string are not consumed


@given(st.text(alphabet="ab\n", max_size=40), st.sampled_from(["a\nb", "\n\n", "bb", "ab"]))
def test_stop_output_is_the_text_before_the_first_stop(text, stop):
    # the result is exactly the text before the stop string's first occurrence (or all of it)
    expected = text[: text.find(stop)] if stop in text else text
    assert _run(TextStream((stop,)), encode(text)) == expected


def test_special_tokens_carry_no_text():
    # EOS (and BOS) count as consumed tokens but add no text
    s = TextStream()
    assert s.feed([EOS, *encode("hi")]) == ("hi", 3)


@given(st.lists(st.sampled_from(encode("ab\né😀") + [EOS]), max_size=40),
       st.lists(st.text(alphabet="ab\né😀", min_size=1, max_size=4), max_size=4), st.integers(1, 5))
def test_several_stops_any_chunking_give_the_text_before_the_first(tokens, stops, step):
    # overlapping stops, multi-byte characters split across feeds: the one-shot decode cut at the first stop
    full = decode(tokens)
    assert _run(TextStream(tuple(stops)), tokens, step) == full[: _first_stop(full, stops)]


def _first_stop(text: str, stops: list[str]) -> int:
    """Where generation stops: at the first character that completes a stop string, the text is cut before the
    earliest-starting stop string in it by then."""
    for end in range(1, len(text) + 1):
        if starts := [text[:end].find(s) for s in stops if s in text[:end]]:
            return min(starts)
    return len(text)


def test_a_stop_inside_a_longer_one_ends_the_text_where_it_completes():
    # "b" completes before "abc" could: generation stops at "b", whichever way the tokens arrive
    for step in (1, 5):
        assert _run(TextStream(("abc", "b")), encode("xabcx"), step) == "xa"


class _Counted(str):
    """A stop string that counts the tails compared with it."""

    calls = 0

    def startswith(self, *args) -> bool:
        _Counted.calls += 1
        return super().startswith(*args)


def test_holding_back_costs_the_new_text_not_all_of_it():
    # a long stop that never matches, 1000 bytes fed one by one: a few comparisons per byte, not one per byte
    # of all the text so far (that was ~500k comparisons, O(n^2) on the scheduler thread, slowing every stream)
    _Counted.calls = 0
    s = TextStream((_Counted("a" * 2000),))
    for t in encode("b" * 1000):
        s.feed([t])
    assert s.finish() == "" and _Counted.calls <= 2 * 1000
