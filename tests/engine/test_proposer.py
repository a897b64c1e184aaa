"""Host drafts: the n-gram proposer reads the history through the lookup index and proposes what its reference does."""

from hypothesis import given
from hypothesis import strategies as st

from met.engine.proposer import NGRAM_MAX, Proposer
from met.speculative import ngram

tokens = st.lists(st.integers(0, 5), max_size=40)  # a small alphabet: matches are frequent


@given(tokens.filter(bool), st.lists(st.tuples(st.integers(1, 6), tokens), max_size=8))
def test_ngram_drafts_are_the_reference_scans_after_any_steps(prompt, steps):
    # each step: ask `depth` drafts, then emit some tokens (as a verify would), and ask again
    p, history = Proposer("ngram", prompt), list(prompt)
    for depth, emitted in steps:
        assert p.host_draft(depth).tokens == ngram.propose(history, NGRAM_MAX, 1, depth)
        p.observe(depth, 0, emitted)
        history += emitted
    assert p.host_draft(4).tokens == ngram.propose(history, NGRAM_MAX, 1, 4)


def test_ngram_depth_is_fixed_where_prompt_lookup_adapts_its_window():
    # after a broken copy prompt lookup halves its window; n-gram keeps proposing the depth asked
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2]
    fixed, adaptive = Proposer("ngram", prompt), Proposer("prompt-lookup", prompt)
    for p in (fixed, adaptive):
        assert p.host_draft(4).tokens == [3, 4, 5, 6]
        p.observe(4, 0, [9])
        p.observe(0, 0, [5, 6])  # the history ends in 5, 6 again: its latest occurrence goes on 7, 8, 1, 2
    assert fixed.host_draft(4).tokens == [7, 8, 1, 2] and adaptive.host_draft(4).tokens == [7, 8]


def test_a_match_shorter_than_min_ngram_proposes_nothing():
    # history ...7 1 2: the suffix (1, 2) recurs, (7, 1, 2) does not: min 2 copies, min 3 waits
    prompt = [1, 2, 3, 4, 5, 6, 7, 1, 2]
    assert Proposer("prompt-lookup", prompt, min_ngram=2).host_draft(4).tokens == [3, 4, 5, 6]
    assert Proposer("prompt-lookup", prompt, min_ngram=3).host_draft(4).tokens == []
    assert Proposer("ngram", prompt, min_ngram=3).host_draft(4).tokens == []
    # once the text's end repeats three tokens (5 6 7 ... 5 6 7) min 3 copies too
    p = Proposer("prompt-lookup", prompt, min_ngram=3)
    p.observe(0, 0, [5, 6, 7])
    assert p.host_draft(4).tokens == [1, 2, 5, 6]
