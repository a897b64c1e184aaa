"""Acceptance rules: greedy prefix match, and speculative sampling that preserves the target distribution."""

import torch
from hypothesis import given, strategies as st

from met.engine.accept import greedy_accept, speculative_accept, target_distribution


def test_greedy_accepts_longest_matching_prefix():
    # drafts 5,6,9 against target 5,6,7,8: two accepted, bonus is the target's 7
    assert greedy_accept([5, 6, 9], [5, 6, 7, 8]) == (2, 7)
    # no drafts: a plain decode step emits the target's first token
    assert greedy_accept([], [4]) == (0, 4)
    # all accepted: the bonus is the token after the last draft
    assert greedy_accept([1, 2], [1, 2, 3]) == (2, 3)


@given(st.lists(st.integers(0, 3), max_size=5), st.lists(st.integers(0, 3), min_size=6, max_size=6))
def test_greedy_emits_exactly_the_target_prefix(drafts, target):
    # emitted tokens are always a prefix of the target's own greedy tokens
    a, bonus = greedy_accept(drafts, target)
    assert drafts[:a] + [bonus] == target[: a + 1]


def _first_token_frequencies(p, q, drafts, trials, seed=0):
    """Frequencies of the first emitted token; with q given, the draft is sampled from q each time."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(p.shape[1], dtype=torch.float64)
    for _ in range(trials):
        if q is not None:
            drafts = [int(torch.multinomial(q[0], 1, generator=gen))]
        a, nxt = speculative_accept(drafts, q, p, gen)
        counts[drafts[0] if a > 0 else nxt] += 1
    return counts / trials


def test_speculative_sampling_preserves_target_distribution():
    # q very unlike p: the first emitted token must still follow p (total variation small)
    p = torch.tensor([[0.6, 0.3, 0.1, 0.0], [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)
    q = torch.tensor([[0.1, 0.1, 0.1, 0.7]], dtype=torch.float64)
    freq = _first_token_frequencies(p, q, None, 20000)
    assert (freq - p[0]).abs().sum() / 2 < 0.02
    # the token q likes most and p never picks is never emitted
    assert freq[3] == 0


def test_speculative_sampling_with_deterministic_drafts():
    # host-proposer drafts (one-hot q): accepted with probability p(x), else p without x
    p = torch.tensor([[0.5, 0.2, 0.3], [1 / 3, 1 / 3, 1 / 3]], dtype=torch.float64)
    freq = _first_token_frequencies(p, None, [2], 20000, seed=3)
    assert (freq - p[0]).abs().sum() / 2 < 0.02


def test_top_p_keeps_the_nucleus():
    # probs 0.5, 0.3, 0.2: top_p 0.7 keeps the first two, renormalised
    logits = torch.log(torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64))
    out = target_distribution(logits, 1.0, 0.7)
    assert torch.allclose(out, torch.tensor([0.625, 0.375, 0.0], dtype=torch.float64))


def test_a_tiny_temperature_is_the_argmax_not_nan():
    # logits / 5e-324 overflowed to inf and the softmax gave NaN, which multinomial refused (a request's
    # failure that failed every sequence in its step); from the row's maximum down it is the argmax
    for t in (5e-324, 1e-308, 1e-30):
        probs = target_distribution(torch.tensor([[1.0, 3.0, 2.0], [-5.0, -6.0, -7.0]]), t, 1.0)
        assert probs.tolist() == [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]
    # and at ordinary temperatures nothing changes: the softmax is shift-invariant
    logits = torch.tensor([0.3, -1.2, 2.5, 0.0])
    assert torch.allclose(target_distribution(logits, 0.7, 1.0), torch.softmax(logits.double() / 0.7, -1))
