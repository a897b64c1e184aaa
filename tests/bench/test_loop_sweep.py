"""The in-loop sweep (met.bench.loop_sweep): cells timed inside running decodes, only full steps counted."""

import pytest

from met.bench.loop_sweep import (SKIP_STEPS, catch_up_per_row, counted_steps, measure_in_loop, run_cell,
                                  run_figures)
from met.bench.policies import StepRecord
from met.bench.sweep import SweepParams
from met.engine.runner import ModelRunner
from met.speculative.spec_cost import CostTable, TableKey

from random_models import random_micro

PARAMS = SweepParams(widths=(1, 2), max_depth=2, verify_depth=3, context_len=16, repeats=2)


@pytest.fixture(scope="module")
def micro():
    return random_micro()


def prompts(count: int, length: int = 16) -> list[list[int]]:
    return [[(7 * i + j) % 200 + 1 for j in range(length)] for i in range(count)]


def test_every_cell_is_timed_and_makes_a_valid_table(micro):
    labels = []
    result = measure_in_loop(micro, "micro@t", prompts(2), PARAMS, lambda d, t, label: labels.append((d, t, label)))
    assert [(c.n, c.k) for c in result.cells] == [(n, k) for n in (1, 2) for k in range(3)]
    assert all(c.verify_s > 0 and (c.draft_s > 0) == (c.k > 0) for c in result.cells)
    assert all((c.catchup_s is not None) == (c.k > 0) for c in result.cells)  # measured for drafting cells
    assert result.meta["steps_counted_min"] > 0 and result.meta["method"].startswith("in-loop")
    # the verify of copies alone at 1..=3 at each width (verify_depth 3; max_depth 2 below it)
    assert [(c.n, c.k) for c in result.verify_cells] == [(n, k) for n in (1, 2) for k in (1, 2, 3)]
    assert all(c.verify_s > 0 and c.verify_s_spread is not None for c in result.verify_cells)
    assert "copies" in result.meta["verify_cells"]
    table = CostTable(TableKey("cpu-test-1t", "micro@t", "none", {"decode": "a", "verify": "b", "draft_mtp": "c"}),
                      result.cells, result.meta, result.verify_cells)
    assert CostTable.parse(table.to_toml()) == table
    assert labels[-1][:2] == (2 * 6 * 3, 2 * 6 * 3)  # per width 3 cells and 3 copies, a warm-up and 2 repeats each
    copies = [label.rsplit(" ", 3)[1:] for _, _, label in labels if label.endswith(" copies")]
    assert sorted(copies) == sorted([[f"n={n}", f"k={k}", "copies"] for n in (1, 2) for k in (1, 2, 3)] * 3)
    for repeat in (1, 2):  # a width's depths back to back: the width changes once per repeat
        widths = [label.split(" ")[2] for _, _, label in labels if label.startswith(f"repeat {repeat}/")]
        assert sum(a != b for a, b in zip(widths, widths[1:])) == 1


def test_a_copy_cell_and_the_mtp_cell_at_one_depth_are_timed_by_decodes_of_their_own(micro, monkeypatch):
    from dataclasses import replace

    from met.bench import policies

    runs, drafter_calls = [], [0]
    run_once, draft_mtp = policies.run_once, ModelRunner.draft_mtp

    def counted_draft(self, *args, **kwargs):
        drafter_calls[0] += 1
        return draft_mtp(self, *args, **kwargs)

    def spy(runner, policy, *args, **kwargs):  # (width, policy, depth, drafter passes) of each decode
        before = drafter_calls[0]
        result = run_once(runner, policy, *args, **kwargs)
        runs.append((runner.cache.max_batch, type(policy).__name__, getattr(policy, "depth", 0),
                     drafter_calls[0] - before))
        return result

    monkeypatch.setattr(ModelRunner, "draft_mtp", counted_draft)
    monkeypatch.setattr(policies, "run_once", spy)
    result = measure_in_loop(micro, "micro@t", prompts(2), replace(PARAMS, repeats=1))
    # at (n=1, k=2) the table holds both: the MTP cell and the verify of 2 copies
    cell = next(c for c in result.cells if (c.n, c.k) == (1, 2))
    copy = next(c for c in result.verify_cells if (c.n, c.k) == (1, 2))
    assert cell.draft_s > 0 and copy.verify_s > 0
    at = [(policy, passes) for n, policy, k, passes in runs if (n, k) == (1, 2)]
    # each a warm-up and one repeat: the cell's decodes draft with MTP, the copy's never call the drafter
    assert sorted(policy for policy, _ in at) == ["CopyFixedPolicy"] * 2 + ["MtpFixedPolicy"] * 2
    assert all(passes > 0 for policy, passes in at if policy == "MtpFixedPolicy")
    assert all(passes == 0 for policy, passes in at if policy == "CopyFixedPolicy")


def test_a_decode_at_depth_k_drafts_k_for_every_sequence(micro):
    run = run_cell(ModelRunner(micro, 2, 80), "micro@t", prompts(2), 2, tokens=24)
    assert run.steps and all(d > 0 and v > 0 for d, v in run.steps) and run.catchup_s is not None
    assert run_cell(ModelRunner(micro, 2, 80), "micro@t", prompts(2), 0, tokens=24).catchup_s is None


def test_a_copy_decode_verifies_k_copies_every_step_and_never_drafts(micro, monkeypatch):
    runner = ModelRunner(micro, 2, 80)

    def no_drafter(*args, **kwargs):
        raise AssertionError("a copy verify cell makes no draft")

    verified = []
    verify = runner.verify

    def spy(slots, drafts):
        verified.append([(len(d.tokens), d.confidences) for d in drafts])
        return verify(slots, drafts)

    monkeypatch.setattr(runner, "draft_mtp", no_drafter)
    monkeypatch.setattr(runner, "verify", spy)
    run = run_cell(runner, "micro@t", prompts(2), 5, tokens=24, copies=True)
    assert run.steps and all(v > 0 for _, v in run.steps) and run.catchup_s is None
    # every step verifies 5 copies per sequence, none with confidences, until the last tokens' clamp
    full = sum(step == [(5, [])] * 2 for step in verified)
    assert verified[0] == [(5, []), (5, [])] and full >= len(run.steps) + SKIP_STEPS
    assert all(k <= 5 and c == [] for step in verified for k, c in step)


def test_a_runs_figures_are_the_means_of_its_counted_steps_slow_steps_included():
    # (draft, rest of the tick) per step; one slow verify: the median would say 2 ms, the run paid 4 ms a step
    assert run_figures([(0.001, 0.002), (0.001, 0.002), (0.004, 0.008)]) == pytest.approx((0.002, 0.004))


def test_the_catch_up_is_the_first_drafts_excess_over_the_median_draft_per_prompt_row():
    # the first draft (after the prompt) took 6 ms, the counted ones a median of 2 ms: 4 ms over 16 rows
    steps = [StepRecord((1, 1), 0.006, 0.016, 0.0), StepRecord((1, 1), 0.003, 0.013, 0.02)]
    counted = [(0.002, 0.01), (0.001, 0.01), (0.003, 0.01)]
    assert catch_up_per_row(steps, counted, width=2, depth=1, rows=16) == pytest.approx(0.004 / 16)
    # a first draft cheaper than the median: no catch-up cost, not a negative one
    assert catch_up_per_row([StepRecord((1, 1), 0.001, 0.01, 0.0)], counted, 2, 1, 16) == 0.0
    # not measurable: plain decode, a first step narrower or shallower than the cell, nothing counted
    assert catch_up_per_row(steps, counted, 2, 0, 16) is None
    assert catch_up_per_row([StepRecord((1,), 0.006, 0.016, 0.0)], counted, 2, 1, 16) is None
    assert catch_up_per_row([StepRecord((0, 1), 0.006, 0.016, 0.0)], counted, 2, 1, 16) is None
    assert catch_up_per_row(steps, [], 2, 1, 16) is None


def test_only_full_steps_after_the_first_are_counted_each_to_the_next_tick():
    shapes = [(1, 1)] * SKIP_STEPS + [  # the prompt's catch-up steps
        (1, 1),
        (1,),  # a request ended: narrower than the cell
        (0, 1),  # one sequence short of room: fewer drafts
        (1, 1),
        (1, 1),  # the last: no next tick ends it
    ]
    # each step's draft takes 2 ms and the scheduler's step 10 ms; each tick 12 ms, the sixth 15 ms
    ticks = [0.012] * 5 + [0.015, 0.012]
    starts = [sum(ticks[:i]) for i in range(len(shapes))]
    steps = [StepRecord(shape, 0.002, 0.010, t) for shape, t in zip(shapes, starts)]
    got = counted_steps(steps, width=2, depth=1)
    assert [(round(d, 9), round(v, 9)) for d, v in got] == [(0.002, 0.010), (0.002, 0.013)]


def test_too_few_prompts_or_too_long_a_decode_is_refused(micro):
    with pytest.raises(ValueError, match="1 prompts for widths up to 2"):
        measure_in_loop(micro, "micro@t", prompts(1), PARAMS)
    with pytest.raises(ValueError, match="exceed the model's max_seq_len"):
        measure_in_loop(micro, "micro@t", prompts(2, micro.cfg.max_seq_len - 10), PARAMS)
