"""Speculation end to end at temperature > 0 and top-p < 1: generated text is distributed exactly as plain sampling's.

Each spec mode generates N sequences, one seed each, and the joint law of their first L tokens is
compared with the exact one, computed teacher-forced from the model itself (plain forward passes
through target_distribution, the product of the conditionals). A wiring bug (p or q at the wrong
position, temperature or top-p on one side only, the bonus from the wrong row, a rollback off by
one) moves that law far past what N samples can explain.

The check: n * KL(empirical || exact) over the joint outcomes must stay under g_threshold(cells,
ALPHA), a finite-sample bound (no chi-square approximation). The N sequences are independent draws
(one generator each) and the cells are fixed by the exact law alone, so a correct runner fails a
spec mode's check with probability at most ALPHA = 1e-7, and the file's twelve (six modes, by generator and by
seed) with at most 1.2e-6.
Measured: correct code gives 2 to 14 against a threshold of 50.5; each of fourteen injected wiring
bugs (q recorded without temperature or top-p, q or p one row off, the bonus from q or p[k - 1],
the residual without q, rollback one off either way, ...) gave 180 to 860, or an outcome top-p
makes impossible.

The model is random_models' micro preset with two changes: 4 tokens instead of 258, so that the
joint law of L tokens has few outcomes and N samples pin it down; and weights of std 0.45 instead
of 0.3, at which each next token depends on more than the one before it (at 0.3 it barely does,
and a draft or row taken one position off changes almost nothing).
"""

import dataclasses
import itertools
import math
from collections import Counter

import pytest
import torch

from met.engine import runner as runner_module
from met.engine.accept import target_distribution
from met.engine.generate import generate
from met.engine.runner import ModelRunner, Sampling
from met.model.config import ModelConfig
from met.model.dflash import DflashConfig, DflashDrafter
from met.model.transformer import Transformer
from met.speculative.dflash_rung import DflashParams, DflashRung
from eagle3_helpers import random_head

VOCAB = 4
WEIGHT_STD = 0.45
SAMPLING = Sampling(temperature=0.5, top_p=0.7)  # far from 1: a side that skips temperature or top-p is far off
PROMPT = [1, 0, 1, 2, 3, 0, 0, 2, 3]  # repeats: prompt lookup matches and proposes from the first step
DEPTH = 2  # drafts per step
L = DEPTH + 2  # tokens compared: prefill's, the first step's drafts, and its bonus when both are accepted
N = 4000  # sequences per spec mode
MIN_EXPECTED = 5  # outcomes expected fewer times than this share one "other" cell
ALPHA = 1e-7  # false-failure probability of one spec mode's check; the file's twelve: at most 1.2e-6


def small_micro(seed: int = 0) -> Transformer:
    """The micro preset over VOCAB tokens with normal(0, WEIGHT_STD) weights, in float64 and eval mode."""
    torch.manual_seed(seed)
    m = Transformer(ModelConfig.from_name("micro").with_(vocab_size=VOCAB, max_seq_len=32))
    for p in m.parameters():
        torch.nn.init.normal_(p, std=WEIGHT_STD)
    return m.double().eval()


def random_dflash(target: Transformer, seed: int = 1) -> DflashDrafter:
    """An untrained block drafter of target: whatever its weights, the distributions it samples from are a valid q."""
    torch.manual_seed(seed)
    d = DflashDrafter(DflashConfig.for_target(target.cfg, block=4, ffn_dim=64))
    for p in d.parameters():
        torch.nn.init.normal_(p, std=WEIGHT_STD)
    return d.double().eval()


@torch.inference_mode()
def exact_law(model: Transformer, prompt: list[int], length: int, sampling: Sampling) -> dict[tuple[int, ...], float]:
    """P(first `length` generated tokens) by teacher forcing: a plain forward per prefix, conditionals multiplied."""
    law = {(): 1.0}
    for _ in range(length):
        prefixes = list(law)
        logits = model(torch.tensor([prompt + list(t) for t in prefixes]))[:, -1]  # [prefixes, V]
        probs = target_distribution(logits, sampling.temperature, sampling.top_p).tolist()
        law = {t + (x,): law[t] * px for t, row in zip(prefixes, probs) for x, px in enumerate(row) if px > 0}
    return law


def g_threshold(cells: int, alpha: float) -> float:
    """t with P(n * KL(empirical || law) >= t) <= alpha for n draws of any law over `cells` cells, any n.

    Agrawal, "Finite-sample concentration of the multinomial in relative entropy" (IEEE Trans. Inf.
    Theory 2020): the moment generating function of n * KL is at most that of a Gamma(cells - 1, 1),
    so by Chernoff P(n * KL >= t) <= exp(-t) * (e * t / (cells - 1)) ** (cells - 1) for t > cells - 1.
    No large-n approximation, unlike the chi-square's. The bound falls in t past cells - 1; bisect
    for where it equals alpha.
    """
    k = cells - 1
    lo, hi = float(k), float(k) + 10 * (k + 100)
    for _ in range(200):
        mid = (lo + hi) / 2
        log_bound = -mid + k * (1 + math.log(mid / k))
        lo, hi = (lo, mid) if log_bound <= math.log(alpha) else (mid, hi)
    return hi


def g_statistic(counts: Counter, law: dict[tuple[int, ...], float], n: int) -> tuple[float, int]:
    """(n * KL(empirical || law), cells): a cell per outcome expected MIN_EXPECTED times or more, one for the rest."""
    assert all(t in law for t in counts), "an outcome the exact law gives no mass (a token top-p cuts)"
    common = {t for t, p in law.items() if n * p >= MIN_EXPECTED}  # fixed by the law alone, before looking at counts
    expected = {t: law[t] for t in common}
    seen = {t: counts[t] for t in common}
    if len(common) < len(law):
        expected["other"] = 1.0 - sum(expected.values())
        seen["other"] = n - sum(seen.values())
    return sum(c * math.log(c / n / expected[t]) for t, c in seen.items() if c > 0), len(expected)


def sample_first_tokens(runner: ModelRunner, spec: str, n: int, monkeypatch, sampling=SAMPLING,
                        **kw) -> tuple[Counter, list[int]]:
    """(counts of the first L tokens, [drafts proposed, drafts accepted, steps that accepted all their drafts]).

    The n sequences run as one batch, each with its own generator: Sampling(seed=None) seeds each
    from runner.fresh_seed(), here made to count 1, 2, 3, ... so the run is reproducible.
    """
    seeds = itertools.count(1)
    monkeypatch.setattr(runner_module, "fresh_seed", lambda: next(seeds))
    verify, full = runner.verify, []

    def counting_verify(slots, drafts):
        results = verify(slots, drafts)
        full.append(sum(0 < len(d.tokens) == r.accepted for d, r in zip(drafts, results)))
        return results

    monkeypatch.setattr(runner, "verify", counting_verify)
    outs = generate(runner, [PROMPT] * n, L, spec, DEPTH, sampling, stop_at_eos=False, **kw)
    assert all(len(o.tokens) == L for o in outs)
    return Counter(tuple(o.tokens) for o in outs), [sum(o.proposed for o in outs), sum(o.accepted for o in outs),
                                                    sum(full)]


@pytest.fixture(scope="module")
def target() -> Transformer:
    return small_micro()


@pytest.fixture(scope="module")
def law(target) -> dict[tuple[int, ...], float]:
    return exact_law(target, PROMPT, L, SAMPLING)


def test_exact_law_is_spread_out_and_top_p_cuts_much_of_it(target, law):
    # a dozen or more outcomes, none near-certain, each expected dozens of times in N: no "other" cell needed
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-12)
    assert len(law) >= 12 and max(law.values()) < 0.2 and min(law.values()) * N > 50
    # without top-p those outcomes hold under half the mass: a side that skips it is far off
    untruncated = exact_law(target, PROMPT, L, Sampling(SAMPLING.temperature, 1.0))
    assert sum(untruncated[t] for t in law) < 0.5


def test_g_threshold_is_where_the_bound_equals_alpha():
    # 2 cells at 1e-6: 17.69 (the asymptotic chi-square(1) point / 2 is 11.9); 16 cells at 1e-7: 48.8 (31.2)
    assert g_threshold(2, 1e-6) == pytest.approx(17.688, abs=1e-3)
    assert g_threshold(16, 1e-7) == pytest.approx(48.82, abs=1e-2)
    for cells, alpha in [(2, 1e-6), (16, 1e-7), (40, 1e-7)]:
        t, k = g_threshold(cells, alpha), cells - 1
        assert math.exp(-t) * (math.e * t / k) ** k == pytest.approx(alpha, rel=1e-6)


def test_g_statistic_pools_rare_outcomes_and_is_zero_on_the_law_itself():
    # counts exactly n * law: 0; an outcome expected under MIN_EXPECTED times joins "other"; an impossible one fails
    law = {(0,): 0.5, (1,): 0.499, (2,): 0.001}
    assert g_statistic(Counter({(0,): 500, (1,): 499, (2,): 1}), law, 1000) == (pytest.approx(0.0, abs=1e-9), 3)
    g, cells = g_statistic(Counter({(0,): 600, (1,): 400}), law, 1000)
    assert cells == 3 and g == pytest.approx(600 * math.log(1.2) + 400 * math.log(0.4 / 0.499))
    with pytest.raises(AssertionError, match="no mass"):
        g_statistic(Counter({(3,): 1}), law, 1)


@pytest.mark.parametrize("seeded", [False, True], ids=["generator", "seed"])
@pytest.mark.parametrize("spec", ["off", "mtp", "draft", "prompt-lookup", "dflash", "eagle"])
def test_speculative_sampling_is_distributed_as_plain_sampling(target, law, spec, seeded, monkeypatch):
    # the first L tokens of N sequences follow the exact law, and the drafter's drafts were both kept and refused;
    # "generator": each sequence draws from its own torch generator (the rule of a request without a seed);
    # "seed": sequence i has seed i and picks every token by its position's noise (accept.position_noise)
    drafter = random_dflash(target) if spec == "dflash" else None
    small = small_micro(seed=1) if spec == "draft" else None  # another model of the same vocabulary drafts
    # an untrained EAGLE-3 head drafting over 3 of the 4 tokens: its q is 0 on the fourth, the verify's residual has it
    head = random_head(target.cfg, draft_vocab=3, std=WEIGHT_STD) if spec == "eagle" else None
    runner = ModelRunner(target, N, max_len=len(PROMPT) + L + 1, dflash=drafter, draft_model=small, eagle=head)
    sampling = [dataclasses.replace(SAMPLING, seed=i) for i in range(N)] if seeded else SAMPLING
    # DEPTH drafts at any batch width (the default rung drafts 1 past a width of 16)
    rung = DflashRung(DflashParams(tiers=(), wide_gamma=DEPTH, single_levels=(DEPTH,), up=())) if drafter else None
    counts, (proposed, accepted, full) = sample_first_tokens(runner, spec, N, monkeypatch, sampling, rung=rung)
    g, cells = g_statistic(counts, law, N)
    assert g < g_threshold(cells, ALPHA), (spec, g, cells)
    if spec == "off":
        assert proposed == 0
    else:  # the drafter proposed, its drafts were both kept and refused, and bonus tokens after a fully kept step count
        assert proposed >= 2 * N and 0.05 * proposed < accepted < 0.95 * proposed and full >= N // 100, \
            (proposed, accepted, full)
