"""The measured planner: a hand-computed choice, ties, the tokens/s bound, and its edge cases."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from met.speculative.spec_cost import (AcceptanceCalibration, CarryBin, Cell, CostTable, DrafterKey, PositionPrior,
                                       TableKey)
from met.speculative.spec_cost.plan import (PlanSeq, choose, drafting_saving, estimate_depths, plan_depth, probe_pays,
                                            unknown)

MTP = DrafterKey("mtp", "met-tiny-py-mtp", "abc")
METERED = TableKey("nvidia-h200x1", "met-tiny-py@abc", "nvml", {"decode": "d", "verify": "v", "draft_mtp": "m"})
NO_METER = TableKey("cpu-epyc-2t", "met-tiny-py@abc", "none", {"decode": "d", "verify": "v", "draft_mtp": "m"})
HIGH = math.log(0.98)


def calibration(*accepted_per_position: int, confident: int | None = None) -> AcceptanceCalibration:
    """Priors from 100 judged drafts per position with the given numbers accepted (and 100 HIGH drafts)."""
    rows = [(None, i < a, pos) for pos, a in enumerate(accepted_per_position, 1) for i in range(100)]
    if confident is not None:
        rows += [(HIGH, i < confident, 1) for i in range(100)]
    return AcceptanceCalibration.fit(rows, MTP)


def table(rows: list[tuple], key: TableKey = METERED, n: int = 1) -> CostTable:
    """One width's cells from (verify_s, draft_s, verify_j, draft_j) rows, k = 0, 1, ..."""
    if key.energy_source == "none":
        rows = [(v, d, None, None) for v, d, *_ in rows]
    return CostTable(key, [Cell(n, k, *row) for k, row in enumerate(rows)])


# The hand-computed example. One sequence, no confidences; priors 0.8 (position 1), 0.5 (2),
# and 0.5 past the last measured position. Verify joules are flat (a power-capped box), drafts cheap.
#
#  k  tokens                      wall s               J                tok/s               tok/J
#  0  1                           0.010                2.0              100.00              0.500
#  1  1 + 0.8 = 1.8               0.011 + 0.002=0.013  2.0 + 0.1 = 2.1  1.8/0.013 = 138.46  1.8/2.1 = 0.857
#  2  1.8 + 0.8*0.5 = 2.2         0.012 + 0.004=0.016  2.0 + 0.2 = 2.2  2.2/0.016 = 137.50  2.2/2.2 = 1.000
#  3  2.2 + 0.8*0.5*0.5 = 2.4     0.013 + 0.006=0.019  2.0 + 0.3 = 2.3  2.4/0.019 = 126.32  2.4/2.3 = 1.043
#
# slack 0:    only the fastest, k = 1.
# slack 0.05: floor 0.95 * 138.46 = 131.54; k = 1, 2 qualify; the most tok/J of them is k = 2.
# slack 0.08: floor 127.38; k = 3 (126.32) still does not qualify: k = 2.
# slack 0.09: floor 126.00; k = 3 qualifies and has the most tok/J: k = 3.
HAND = [(0.010, 0.0, 2.0, 0.0), (0.011, 0.002, 2.0, 0.1), (0.012, 0.004, 2.0, 0.2), (0.013, 0.006, 2.0, 0.3)]


@pytest.mark.parametrize(("slack", "k"), [(0.0, 1), (0.05, 2), (0.08, 2), (0.09, 3), (0.5, 3)])
def test_hand_computed_example(slack, k):
    decision = plan_depth(table(HAND), calibration(80, 50), unknown(1), slack)
    assert decision.k == k


def test_hand_computed_figures():
    estimates = estimate_depths(table(HAND), calibration(80, 50), unknown(1))
    assert [e.expected_tokens for e in estimates] == pytest.approx([1.0, 1.8, 2.2, 2.4])
    assert [e.wall_s for e in estimates] == pytest.approx([0.010, 0.013, 0.016, 0.019])
    assert [e.energy_j for e in estimates] == pytest.approx([2.0, 2.1, 2.2, 2.3])
    assert [e.tokens_per_s for e in estimates] == pytest.approx([100.0, 138.4615, 137.5, 126.3158], rel=1e-5)
    decision = plan_depth(table(HAND), calibration(80, 50), unknown(1), 0.05)
    assert decision.tokens_per_s == pytest.approx(137.5) and decision.tokens_per_j == pytest.approx(1.0)
    assert decision.why.startswith("k=2: the most tokens/J")


def test_tokens_sum_over_sequences_and_use_confidences_then_priors():
    # Two sequences at k = 2: the first has confidences for both drafts (HIGH -> 0.9 each):
    # 1 + 0.9 + 0.81 = 2.71; the second has one (0.9, then the position-2 prior 0.5):
    # 1 + 0.9 + 0.45 = 2.35. Together 5.06 tokens.
    cal = calibration(80, 50, confident=90)
    t = table(HAND, n=2)
    est = estimate_depths(t, cal, [PlanSeq([HIGH, HIGH]), PlanSeq([HIGH])])
    assert est[2].expected_tokens == pytest.approx(5.06)
    assert est[0].expected_tokens == 2.0  # k = 0 emits exactly one token per sequence


def test_the_first_plan_reads_each_sequences_previous_first_draft_through_the_carryover():
    # 100 chains with no step before (80 then 50 accepted), 100 after a HIGH first draft (60 then 30):
    # the priors pool both, 0.7 then 0.4; the carry-over after HIGH is 0.6 then 0.3. At k = 2, sequence 1
    # (previous HIGH): 1 + 0.6 + 0.18 = 1.78; sequence 2 (no previous step): 1 + 0.7 + 0.28 = 1.98.
    rows = [(None, i < a, pos) for pos, a in enumerate((80, 50), 1) for i in range(100)]
    rows += [(None, i < a, pos, HIGH) for pos, a in enumerate((60, 30), 1) for i in range(100)]
    cal = AcceptanceCalibration.fit(rows, MTP)
    assert cal.carryover[0].p_accept == (0.6, 0.3)
    est = estimate_depths(table(HAND, n=2), cal, [PlanSeq(previous=HIGH), PlanSeq()])
    assert est[2].expected_tokens == pytest.approx(1.78 + 1.98)


def test_a_first_plan_spreads_a_sequences_catch_up_over_the_steps_it_has_left():
    # HAND at width 1 with catchup_s 0.1 ms per row. A sequence 256 rows behind (a prompt) at k = 1:
    # 256 - 2 = 254 rows past what a drafting step leaves, 25.4 ms. With 180 tokens left at 1.8 tokens
    # per step, 100 steps share it: 13.254 ms, 135.8 tok/s, still k = 1. With 9 left, 5 steps: 18.08 ms,
    # 99.6 tok/s, and k = 2 (99.2) too fall below plain decode's 100: k = 0.
    t = CostTable(METERED, [Cell(1, k, *row, catchup_s=1e-4 if k else None) for k, row in enumerate(HAND)])
    cal = calibration(80, 50)
    far = estimate_depths(t, cal, [PlanSeq(behind=256, remaining=180)])
    assert far[1].wall_s == pytest.approx(0.013 + 254 * 1e-4 / 100)
    assert far[2].wall_s == pytest.approx(0.016 + 253 * 1e-4 / (180 / 2.2))
    near = estimate_depths(t, cal, [PlanSeq(behind=256, remaining=9)])
    assert near[1].wall_s == pytest.approx(0.013 + 254 * 1e-4 / 5)
    assert plan_depth(t, cal, [PlanSeq(behind=256, remaining=180)], 0.0).k == 1
    assert plan_depth(t, cal, [PlanSeq(behind=256, remaining=9)], 0.0).k == 0
    assert plan_depth(t, cal, [PlanSeq(behind=256, remaining=1)], 0.0).k == 0  # fewer than a step: all of it
    # caught up (a drafting step leaves at most k + 1 rows), mid-step, or behind/remaining unknown: not priced
    assert estimate_depths(t, cal, [PlanSeq(behind=2, remaining=2)])[1].wall_s == 0.013
    assert estimate_depths(t, cal, [PlanSeq(behind=256, remaining=2)], drafted=1)[1].wall_s == 0.013
    assert estimate_depths(t, cal, [PlanSeq(behind=256)])[1].wall_s == 0.013
    # a step where one sequence's tokens left are unknown prices no catch-up, as one where none are known
    two = CostTable(METERED, [Cell(2, k, *row, catchup_s=1e-4 if k else None) for k, row in enumerate(HAND)])
    assert estimate_depths(two, cal, [PlanSeq(behind=256, remaining=180), PlanSeq(behind=256)])[1].wall_s == 0.013


def test_a_catch_up_is_priced_by_the_pass_the_runner_runs_it_in():
    # A GPU-like table: a catch-up pass costs 0.1 ms per row whether it holds 1 sequence or 16. At width
    # 16, k = 1 (2 rows left by a drafting step), every request with 1 token left (the whole catch-up in
    # this step): one request 256 rows behind and 15 caught up runs alone in a pass of its own,
    # 254 extra rows at width 1's cost, 25.4 ms (a sixteenth of that, as a share of a full pass, before)
    t = CostTable(METERED, [Cell(n, k, *row, catchup_s=1e-4 if k else None) for n in (1, 16)
                            for k, row in enumerate(HAND)])
    cal = calibration(80, 50)
    def wall(behind):
        est = estimate_depths(t, cal, [PlanSeq(behind=b, remaining=1) for b in behind])
        return est[1].wall_s - (0.011 + 0.002)  # HAND[1]: verify + draft
    assert wall([256] + [2] * 15) == pytest.approx(254 * 1e-4)
    # all 16 a prompt behind share one pass, 254 rows past the 2: 25.4 ms for the step, not 16 times that
    assert wall([256] * 16) == pytest.approx(254 * 1e-4)
    # a short catch-up shares the caught-up requests' pass, which it pads: 8 rows past the 2, 0.8 ms
    assert wall([10] + [2] * 15) == pytest.approx(8 * 1e-4)
    # two long ones of one size class share a pass padded to the longer, paid in proportion (they share it)
    assert wall([200, 150] + [2] * 14) == pytest.approx(198 * 1e-4)


def test_drafting_saving_drafts_only_in_the_carry_over_bins_where_it_pays():
    # HAND at width 1: plain 10 ms a token. After an unsure first draft (200 judged) the next drafts are
    # accepted 0.05 of the time: no depth beats plain. After a sure one (300 judged), 0.9 at every
    # position: depth 3 costs 19 ms for 1 + 0.9 + 0.81 + 0.729 = 3.439 tokens, 5.525 ms a token, the
    # fastest: a saving of 0.6 x (1 - 0.5525) = 0.2685 of the step time
    t = CostTable(METERED, [Cell(1, k, *row, catchup_s=1e-4 if k else None) for k, row in enumerate(HAND)])
    cal = AcceptanceCalibration(MTP, 0.5, 2000, (), [PositionPrior(1, 0.5, 500)], {},
                                [CarryBin(-2.0, (0.05,) * 3, (200,) * 3), CarryBin(0.0, (0.9,) * 3, (300,) * 3)])
    assert drafting_saving(t, cal, 1, 3) == pytest.approx(0.6 * (1 - 0.019 / 3.439 / 0.010))
    # 100 tokens left save 0.2685 s; 254 rows behind at 0.1 ms cost 25.4 ms: pays; 3,000 rows, 0.3 s: not
    assert probe_pays(t, cal, 1, 3, [254], [100]) == [True]
    assert probe_pays(t, cal, 1, 3, [3000], [100]) == [False]
    assert probe_pays(t, cal, 1, 0, [254], [100]) == [False]  # nothing to draft with


def test_ties_go_to_the_smaller_depth():
    # k = 0: 1 token / 0.5 s = 2 tok/s, 1 token / 1 J. k = 1 at p = 0.5: 1.5 / 0.75 s = 2 tok/s and
    # 1.5 / 1.5 J = 1 tok/J: an exact tie (binary fractions) in both, so k = 0.
    rows = [(0.5, 0.0, 1.0, 0.0), (0.5, 0.25, 1.0, 0.5)]
    assert plan_depth(table(rows), calibration(50), unknown(1), 0.0).k == 0
    assert plan_depth(table(rows, NO_METER), calibration(50), unknown(1), 0.0).k == 0


def test_a_tie_between_deeper_depths_goes_to_the_smaller_one():
    # Position 1 always accepted, position 2 never: k = 1 and k = 2 both emit 2 tokens at the same
    # cost (4 tok/s, 4/3 tok/J), both beating k = 0 (2 tok/s, 1 tok/J): k = 1.
    rows = [(0.5, 0.0, 1.0, 0.0), (0.25, 0.25, 1.0, 0.5), (0.25, 0.25, 1.0, 0.5)]
    assert plan_depth(table(rows), calibration(100, 0), unknown(1), 0.0).k == 1
    assert plan_depth(table(rows, NO_METER), calibration(100, 0), unknown(1), 0.0).k == 1


def test_worthless_drafts_give_depth_zero():
    # Nothing is ever accepted: every depth emits 1 token at a higher cost than k = 0.
    assert plan_depth(table(HAND), calibration(0, 0), unknown(1), 0.5).k == 0
    assert plan_depth(table(HAND, NO_METER), calibration(0, 0), unknown(1), 0.5).k == 0


def test_flat_verify_and_high_acceptance_go_deep():
    # Verify costs the same at every depth, drafts are nearly free, 95% accepted: the deepest pays.
    rows = [(0.01, 1e-4 * k, 2.0, 1e-3 * k) for k in range(5)]
    assert plan_depth(table(rows), calibration(95, 95, 95, 95), unknown(1), 0.0).k == 4
    assert plan_depth(table(rows, NO_METER), calibration(95, 95, 95, 95), unknown(1), 0.0).k == 4


def test_without_energy_it_plans_by_tokens_per_second_and_says_so():
    # HAND without joules: k = 1 is the fastest, and slack buys nothing to spend.
    decision = plan_depth(table(HAND, NO_METER), calibration(80, 50), unknown(1), 0.5)
    assert (decision.k, decision.energy_j, decision.tokens_per_j) == (1, None, None)
    assert "tokens/s alone" in decision.why


def test_kmax_caps_the_depth_and_inputs_are_checked():
    assert plan_depth(table(HAND), calibration(80, 50), unknown(1), 0.5, kmax=2).k == 2
    assert plan_depth(table(HAND), calibration(80, 50), unknown(1), 0.5, kmax=99).k == 3  # the table's deepest
    with pytest.raises(ValueError, match="a step of no sequences"):
        plan_depth(table(HAND), calibration(80, 50), [], 0.0)
    with pytest.raises(ValueError, match="slack"):
        plan_depth(table(HAND), calibration(80, 50), unknown(1), 1.0)
    with pytest.raises(ValueError, match="negative"):
        plan_depth(table(HAND), calibration(80, 50), unknown(1), 0.0, kmax=-1)


LOW = math.log(0.1)


def test_planning_again_mid_step_counts_the_spent_drafts_and_their_confidences():
    # HAND without joules, after the step made its drafts; HIGH drafts are accepted 90%, LOW 10%.
    # Drafts made are paid for at every depth: after 2, k = 0..3 cost 14, 15, 16, 19 ms.
    cal = AcceptanceCalibration.fit(
        [(None, i < a, pos) for pos, a in ((1, 80), (2, 50), (3, 50)) for i in range(100)]
        + [(HIGH, i < 90, 1) for i in range(100)] + [(LOW, i < 10, 1) for i in range(100)], MTP)
    t = table(HAND, NO_METER)
    # Two LOW drafts: k = 1 gives 1.1 / 0.015 = 73.3 tok/s, the best (k = 0: 71.4, k = 2: 1.11 / 0.016 = 69.4):
    # keep one of the two. Before drafting, the same confidences would have meant no drafts (k = 0: 100 tok/s).
    assert [e.wall_s for e in estimate_depths(t, cal, [PlanSeq([LOW, LOW])], drafted=2)] == pytest.approx(
        [0.014, 0.015, 0.016, 0.019])
    assert plan_depth(t, cal, [PlanSeq([LOW, LOW])], 0.0, drafted=2).k == 1
    assert plan_depth(t, cal, [PlanSeq([LOW, LOW])], 0.0).k == 0
    # Two HIGH drafts: k = 2 gives 2.71 / 0.016 = 169.4 tok/s; a third at the prior 0.5 gives
    # (2.71 + 0.81 * 0.5) / 0.019 = 163.9: stop at 2.
    assert plan_depth(t, cal, [PlanSeq([HIGH, HIGH])], 0.0, drafted=2).k == 2
    # One LOW draft: k = 1 (1.1 / 0.013 = 84.6) beats drafting on (k = 2: 1.15 / 0.016 = 71.9) and k = 0 (83.3).
    assert plan_depth(t, cal, [PlanSeq([LOW])], 0.0, drafted=1).k == 1
    with pytest.raises(ValueError, match="drafted 4 is not in 0..=3"):
        plan_depth(t, cal, unknown(1), 0.0, drafted=4)


# -- properties over random tables and calibrations -------------------------------------------------

costs = st.floats(min_value=1e-4, max_value=10.0)


@st.composite
def situations(draw):
    """A random table (1-3 widths, depth 0..=4), calibration, width and its sequences (confidences, or none)."""
    key = draw(st.sampled_from([METERED, NO_METER]))
    widths = draw(st.lists(st.integers(1, 32), min_size=1, max_size=3, unique=True))
    kmax = draw(st.integers(0, 4))
    cells = [Cell(n, k, draw(costs), 0.0 if k == 0 else draw(costs),
                  *((None, None) if key is NO_METER else (draw(costs), 0.0 if k == 0 else draw(costs))))
             for n in widths for k in range(kmax + 1)]
    accepted = draw(st.lists(st.integers(0, 100), min_size=1, max_size=4))
    width = draw(st.integers(1, 40))
    conf = st.lists(st.floats(min_value=-10.0, max_value=0.0), max_size=5)
    confidences = draw(st.none() | st.lists(conf, min_size=width, max_size=width))
    seqs = unknown(width) if confidences is None else [PlanSeq(c) for c in confidences]
    return CostTable(key, cells), calibration(*accepted, confident=draw(st.integers(0, 100))), width, seqs


@given(situations(), st.floats(0.0, 0.99))
def test_choice_is_deterministic_and_within_the_tokens_per_second_bound(situation, slack):
    t, cal, width, seqs = situation
    decision = plan_depth(t, cal, seqs, slack)
    assert decision == plan_depth(t, cal, seqs, slack)
    estimates = estimate_depths(t, cal, seqs)
    best = max(e.tokens_per_s for e in estimates)
    assert decision.tokens_per_s >= (1 - slack) * best
    if t.has_energy:
        feasible = [e for e in estimates if e.tokens_per_s >= (1 - slack) * best]
        assert decision.tokens_per_j == max(e.tokens_per_j for e in feasible)
        assert decision.k == min(e.k for e in feasible if e.tokens_per_j == decision.tokens_per_j)
    else:
        assert decision.k == min(e.k for e in estimates if e.tokens_per_s == best)


@given(situations(), st.floats(0.0, 0.99), st.floats(0.0, 0.99))
def test_more_slack_never_costs_joules(situation, a, b):
    # Slack only widens the set of depths allowed, so tokens/J can only rise with it.
    t, cal, width, seqs = situation
    low, high = sorted((a, b))
    tight, loose = plan_depth(t, cal, seqs, low), plan_depth(t, cal, seqs, high)
    if t.has_energy:
        assert loose.tokens_per_j >= tight.tokens_per_j


@given(situations(), st.integers(0, 4))
def test_planning_mid_step_only_adds_the_spent_drafts_to_shallower_depths(situation, drafted):
    # depths at or past `drafted` cost what they cost before drafting; shallower ones carry the spent drafts
    t, cal, width, seqs = situation
    drafted = min(drafted, t.kmax)
    fresh = estimate_depths(t, cal, seqs)
    mid = estimate_depths(t, cal, seqs, drafted=drafted)
    spent = t.cell(width, drafted).draft_s
    for f, m in zip(fresh, mid):
        assert m.expected_tokens == f.expected_tokens
        if f.k >= drafted:
            assert m.wall_s == f.wall_s
        else:
            assert m.wall_s == pytest.approx(t.cell(width, f.k).verify_s + spent)


def test_choose_prefers_the_first_of_equals():
    # choose() is the rule alone: equal estimates at k = 0 and 1 resolve to 0.
    e = estimate_depths(table([(0.5, 0.0, 1.0, 0.0), (0.5, 0.25, 1.0, 0.5)]), calibration(50), unknown(1))
    assert choose(e, 0.0).k == 0
    assert choose(list(reversed(e)), 0.0).k == 0
