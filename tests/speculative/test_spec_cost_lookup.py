"""Prompt lookup's calibration: judging copies, the fit's bins, expected accepted drafts, the file, the planner's copies."""

import random

import pytest

from met.speculative.spec_cost import (AcceptanceCalibration, Cell, CostTable, DrafterKey, TableKey, TableParseError,
                                       VerifyCell)
from met.speculative.spec_cost.lookup import (FIT_DEPTH, FIT_EDGES, LOOKUP_MAX_NGRAM, SHARED_MIN_NGRAM, LookupBin,
                                              copy_accepted_by_depth, copy_lengths, fit_lookup, fit_shared_lookup,
                                              judged_copies, judged_shared_copies, shared_copy_params)
from met.speculative.spec_cost.plan import PlanSeq, _estimate_depths, choose, estimate_copies, plan_depth, unknown

DRAFTER = DrafterKey("mtp", "r", "d")


def test_copies_are_judged_as_a_verify_judges_them():
    # history [1, 2, 3] then generated [1, 2, 9, ...]: at the first position the suffix (3,) never recurred
    judged = list(judged_copies([1, 2, 3], [1, 2, 9, 1, 2, 3]))
    # position 1 (history 1 2 3 1): (1,) recurs, copy [2, 3, 1, ...] -> 2 accepted, 3 != 9 rejected
    assert judged[0] == (1, [True, False])
    # position 2 (history 1 2 3 1 2): (1, 2) recurs, copy [3, 1, 2] against [9, ...]: rejected at once
    assert judged[1] == (2, [False])
    # a copy judged only as far as the generation goes: the last position has one token left to judge
    assert all(len(j) <= 6 - i for i, (_, j) in enumerate(judged))


def _stream(period: list[int], repeats: int, tail: list[int]) -> tuple[list[int], list[int]]:
    return period, period * repeats + tail


def test_fit_merges_short_bins_and_stops_rates_where_outcomes_run_short():
    # a long periodic text: nearly every copy matches the longest suffix and holds; a few short matches
    bins = fit_lookup([_stream(list(range(20)), 30, [99])])
    assert bins and bins[0].min_match == 1 and bins[-1].max_match == LOOKUP_MAX_NGRAM
    for before, after in zip(bins, bins[1:]):
        assert after.min_match == before.max_match + 1
    top = bins[-1]
    assert top.p_accept[0] > 0.99 and all(n >= 100 for n in top.outcomes) and len(top.p_accept) <= FIT_DEPTH
    assert fit_lookup([([1, 2], [3, 4])]) == ()  # too few judged copies for one bin


def test_bins_that_leave_a_gap_or_repeat_a_length_are_refused():
    good = LookupBin(1, 3, (0.5,), (100,))
    AcceptanceCalibration(DRAFTER, 0.5, 100, lookup=[good, LookupBin(4, 12, (0.9,), (100,))])
    with pytest.raises(TableParseError, match=r"lookup\[1\]\.min_match"):
        AcceptanceCalibration(DRAFTER, 0.5, 100, lookup=[good, LookupBin(5, 12, (0.9,), (100,))])
    with pytest.raises(TableParseError, match="outcomes"):
        LookupBin(1, 3, (0.5, 0.5), (100, 99))
    with pytest.raises(TableParseError, match="max_match"):
        LookupBin(4, 3, (0.5,), (100,))


def test_expected_accepted_drafts_of_a_copy_stop_at_its_length_and_its_bins_rates():
    bins = (LookupBin(1, 2, (0.5, 0.5), (100, 100)), LookupBin(3, 12, (0.9,), (100,)))
    assert copy_accepted_by_depth(bins, 1, 3, 3) == [0.0, 0.5, 0.75, 0.75]  # the docstring's example
    assert copy_accepted_by_depth(bins, 2, 1, 3) == [0.0, 0.5, 0.5, 0.5]  # a copy of one draft
    assert copy_accepted_by_depth(bins, 7, 4, 2) == pytest.approx([0.0, 0.9, 0.9])  # the bin has one position
    assert AcceptanceCalibration(DRAFTER, 0.5, 100).copy_accepted_by_depth(5, 4, 2) == (0.0, 0.0, 0.0)


def test_a_calibration_answers_each_copy_as_the_bins_do_whatever_it_was_asked_before():
    bins = (LookupBin(1, 2, (0.5, 0.5), (100, 100)), LookupBin(3, 12, (0.9, 0.8), (100, 100)))
    cal = AcceptanceCalibration(DRAFTER, 0.5, 100, lookup=bins)
    asks = [(1, 3, 3), (2, 1, 3), (1, 3, 3), (7, 4, 2), (7, 1, 2), (7, 4, 4), (1, 3, 2)]
    for match, length, depth in asks:  # repeated and neighbouring keys: a kept answer must be the right one
        assert list(cal.copy_accepted_by_depth(match, length, depth)) == pytest.approx(
            copy_accepted_by_depth(bins, match, length, depth))


def test_a_calibration_with_lookup_bins_round_trips_and_one_without_still_parses():
    bins = [LookupBin(1, 2, (0.25, 0.5), (300, 120)), LookupBin(3, 12, (0.875,), (100,))]
    cal = AcceptanceCalibration(DRAFTER, 0.5, 100, lookup=bins)
    text = cal.to_toml()
    assert "[[lookup]]" in text and AcceptanceCalibration.parse(text) == cal
    bare = AcceptanceCalibration(DRAFTER, 0.5, 100)
    assert "lookup" not in bare.to_toml() and AcceptanceCalibration.parse(bare.to_toml()).lookup == ()
    with pytest.raises(TableParseError, match=r"lookup\[0\]"):
        AcceptanceCalibration.parse(text.replace("min_match = 1", "min_match = 2", 1))


def test_shared_copies_are_judged_only_where_the_earlier_streams_match_is_longer_than_the_own():
    first = ([1, 2], [3, 4, 5, 6, 7])  # nothing before it: no shared copies
    # the second's history 9 3 4 has no own match (4 never occurred before in it); the first stream
    # holds (3, 4), so its first position copies 5 6 7, judged against 5 6 8
    second = ([9, 3, 4], [5, 6, 8, 3, 4])
    judged = list(judged_shared_copies([first, second]))
    assert judged[0] == (2, [True, True, False])
    assert all(n >= SHARED_MIN_NGRAM for n, _ in judged)  # a 1-token match is too short for the shared cache
    # a history whose own match (3, 4) is as long as the first stream's is not judged against it: its own wins
    assert list(judged_shared_copies([first, ([3, 4, 5, 3, 4], [5])])) == []


def test_copy_indexes_hold_only_the_lengths_bins_start_at():
    assert copy_lengths(LOOKUP_MAX_NGRAM) == FIT_EDGES == (1, 2, 3, 4, 6, 8, 12)
    assert copy_lengths(4) == (1, 2, 3, 4) and copy_lengths(12, SHARED_MIN_NGRAM) == (2, 3, 4, 6, 8, 12)
    params = shared_copy_params()
    assert (params.min_ngram, params.max_ngram, params.ngrams) == (2, 12, (2, 3, 4, 6, 8, 12))
    # a bin spans whole starting bins, so a match found at a bin's start prices as the longer one would
    judged = list(judged_copies([1, 2, 3, 4, 5, 6, 7, 9], [1, 2, 3, 4, 5, 6, 7, 8]))
    assert [n for n, _ in judged][:7] == [1, 2, 3, 4, 4, 6, 6]  # 5 and 7 recur as their last 4 and 6


def test_shared_bins_start_at_the_shared_caches_shortest_match_and_cover_to_the_longest():
    text = list(range(30))
    streams = [([100 + i], text) for i in range(40)]  # each stream repeats the one before it: long shared matches
    bins = fit_shared_lookup(streams)
    assert bins and bins[0].min_match == SHARED_MIN_NGRAM and bins[-1].max_match == LOOKUP_MAX_NGRAM
    assert bins[-1].p_accept[0] > 0.99
    assert fit_shared_lookup([([1], [2, 3])]) == ()  # one stream: nothing shared before it
    with pytest.raises(TableParseError, match=r"shared_lookup\[0\]\.min_match"):
        AcceptanceCalibration(DRAFTER, 0.5, 100, shared_lookup=[LookupBin(1, 12, (0.5,), (100,))])


def test_a_calibration_prices_shared_copies_by_their_own_bins_and_round_trips():
    own = [LookupBin(1, 12, (0.5,), (100,))]
    shared = [LookupBin(2, 5, (0.25,), (100,)), LookupBin(6, 12, (0.9, 0.9), (100, 100))]
    cal = AcceptanceCalibration(DRAFTER, 0.5, 100, lookup=own, shared_lookup=shared)
    assert cal.copy_accepted_by_depth(8, 4, 2) == pytest.approx((0.0, 0.5, 0.5))
    assert cal.copy_accepted_by_depth(8, 4, 2, shared=True) == pytest.approx((0.0, 0.9, 1.71))
    assert cal.copy_accepted_by_depth(3, 4, 2, shared=True) == pytest.approx((0.0, 0.25, 0.25))
    text = cal.to_toml()
    assert "[[shared_lookup]]" in text and AcceptanceCalibration.parse(text) == cal
    assert "shared_lookup" not in AcceptanceCalibration(DRAFTER, 0.5, 100, lookup=own).to_toml()
    assert AcceptanceCalibration(DRAFTER, 0.5, 100, lookup=own).copy_accepted_by_depth(8, 4, 1, True) == (0.0, 0.0)


def _table(verify_ms: list[float], draft_ms: list[float]) -> CostTable:
    digests = {"decode": "a", "verify": "b", "draft_mtp": "c"}
    cells = [Cell(1, k, v / 1000, d / 1000) for k, (v, d) in enumerate(zip(verify_ms, draft_ms))]
    return CostTable(TableKey("box", "r@d", "none", digests), cells)


def test_the_planner_copies_when_a_copy_costs_its_verify_alone_and_expects_enough():
    # the module docstring's example: plain 2.5 ms; drafting 3 costs 4.2 + 2.4 ms for 2.7 tokens
    table = _table([2.5, 3.4, 3.8, 4.2], [0.0, 1.1, 1.7, 2.4])
    cal = AcceptanceCalibration(DRAFTER, 0.57, 1000, position_priors=[])
    drafting = plan_depth(table, cal, unknown(1), 0.0)
    strong = [PlanSeq(copy=[0.0, 0.8, 1.4, 1.9])]
    copying = plan_depth(table, cal, strong, 0.0)
    assert copying.source == "lookup" and copying.k == 3 and copying.tokens_per_s == pytest.approx(2.9 / 0.0042)
    assert copying.why.startswith("copy k=3")
    assert drafting.source == "mtp"
    # a weak copy loses to plain decode: verifying it costs more than it brings
    weak = plan_depth(table, cal, [PlanSeq(copy=[0.0, 0.1, 0.15, 0.2])], 0.0)
    assert weak.source == "mtp" and weak.k == drafting.k
    # planning again mid-step (drafts made): copies are not weighed, their drafts' cost is spent
    assert plan_depth(table, cal, strong, 0.0, drafted=1).source == "mtp"
    # a sequence without a copy decodes one token in a copying step
    [e] = [e for e in estimate_copies(table, [PlanSeq()]) if e.k == 1]
    assert e.expected_tokens == 1.0 and e.wall_s == pytest.approx(0.0034)


def _wide_table() -> CostTable:
    # widths 1 and 2: verify 10 + 1 ms per depth at width 2, a draft 2 ms per depth per sequence drafting,
    # a catch-up 100 us per row
    digests = {"decode": "a", "verify": "b", "draft_mtp": "c"}
    cells = [Cell(n, k, (0.010 + 0.001 * k) * (1 if n == 1 else 1.2), 0.002 * k * n, catchup_s=1e-4 if k else None)
             for n in (1, 2) for k in range(3)]
    return CostTable(TableKey("box", "r@d", "none", digests), cells)


def test_a_mixed_step_copies_where_a_copy_expects_more_and_drafts_for_the_rest():
    # sequence 0 holds a sure copy, sequence 1 none: copying alone wastes sequence 1's slot, drafting for both
    # pays sequence 0's draft for less than its copy; the mixed step copies 0 and drafts 1
    table = _wide_table()
    cal = AcceptanceCalibration(DRAFTER, 0.8, 1000)  # every draft accepted 0.8 of the time (no priors: overall)
    sure = [0.0, 0.99, 1.97]
    plan = plan_depth(table, cal, [PlanSeq(copy=sure), PlanSeq()], 0.0)
    assert plan.source == "mixed" and plan.copying == (True, False) and plan.k == 2
    assert plan.why.startswith("copy 1 + draft 1 at k=2")
    assert plan.wall_s == pytest.approx(table.cell(2, 2).verify_s + table.cell(1, 2).draft_s)
    assert plan.expected_tokens == pytest.approx(2 + 1.97 + 0.8 + 0.64)
    # the same sequence far behind (a prompt's catch-up, 30 ms) drafts in a mixed step only where the
    # tokens it has left repay it: not with 20 left, yes with 10,000
    near_end = plan_depth(table, cal, [PlanSeq(remaining=20, copy=sure), PlanSeq(behind=300, remaining=20)], 0.0)
    assert near_end.source != "mixed"
    far = plan_depth(table, cal, [PlanSeq(remaining=20, copy=sure), PlanSeq(behind=300, remaining=10_000)], 0.0)
    assert far.source == "mixed" and far.copying == (True, False) and far.wall_s > plan.wall_s
    # at width 1 there is nothing to mix
    assert plan_depth(table, cal, [PlanSeq(copy=sure)], 0.0).source == "lookup"


def test_a_copy_goes_past_the_drafters_depth_where_the_table_prices_the_verify():
    # the docstring's width-1 table, with verify-only cells to depth 6 (0.4 ms a position past 4.2)
    base = _table([2.5, 3.4, 3.8, 4.2], [0.0, 1.1, 1.7, 2.4])
    table = CostTable(base.key, base.cells, {}, [VerifyCell(1, k, (4.2 + 0.4 * (k - 3)) / 1000) for k in (4, 5, 6)])
    cal = AcceptanceCalibration(DRAFTER, 0.57, 1000, position_priors=[])
    long_match = [0.0, 0.95, 1.85, 2.7, 3.5, 4.25, 4.95]  # a copy that holds ~0.95 a position, 6 deep
    # the drafter's depth alone: copy 3 deep; priced past it, the copy goes to 6 (5.95 tokens / 5.4 ms)
    assert plan_depth(table, cal, [PlanSeq(copy=long_match)], 0.0).k == 3
    deep = plan_depth(table, cal, [PlanSeq(copy=long_match)], 0.0, copy_kmax=6)
    assert (deep.source, deep.k) == ("lookup", 6) and deep.tokens_per_s == pytest.approx(5.95 / 0.0054)
    # never deeper than the verify cells price, whatever copy_kmax asks
    assert [e.k for e in estimate_copies(table, [PlanSeq(copy=long_match + [5.6] * 4)], kmax=9)] == [1, 2, 3, 4, 5, 6]
    # a short match's copy stops where a further position no longer pays for its verify
    short = [0.0, 0.5, 0.75, 0.875, 0.94, 0.97, 0.98]
    assert plan_depth(table, cal, [PlanSeq(copy=short)], 0.0, copy_kmax=6).k < 6


def test_a_mixed_step_goes_no_deeper_than_the_copies_go():
    # copies 1 deep (a narrow copy pool) under a table drafting 2 deep: the mixed step is weighed at k = 1 only
    cal = AcceptanceCalibration(DRAFTER, 0.8, 1000)
    plan = plan_depth(_wide_table(), cal, [PlanSeq(copy=[0.0, 0.99]), PlanSeq()], 0.0, copy_kmax=1)
    assert plan.source == "mixed" and plan.k == 1 and plan.copying == (True, False)


@pytest.mark.parametrize("seed", range(30))
def test_the_fastest_copy_alone_is_what_a_plan_by_tokens_per_second_chooses_among_all_copies(seed):
    # a table without joules: plan_depth keeps only the fastest copy depth, and chooses as it would among them all
    rng = random.Random(seed)
    verify = sorted(rng.uniform(2.0, 6.0) for _ in range(4))
    base = _table(verify, [0.0] + sorted(rng.uniform(0.5, 3.0) for _ in range(3)))
    table = CostTable(base.key, base.cells, {},
                      [VerifyCell(1, k, verify[-1] / 1000 * rng.uniform(0.95, 1.3)) for k in range(4, 9)])
    cal = AcceptanceCalibration(DRAFTER, rng.uniform(0.3, 0.9), 1000, position_priors=[])
    running = 0.0
    copy = [0.0]
    for _ in range(8):
        running += rng.choice([0.0, 0.3, 0.9, 1.0])
        copy.append(running)
    seqs = [PlanSeq(copy=copy)]
    every = estimate_copies(table, seqs, 8)
    [fastest] = estimate_copies(table, seqs, 8, fastest_only=True)
    assert fastest == max(every, key=lambda e: e.tokens_per_s) and fastest.k == min(
        e.k for e in every if e.tokens_per_s == fastest.tokens_per_s)
    drafting = _estimate_depths(table, cal, seqs, None)[0]
    assert plan_depth(table, cal, seqs, 0.1, copy_kmax=8) == choose(drafting + every, 0.1)
