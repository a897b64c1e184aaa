"""benchmarks/planner_steps.py: both reports with a row per policy, its steps grouped, the Scheduler left as found."""

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from met.bench.measured_boot import energy_source
import met.bench.policies as pol
from met.engine.identity import MODES, mtp_drafter_key, resolve_run, serve_table_key
from met.engine.policy_base import Outcome, StepPlan
from met.engine.scheduler import Scheduler
from met.speculative.spec_cost import LookupBin
from met.speculative.spec_cost.plan import DepthEstimate, PlanDecision

from test_policies import _calibration, _table

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def script(monkeypatch):
    """The script as a module (benchmarks/ on the path, as when it runs)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import planner_steps

    yield planner_steps
    sys.modules.pop("planner_steps", None)


def _rows(report: str, section: str) -> list[dict[str, str]]:
    """The markdown table under the heading that starts with `section`, as dicts by column."""
    block = report.split(f"## {section}")[1].split("\n## ")[0]
    table = [line for line in block.splitlines() if line.startswith("|")]
    head = [c.strip() for c in table[0].strip("|").split("|")]
    return [dict(zip(head, (c.strip() for c in line.strip("|").split("|")))) for line in table[2:]]


def test_main_reports_phases_per_policy_and_the_planners_steps(script, monkeypatch, micro_recipe, tmp_path, capsys):
    # the micro recipe, 2 prompts x 24 tokens at concurrency 2, a table and a calibration whose lookup bins
    # trust copies: rows for both policies and their difference. The seeded model's text recurs within 24
    # tokens, so the planner copies in some steps: only if the policy's wrapper passes its copies on to the
    # scheduler, which then indexes the histories
    monkeypatch.setattr(script, "embedded", lambda name: micro_recipe)
    monkeypatch.setattr(pol, "heldout_code", lambda count, offset, size: ["abcdabcdabcdabcd" * 2, "xyzxyzxyzxyzxyz"])
    settings = resolve_run(None, None)
    key = serve_table_key(micro_recipe.id, micro_recipe.config, settings, energy_source("auto", settings.device),
                          MODES)
    table = tmp_path / "t.toml"
    table.write_text(_table(key).to_toml())
    calibration = replace(_calibration(mtp_drafter_key(micro_recipe)),
                          lookup=[LookupBin(1, 12, (0.95,) * 4, (400, 300, 200, 100))])
    (tmp_path / "t.calibration.toml").write_text(calibration.to_toml())
    out = tmp_path / "report.md"
    status = script.main(["--prompts", "2", "--max-tokens", "24", "--repeats", "1", "--concurrency", "2",
                          "--table", str(table), "--out", str(out)])
    assert status == 0
    report = out.read_text()
    assert report in capsys.readouterr().out
    assert "`python3 benchmarks/planner_steps.py --prompts 2 --max-tokens 24" in report
    phases = {r["policy"]: r for r in _rows(report, "A:")}
    assert set(phases) == {"fixed-2", "measured", "measured - fixed-2"}
    for name in ("fixed-2", "measured"):
        ms = {c: float(v) for c, v in phases[name].items() if c not in ("policy", "tok/s")}
        assert ms["wall"] > ms["_run"] >= ms["draft"] > 0 and float(phases[name]["tok/s"]) > 0
    assert phases["fixed-2"]["replans"] == "0.0"  # only the planner's state is timed: a fixed depth never replans
    steps = _rows(report, "B:")
    assert steps[-1]["width"] == "all"
    groups = steps[:-1]
    sources = {g["source"] for g in groups}
    assert sources & {"lookup", "mixed"} and sources <= {"lookup", "mixed", "mtp", "plain"}
    assert all(1 <= int(g["width"]) <= 2 for g in groups)
    assert sum(int(g["steps"]) for g in groups) == int(steps[-1]["steps"])
    # every request's 23 tokens after prefill came from a step (a step may emit past max_tokens)
    assert sum(int(g["steps"]) * float(g["emitted tokens/step"]) for g in groups) >= 2 * 23 - 0.01
    assert Scheduler._run.__name__ == "_run" and not hasattr(Scheduler._run, "__wrapped__")


def test_main_refuses_policies_without_the_planner(script):
    # report B is about the planner's steps: without it there is nothing to report
    with pytest.raises(SystemExit) as exc:
        script.main(["--policies", "fixed-2"])
    assert exc.value.code == 2


def test_scheduler_phases_wraps_while_entered_and_restores(script):
    # inside, the phases are timers around the originals; outside, the originals themselves
    before = {name: Scheduler.__dict__[name] for name in script.PHASES}
    with script.SchedulerPhases():
        assert all(Scheduler.__dict__[name] is not f and Scheduler.__dict__[name].__wrapped__ is f
                   for name, f in before.items())
    assert {name: Scheduler.__dict__[name] for name in script.PHASES} == before


def _plan(source: str, k: int, expected: float, depths: tuple[int, ...]) -> StepPlan:
    estimate = DepthEstimate(k, expected, 0.01, None, expected / 0.01, None, source)
    return StepPlan("mtp", k, depths, "", PlanDecision(k, expected, 0.01, None, expected / 0.01, None, estimate, 0.1,
                                                       source))


def test_steps_group_by_width_source_and_first_plans_k(script):
    # two copies at width 1, k 3; a probe (k 0, drafted); a plain step; a fixed depth's plan has no decision
    steps = [script.planned_step(_plan("lookup", 3, 2.5, (3,)), [Outcome(3, 2, 3)], 0.001),
             script.planned_step(_plan("lookup", 3, 3.5, (2,)), [Outcome(2, 2, 3)], 0.003),
             script.planned_step(_plan("mtp", 0, 2.0, (2, 2)), [Outcome(2, 1, 2), Outcome(2, 0, 1)], 0.004),
             script.planned_step(_plan("mtp", 0, 2.0, (0, 0)), [Outcome(0, 0, 1), Outcome(0, 0, 1)], 0.002)]
    assert script.planned_step(StepPlan("mtp", 2, (2,), "fixed k=2"), [Outcome(2, 1, 2)], 0.001) is None
    groups = script.groups(steps)
    assert groups == [script.Group(1, "lookup", 3, 2, 3.0, 3.0, 2.5, pytest.approx(0.002)),
                      script.Group(2, "mtp", 0, 1, 2.0, 3.0, 2.0, 0.004),
                      script.Group(2, "plain", 0, 1, 2.0, 2.0, 0.0, 0.002)]
    lines = script.expectation_lines(groups)
    assert lines[2] == "| 1 | lookup | 3 | 2 | 3.00 | 3.00 | 1.000 | 2.50 | 2.000 |"
    assert lines[-1] == "| all | | | 4 | 2.50 | 2.75 | 1.100 | | |"  # 11 emitted over 10 expected, 4 steps


def test_phase_lines_pair_the_planner_with_each_other_policy_by_repeat(script):
    # the difference row is the median of per-repeat differences, not the difference of medians
    def run(wall: float) -> dict[str, float]:
        return {c: wall for c in script.COLUMNS}

    runs = {"fixed-2": [run(1.0), run(2.0), run(9.0)], "measured": [run(1.5), run(2.1), run(3.0)]}
    lines = script.phase_lines(runs, {"fixed-2": [10.0, 10.0, 10.0], "measured": [11.0, 9.0, 12.0]})
    assert lines[-1].startswith("| measured - fixed-2 | +100.0 |")  # differences +500, +100, -6000 ms
    assert lines[-1].endswith("| x1.100 |")
    assert lines[3].startswith("| measured | 2100.0 |")
