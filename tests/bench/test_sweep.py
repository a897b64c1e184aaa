"""The sweep (met.bench.sweep) and its StepFixture on the micro preset with random weights."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from met.bench.meters import EnergyReadError, Reading, WallMeter
from met.bench.step_fixture import StepFixture
from met.bench.sweep import SweepParams, Task, check_fits, measure, paired_seconds, tasks
from met.engine.runner import ModelRunner
from met.speculative.spec_cost import CostTable, TableKey

TINY = SweepParams(widths=(1, 2), max_depth=2, verify_depth=4, context_len=16, repeats=2, window_s=0.002,
                   warmup_s=0.0)


@pytest.fixture(scope="module")
def micro_model(micro_recipe):
    return micro_recipe.load()


class FakeEnergyMeter:
    """A meter with joules: 10 W of wall time; refuses the first `refusals` windows as NVML would."""

    source = "nvml"
    min_window_s = 0.0

    def __init__(self, refusals: int = 0) -> None:
        self.wall, self.refusals = WallMeter(), refusals

    def start(self) -> None:
        self.wall.start()

    def stop(self) -> Reading:
        seconds = self.wall.stop().seconds
        if self.refusals:
            self.refusals -= 1
            raise EnergyReadError("counter moved by 0 mJ")
        return Reading(seconds, 10.0 * seconds)

    def info(self) -> dict:
        return {}


def test_tasks_cover_every_cell_and_draft_only_above_zero():
    found = tasks(SweepParams(widths=(1, 4), max_depth=2, verify_depth=0))
    assert len(found) == 2 * (3 + 2)  # per width: verify at k=0..2, draft at k=1..2
    assert Task(4, 0, "verify") in found and Task(1, 0, "draft") not in found


def test_tasks_verify_copies_from_depth_1_beside_the_cells_without_drafting_them():
    found = tasks(SweepParams(widths=(1, 4), max_depth=2, verify_depth=5))
    # per width: the 5 tasks of depths 0..=2, then a copy at 1..=5 (COPY_POOLS: 16 at 1, 6 at 4)
    assert len(found) == 2 * (5 + 5)
    assert {t.k for t in found if t.step == "copy"} == {1, 2, 3, 4, 5}
    # at depth 2 the MTP verify and the copy are two tasks; past 2 only the copy
    assert Task(1, 2, "verify") in found and Task(1, 2, "copy") in found and Task(4, 5, "copy") in found
    assert Task(1, 3, "verify") not in found and Task(1, 6, "copy") not in found
    assert not [t for t in found if t.step == "draft" and t.k > 2]
    assert Task(1, 3, "copy").label == "n=1 k=3 copies" and Task(1, 3, "draft").label == "n=1 k=3 draft"


@pytest.mark.parametrize(("change", "depths"), [
    ({}, {1: range(1, 17), 2: range(1, 9), 4: range(1, 7), 8: range(1, 5), 16: range(1, 3)}),  # COPY_POOLS caps
    ({"verify_depth": 6}, {1: range(1, 7), 2: range(1, 7), 4: range(1, 7), 8: range(1, 5), 16: range(1, 3)}),
    ({"verify_depth": 3}, dict.fromkeys((1, 2, 4, 8, 16), range(1, 4)) | {16: range(1, 3)}),  # under max_depth 4
    ({"verify_depth": 0}, dict.fromkeys((1, 2, 4, 8, 16), range(0))),  # none
    ({"max_depth": 0}, dict.fromkeys((1, 2, 4, 8, 16), range(0))),  # no drafter: the planner copies nothing
    ({"max_depth": 1, "widths": (3, 12, 300)}, {3: range(1, 7), 12: range(1, 3), 300: range(0)}),
])
def test_copy_depths_run_from_1_as_deep_as_copies_go(change, depths):
    params = SweepParams(**change)
    assert {n: params.copy_depths(n) for n in params.widths} == depths
    assert params.deepest_copy == max((len(d) for d in depths.values()), default=0)
    deepest = max([params.max_depth, *(d[-1] for d in depths.values() if d)])
    assert params.deepest_verify == deepest
    assert params.cache_len == params.context_len + params.catchup_rows + deepest + 1


def test_quick_verifies_copies_at_1_to_3_at_both_widths():
    from met.bench.sweep import QUICK

    assert [QUICK.copy_depths(n) for n in QUICK.widths] == [range(1, 4), range(1, 4)]  # max_depth 2 below 3


@pytest.mark.parametrize(("change", "message"), [
    ({"widths": ()}, "widths"),  # no width
    ({"widths": (1, 0)}, "widths"),  # a zero width
    ({"widths": (2, 2)}, "repeat"),  # a width twice
    ({"max_depth": 65}, "max_depth"),
    ({"verify_depth": -1}, "verify_depth"),
    ({"verify_depth": 65}, "verify_depth"),
    ({"repeats": 0}, "repeats"),
    ({"window_s": 0.0}, "window_s"),
])
def test_params_refuse_bad_values(change, message):
    with pytest.raises(ValueError, match=message):
        SweepParams(**change)


def test_params_sort_widths():
    assert SweepParams(widths=(4, 1, 2)).widths == (1, 2, 4)


def test_check_fits_names_the_limit(micro_model):
    # micro's max_seq_len is 128: 124 + 3 catch-up rows (depth 2 + 1) + 2 + 1 = 130 tokens do not fit
    with pytest.raises(ValueError, match="130 tokens exceed the model's max_seq_len 128; lower --context-len"):
        check_fits(micro_model.cfg, SweepParams(context_len=124, max_depth=2, verify_depth=0))
    # the deepest verify-only cell counts: 108 + 3 + 16 (width 1's copies) + 1 = 128 fits, one more does not
    check_fits(micro_model.cfg, SweepParams(context_len=108, max_depth=2))
    with pytest.raises(ValueError, match=r"depth 16 \+ 1 = 129 tokens .* or --verify-depth"):
        check_fits(micro_model.cfg, SweepParams(context_len=109, max_depth=2))
    # a DFlash drafter's cells price its own steps: copies are refused, even under max_depth; none is fine
    with pytest.raises(ValueError, match="pass --verify-depth 0"):
        check_fits(micro_model.cfg, SweepParams(context_len=16, max_depth=2, verify_depth=1), block=4)
    check_fits(micro_model.cfg, SweepParams(context_len=16, max_depth=2, verify_depth=0), block=4)


def same_rows(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Whether two slot states' catch-up rows are equal (None: no rows)."""
    return a is None and b is None or a is not None and b is not None and torch.equal(a, b)


def test_fixture_restores_the_state_before_each_step(micro_model):
    # a verify and a draft step change lengths, pending tokens and catch-up rows; restore undoes all of it
    runner = ModelRunner(micro_model, 2, 32)
    fixture = StepFixture(runner, [[1, 2, 3, 4], [5, 6, 7, 8, 9]], catchup_rows=3)
    before = [fixture.state(s) for s in fixture.slots]
    assert [len(s.catchup_tok) for s in before] == [3, 3] and before[0].length == 4 + 3
    first = runner.verify(fixture.slots, fixture.drafts(2, 2))
    fixture.restore(2)
    again = runner.verify(fixture.slots, fixture.drafts(2, 2))
    fixture.restore(2)
    assert first == again  # the same step from the same state gives the same result
    fixture.draft_step(2, 2)
    fixture.restore(2)
    after = [fixture.state(s) for s in fixture.slots]
    assert after == before and all(same_rows(a.catchup_h, b.catchup_h) for a, b in zip(after, before))
    # a draft step given fewer catch-up rows starts from the last of them, the MTP block that much further on
    fixture.restore(2, rows=2)
    fewer = fixture.state(0)
    assert fewer.catchup_tok == before[0].catchup_tok[1:] and fewer.mtp_length == before[0].mtp_length + 1
    assert fewer.length == before[0].length and fewer.pending == before[0].pending


def test_fixture_restores_a_draft_models_cache_and_rows(micro_model):
    # the draft model caught up on the prompt and the first token, then has the plain steps' 3 rows to take; a
    # draft step and a verify change its cache and rows, restore puts both back, and the same drafts come again
    from dataclasses import replace

    from met.model.transformer import Transformer

    torch.manual_seed(1)
    small = Transformer(replace(micro_model.cfg, n_layers=1, mtp_depth=0))
    runner = ModelRunner(micro_model, 2, 32, track_mtp=False, draft_model=small)
    fixture = StepFixture(runner, [[1, 2, 3, 4], [5, 6, 7, 8, 9]], catchup_rows=3, drafter="draft")
    before = [fixture.state(s) for s in fixture.slots]
    assert [(s.draft_length, len(s.draft_behind)) for s in before] == [(4 + 1, 3), (5 + 1, 3)]
    drafts = fixture.drafts(2, 3)
    fixture.draft_step(2, 3, rows=2)
    runner.verify(fixture.slots, drafts)
    fixture.restore(2)
    after = [fixture.state(s) for s in fixture.slots]
    assert after == before and all(same_rows(a.catchup_h, b.catchup_h) for a, b in zip(after, before))
    fixture.restore(2)
    assert runner.draft_small(fixture.slots, [3, 3]) == drafts  # the same step from the same state
    fixture.restore(2, rows=2)  # two rows left to take: the draft model's cache one row further on
    assert runner.draft_model.cache.lengths[0] == before[0].draft_length + 1
    assert runner.draft_model.behind[0] == list(before[0].draft_behind[1:])


def test_check_fits_takes_a_draft_models_context_and_no_mtp_module(micro_model):
    # a draft model drafts without the target's MTP module; its own context must hold the sweep's too
    from dataclasses import replace

    params = SweepParams(context_len=100, max_depth=2, verify_depth=0)
    check_fits(replace(micro_model.cfg, mtp_depth=0), params, draft=micro_model.cfg)
    with pytest.raises(ValueError, match="exceed the draft model's max_seq_len 64"):
        check_fits(micro_model.cfg, params, draft=replace(micro_model.cfg, max_seq_len=64))


def test_fixture_copies_are_each_prompts_last_tokens_without_confidences(micro_model, monkeypatch):
    fixture = StepFixture(ModelRunner(micro_model, 2, 32), [[1, 2, 3, 4], [5, 6]])
    copies = fixture.copies(2, 3)
    assert [d.tokens for d in copies] == [[2, 3, 4], [5, 6, 5]]  # the second prompt is shorter: cycled
    assert all(d.confidences == [] for d in copies) and len(fixture.copies(1, 3)) == 1
    # verified as drafts are: one forward over the pending token and all 3 copies of both sequences
    shapes, hidden = [], micro_model.hidden

    def spy(tokens, ctx):  # tokens: [B, T]
        shapes.append(tuple(tokens.shape))
        return hidden(tokens, ctx)

    monkeypatch.setattr(micro_model, "hidden", spy)
    fixture.verify_step(2, copies)
    assert shapes == [(2, 3 + 1)]


def test_measure_writes_cells_that_make_a_valid_table(micro_model):
    labels = []
    result = measure(micro_model, WallMeter(), TINY, lambda done, total, label: labels.append((done, total, label)))
    assert [(c.n, c.k) for c in result.cells] == [(n, k) for n in (1, 2) for k in range(3)]
    assert all(c.verify_s > 0 and (c.draft_s > 0) == (c.k > 0) for c in result.cells)
    assert all(c.verify_j is None and c.verify_s_spread is not None for c in result.cells)
    # the verify alone of copies at 1..=4 at both widths: beside the cells at 1..=2, past them at 3..=4
    assert [(c.n, c.k) for c in result.verify_cells] == [(n, k) for n in (1, 2) for k in range(1, 5)]
    assert all(c.verify_s > 0 and c.verify_j is None and c.verify_s_spread is not None for c in result.verify_cells)
    assert "last k prompt tokens" in result.meta["verify_cells"]
    table = CostTable(TableKey("cpu-test-1t", "micro@0", "none", {"decode": "a", "verify": "b"}), result.cells,
                      result.meta, result.verify_cells)
    assert CostTable.parse(table.to_toml()) == table and table.verify_depth(1) == 4
    assert table.verify_cell(1, 2) in result.verify_cells  # a copy 2 deep is priced at its own verify cell
    total = len(tasks(TINY)) * (TINY.repeats + 1)
    assert labels[-1][:2] == (total, total)
    copies = [lab for _, _, lab in labels if lab.endswith(" copies")]
    assert len(copies) == 8 * (TINY.repeats + 1)
    assert {c.rsplit(" ", 2)[1] for c in copies} == {"k=1", "k=2", "k=3", "k=4"}
    # interleaved: each repeat visits every task once, in its own order
    repeats = [[lab.split(" ", 2)[2] for _, _, lab in labels if lab.startswith(f"repeat {r}/")] for r in (1, 2)]
    assert sorted(repeats[0]) == sorted(repeats[1]) and repeats[0] != repeats[1]
    for visits in repeats:  # a width's steps back to back: the widths change once per repeat
        widths = [lab.split(" ")[0] for lab in visits]
        assert sum(a != b for a, b in zip(widths, widths[1:])) == 1


def test_paired_seconds_worked_example():
    a, b = Task(1, 0, "verify"), Task(1, 1, "verify")
    figures = paired_seconds({a: [1.0, 2.0], b: [2.0, 4.0]})
    assert figures[a] == pytest.approx(1.5) and figures[b] == pytest.approx(3.0)
    # each width is paired within itself: another width's windows change none of these figures
    wide = paired_seconds({a: [1.0, 2.0], b: [2.0, 4.0], Task(4, 0, "verify"): [9.0, 1.0]})
    assert wide[a] == figures[a] and wide[b] == figures[b] and wide[Task(4, 0, "verify")] == pytest.approx(5.0)


windows = st.lists(st.floats(1e-4, 1.0), min_size=3, max_size=3)


@given(st.lists(windows, min_size=1, max_size=6), st.integers(0, 2), st.floats(0.2, 5.0))
def test_a_slowdown_shared_by_a_repeats_windows_does_not_change_how_tasks_compare(series, repeat, factor):
    # Plain per-task medians fail this: a repeat where every window ran 5x slower can move one task's
    # median and not another's. Paired with its repeat's mean, a shared factor cancels.
    tasks_ = [Task(1, k, "verify") for k in range(len(series))]
    before = paired_seconds(dict(zip(tasks_, series)))
    slowed = [[x * factor if r == repeat else x for r, x in enumerate(w)] for w in series]
    after = paired_seconds(dict(zip(tasks_, slowed)))
    for t in tasks_:
        assert math.isclose(after[t] / after[tasks_[0]], before[t] / before[tasks_[0]], rel_tol=1e-9)


def test_paired_seconds_refuses_ragged_windows():
    with pytest.raises(ValueError, match="same number of windows"):
        paired_seconds({Task(1, 0, "verify"): [1.0], Task(1, 1, "verify"): [1.0, 2.0]})


def test_measure_with_energy_records_joules_and_retries_a_refused_window(micro_model):
    params = SweepParams(widths=(1,), max_depth=1, verify_depth=2, context_len=8, repeats=1, window_s=0.002,
                         warmup_s=0.0)
    result = measure(micro_model, FakeEnergyMeter(refusals=1), params)
    assert all(c.verify_j and c.verify_j > 0 for c in result.cells)
    assert result.cells[1].draft_j > 0 and result.cells[0].draft_j == 0.0
    assert [(c.n, c.k) for c in result.verify_cells] == [(1, 1), (1, 2)]
    assert all(c.verify_j > 0 for c in result.verify_cells)
    with pytest.raises(EnergyReadError):
        measure(micro_model, FakeEnergyMeter(refusals=100), params)


def test_fixture_state_is_deterministic(micro_model):
    # two fixtures from the same prompts reach the same state (greedy), so repeats time the same step
    a = StepFixture(ModelRunner(micro_model, 1, 16), [[3, 1, 4, 1, 5]])
    b = StepFixture(ModelRunner(micro_model, 1, 16), [[3, 1, 4, 1, 5]])
    assert a.saved[0].pending == b.saved[0].pending


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_measure_on_cuda_in_bfloat16(micro_recipe):
    # the same sweep on the GPU: windows synchronize the device, the cells make a valid table
    from met.bench.meters import device_sync

    model = micro_recipe.load(torch.bfloat16, "cuda")
    result = measure(model, WallMeter(device_sync("cuda")), TINY)
    table = CostTable(TableKey("nvidia-test", "micro@0", "none", {"decode": "a"}), result.cells, result.meta)
    assert CostTable.parse(table.to_toml()) == table


def test_a_copy_task_verifies_copies_and_a_verify_task_the_drafters_drafts_at_the_same_depth(micro_model):
    from met.bench.sweep import _step

    fixture = StepFixture(ModelRunner(micro_model, 1, 32), [[1, 2, 3, 4, 5, 6]], catchup_rows=3)
    verified = []
    fixture.verify_step = lambda width, drafts: verified.append([d.tokens for d in drafts])
    _step(fixture, Task(1, 2, "copy"), "mtp")()
    _step(fixture, Task(1, 2, "verify"), "mtp")()
    # the copy: the prompt's last 2 tokens, no drafter pass; the verify: the MTP drafter's 2 drafts
    assert verified[0] == [[5, 6]] and verified[1] == [fixture.drafts(1, 2)[0].tokens]


def test_a_joint_sweep_times_each_drafters_drafts_and_the_plain_step_and_copies_once(micro_model):
    # the MTP module and a draft model in one window sweep: tasks per drafter at k >= 1 only; shared k = 0 and copies
    from dataclasses import replace as with_

    from met.bench.sweep import measure_joint, task_names
    from met.model.transformer import Transformer

    torch.manual_seed(5)
    small = Transformer(with_(micro_model.cfg, n_layers=1, mtp_depth=0)).eval()
    found = tasks(TINY, task_names(("mtp", "draft")))
    assert Task(1, 0, "verify") in found and Task(1, 0, "verify", "mtp") not in found
    assert {Task(1, 2, "draft", "mtp"), Task(1, 2, "draft", "draft"), Task(1, 2, "copy")} <= set(found)
    results = measure_joint(micro_model, WallMeter(), TINY, draft_model=small)
    assert list(results) == ["mtp", "draft"]
    mtp, draft = results["mtp"], results["draft"]
    assert mtp.verify_cells == draft.verify_cells and len(mtp.verify_cells) > 0
    assert [c for c in mtp.cells if c.k == 0] == [c for c in draft.cells if c.k == 0]
    assert all(c.draft_s > 0 for c in mtp.cells + draft.cells if c.k)
    assert mtp.meta["catchup_rows"].startswith("depth + 1") and draft.meta["catchup_rows"].startswith("2 before")
