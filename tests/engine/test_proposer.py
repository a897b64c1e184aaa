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
