"""Pricing a catch-up: drafting_saving by hand, probe_pays against the passes the runner would run, and the first plan."""

import math
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from met.engine.policy_mtp import MtpPlannedPolicy
from met.engine.proposer import Proposer
from met.engine.requests import QueueSink, Request, SeqState
from met.engine.textstream import TextStream
from met.speculative.catchup import catchup_groups
from met.speculative.spec_capacity import DEFAULT_POOLS
from met.speculative.spec_cost import (AcceptanceCalibration, CarryBin, Cell, CostTable, DrafterKey, PositionPrior,
                                       SpecCostState, TableKey)
from met.speculative.spec_cost.plan import (PlanSeq, _catch_up_share, drafting_saving, estimate_depths, plan_depth,
                                            probe_pays)

KEY = TableKey("cpu-test-1t", "r@d", "none", {"decode": "a", "verify": "b", "draft_mtp": "c"})
MTP = DrafterKey("mtp", "r", "d")
HAND = [(0.010, 0.0), (0.011, 0.002), (0.012, 0.004), (0.013, 0.006)]  # (verify_s, draft_s) at k = 0..3
SURE = AcceptanceCalibration(MTP, 0.5, 2000, (), [PositionPrior(1, 0.5, 500)], {},
                             [CarryBin(-2.0, (0.05,) * 3, (200,) * 3), CarryBin(0.0, (0.9,) * 3, (300,) * 3)])


def flat(catchup_s: float | None, widths=(1, 16), rows=HAND) -> CostTable:
    """rows at every width; catch-up per row the same whatever the pass's width (a GPU's shape)."""
    return CostTable(KEY, [Cell(n, k, v, d, catchup_s=catchup_s if k else None)
                           for n in widths for k, (v, d) in enumerate(rows)])


def test_drafting_saving_by_hand():
    # verify 10, 10, 12 ms and draft 0, 2, 4 ms at k = 0, 1, 2. Carry-over: 100 first drafts after which the next
    # drafts are kept 0.2, 0.2 (k = 1: 12 ms / 1.2 tokens = 10 ms a token, plain's 10: saves 0), 300 after which
    # 0.8, 0.5 (k = 1: 12 / 1.8 = 6.667 ms, k = 2: 16 / 2.2 = 7.27: k = 1 saves 1/3). 0.75 x 1/3 = 0.25.
    t = flat(None, rows=[(0.010, 0.0), (0.010, 0.002), (0.012, 0.004)])
    cal = AcceptanceCalibration(MTP, 0.5, 2000, (), [PositionPrior(1, 0.5, 500)], {},
                                [CarryBin(-1.0, (0.2, 0.2), (100, 100)), CarryBin(0.0, (0.8, 0.5), (300, 300))])
    assert drafting_saving(t, cal, 1, 2) == pytest.approx(0.25)
    assert drafting_saving(t, cal, 16, 1) == pytest.approx(0.25)
    assert drafting_saving(t, cal, 1, 0) == 0.0
    # no carry-over: the priors, 0.5 everywhere: k = 1, 12 / 1.5 = 8 ms a token, saves 0.2
    bare = AcceptanceCalibration(MTP, 0.5, 2000, (), [PositionPrior(1, 0.5, 500)], {}, [])
    assert drafting_saving(t, bare, 1, 2) == pytest.approx(0.2)
    # a kmax past the table's deepest depth is capped, as estimate_depths caps it (was: a ValueError)
    assert drafting_saving(t, cal, 1, 5) == pytest.approx(0.25)
    assert probe_pays(t, cal, 1, 5, [300], [100]) == [True]


def test_a_probe_pays_for_the_pass_the_runner_would_run_not_one_shared_with_sequences_that_do_not_draft():
    # catch-up 1 ms a row at any width, saving 0.2685 of a 10 ms step at width 2: 1.3425 ms a token left.
    # Two requests a 256-token prompt behind. Sharing a pass, 128 ms each; alone, 256 ms. The first has
    # 150 tokens left (201 ms saved), the second 1 (it cannot draft at all): the first is caught up alone, so it
    # does not pay (was: priced at half a shared pass, it was probed at a loss of 55 ms)
    t = flat(1e-3)
    assert drafting_saving(t, SURE, 2, 3) == pytest.approx(0.6 * (1 - 0.019 / 3.439 / 0.010))
    assert probe_pays(t, SURE, 2, 3, [256, 256], [150, 1]) == [False, False]
    assert probe_pays(t, SURE, 2, 3, [256, 256], [150, 150]) == [True, True]  # they do share the pass
    # two of one size class share a pass padded to the longer, 256 ms, in proportion to their rows: 86 and 170 ms.
    # With 110 tokens left (148 ms saved each), the longer does not pay, and the shorter then pays 130 ms alone
    assert probe_pays(t, SURE, 2, 3, [130, 256], [110, 110]) == [True, False]


def test_a_sequence_that_cannot_draft_never_pays():
    # one token left: the clamp leaves it no draft, whatever the catch-up costs (none, here); 0 rows behind: the
    # runner drafts only after a verify (was: True for both, under a table without catch-up costs)
    t = flat(None)
    assert probe_pays(t, SURE, 3, 3, [300, 300, 0], [1, 0, 50]) == [False, False, False]
    assert probe_pays(t, SURE, 3, 3, [300, 300, 1], [2, 50, 50]) == [True, True, True]


def _seqs(max_tokens: list[int], confidences: list[float]) -> list[SeqState]:
    out = []
    for i, m in enumerate(max_tokens):
        req = Request(str(i), (1, 2, 3), m)
        out.append(SeqState(req, QueueSink(), i, Proposer("off", req.prompt), TextStream(),
                            confidences=list(confidences)))
    return out


def test_a_request_on_its_last_token_does_not_veto_drafting_for_the_step():
    # A request a prompt behind on its last token is not drafted for (its depth clamps to 0), so the runner never
    # catches it up: its catch-up (25.4 ms at 0.1 ms a row) is not this step's cost, and the other request drafts
    # (was: priced in full, it kept the whole step plain)
    t = flat(1e-4)
    state = SpecCostState(t, SURE, 0.1, KEY, MTP)
    behind = {0: 2, 1: 256}
    runner = SimpleNamespace(length=lambda slot: 10, max_len=512, mtp_behind=behind.get)
    plan = MtpPlannedPolicy(state, 3, DEFAULT_POOLS).plan(runner, _seqs([100, 1], [-0.01]))
    assert plan.mode == "mtp" and plan.depths == (3, 0)
    # with tokens to draft for, its catch-up is this step's cost: 254 rows, 25.4 ms over the 3 it has left
    plan = MtpPlannedPolicy(state, 3, DEFAULT_POOLS).plan(runner, _seqs([100, 3], [-0.01]))
    assert plan.mode == "plain"


def test_a_sequence_with_nothing_to_catch_up_is_in_no_pass():
    # a CPU's shape: a pass of 16 costs 16 times one of 1 per row. A sequence 10 rows behind next to one 0 rows
    # behind (which the runner cannot draft for) is caught up alone: 8 rows past the 2 at 0.1 ms
    t = CostTable(KEY, [Cell(n, k, v, d, catchup_s=n * 1e-4 if k else None) for n in (1, 16)
                        for k, (v, d) in enumerate(HAND)])
    est = estimate_depths(t, SURE, [PlanSeq(behind=10, remaining=1), PlanSeq(behind=0, remaining=100)])
    assert est[1].wall_s - (0.011 + 0.002) == pytest.approx(8 * 1e-4)


# -- properties --------------------------------------------------------------------------------------------------

@st.composite
def situations(draw):
    widths = draw(st.lists(st.integers(1, 16), min_size=1, max_size=3, unique=True))
    kmax = draw(st.integers(0, 4))
    catchup = draw(st.sampled_from(["none", "all", "some"]))
    cells = []
    for n in widths:
        for k in range(kmax + 1):
            c = None
            if k and (catchup == "all" or (catchup == "some" and draw(st.booleans()))):
                c = draw(st.floats(1e-6, 1e-2))
            cells.append(Cell(n, k, draw(st.floats(1e-4, 1.0)), 0.0 if k == 0 else draw(st.floats(1e-5, 1.0)),
                              catchup_s=c))
    p = st.floats(0.0, 1.0)
    carry = []
    if draw(st.booleans()):
        uppers = sorted(set(draw(st.lists(st.floats(-10.0, -0.01), max_size=2)))) + [0.0]
        for u in uppers:
            depth = draw(st.integers(1, 4))
            carry.append(CarryBin(u, tuple(draw(p) for _ in range(depth)), (100,) * depth))
    priors = [PositionPrior(i + 1, draw(p), 100) for i in range(draw(st.integers(0, 4)))]
    cal = AcceptanceCalibration(MTP, draw(p), 100_000, (), priors, {}, carry)
    width = draw(st.integers(1, 16))
    behind = draw(st.lists(st.integers(0, 600), min_size=width, max_size=width))
    remaining = draw(st.lists(st.integers(0, 400), min_size=width, max_size=width))
    return CostTable(KEY, cells), cal, width, behind, remaining, draw(st.integers(0, kmax + 2))


@given(situations())
def test_probe_pays_only_where_the_saving_beats_its_share_of_the_passes_run_for_those_that_pay(situation):
    t, cal, width, behind, remaining, kmax = situation
    saving = drafting_saving(t, cal, width, kmax)
    assert 0.0 <= saving < 1.0
    pays = probe_pays(t, cal, width, kmax, behind, remaining)
    assert len(pays) == width and all(isinstance(p, bool) for p in pays)
    if saving == 0.0 or min(kmax, t.kmax) == 0:
        assert not any(pays)
    payers = [i for i in range(width) if pays[i]]
    assert all(behind[i] > 0 and remaining[i] > 1 for i in payers)
    per_token = saving * t.cell(width, 0).verify_s / width
    for group in catchup_groups([behind[i] for i in payers]):  # the passes the runner runs for exactly these
        members = [payers[j] for j in group]
        pass_s = (t.cell(len(members), 1).catchup_s or 0.0) * max(behind[i] for i in members)
        for i in members:
            assert per_token * remaining[i] > pass_s * behind[i] / sum(behind[m] for m in members)


@given(situations(), st.integers(1, 4), st.integers(0, 400))
def test_a_catch_up_share_is_finite_never_negative_and_never_rises_with_the_tokens_left(situation, k, more):
    t, cal, width, behind, remaining, _ = situation
    if k > t.kmax:
        return
    passes = catchup_groups(behind)
    emitted = [1.0 + k / 2] * width
    share = _catch_up_share(t, k, passes, behind, remaining, emitted)
    later = _catch_up_share(t, k, passes, behind, [r + more for r in remaining], emitted)
    assert math.isfinite(share) and 0.0 <= later <= share * (1 + 1e-12)
    for e in estimate_depths(t, cal, [PlanSeq(behind=b, remaining=r) for b, r in zip(behind, remaining)]):
        assert math.isfinite(e.wall_s) and e.wall_s > 0 and math.isfinite(e.tokens_per_s)
    assert plan_depth(t, cal, [PlanSeq(behind=b, remaining=r) for b, r in zip(behind, remaining)], 0.5).k <= t.kmax
