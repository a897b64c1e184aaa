"""`met bench policies`: rows for every policy and concurrency, identical greedy outputs, a corrupting policy fails."""

import json
import random
import re

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import met.bench.policies as pol
import met.bench.policies_cli as policies_cli
import met.bench.table_files as table_files
from met.bench.policies_identity import mismatches
from met.bench.policies_report import checks, markdown, median_interval, paired_ratio, price, summarise
from met.cli import app
from met.engine.identity import MODES, RunSettings, mtp_drafter_key, serve_table_key
from met.engine.policy_base import PlainPolicy
from met.exit_codes import EX_CANTCREAT, EX_CONFIG, EX_DATAERR, EX_OK, EX_SOFTWARE
from met.speculative.spec_capacity import DEFAULT_POOLS
from met.speculative.spec_cost import (AcceptanceCalibration, Cell, CostTable, PositionPrior, SpecCostState,
                                       TableKey, VerifyCell)

BOX = "test-box"
CONCURRENCIES = (1, 4, 16)




def _prompts(n: int, seed: int = 0) -> tuple[tuple[int, ...], ...]:
    rng = random.Random(seed)
    return tuple(tuple(rng.randrange(97, 105) for _ in range(rng.randrange(4, 30))) for _ in range(n))


def _table(key: TableKey, joules: bool = False) -> CostTable:
    """Verify cost grows with width and depth; the MTP draft costs a little per draft."""
    return CostTable(key, [Cell(n, k, 0.01 + 0.001 * n + 0.002 * k * n, 0.001 * k,
                                (1.0 + k) if joules else None, (0.1 * k) if joules else None)
                           for n in (1, 4, 16) for k in range(5)])


def _calibration(drafter) -> AcceptanceCalibration:
    return AcceptanceCalibration(drafter, 0.6, 800, (), [PositionPrior(i, 0.8 - 0.1 * i, 200) for i in (1, 2, 3, 4)])


def _state(key: TableKey, drafter, joules: bool = False) -> SpecCostState:
    return SpecCostState(_table(key, joules), _calibration(drafter), 0.1, key, drafter)


class Corrupting(PlainPolicy):
    """A broken policy: it bumps every sequence's pending token, so the text drifts from plain greedy's."""

    name = "broken"

    def draft(self, runner, seqs, plan):
        for s in seqs:
            runner.seqs[s.slot].pending = (runner.seqs[s.slot].pending + 1) % 256
        return super().draft(runner, seqs, plan)


@pytest.fixture(scope="module")
def runs(model):
    # every policy at concurrency 1, 4 and 16 over 6 prompts, 2 repeats
    key = TableKey(BOX, "micro@t", "none", {m: "0" * 16 for m in MODES})
    drafter = mtp_drafter_key(type("R", (), {"name": "micro", "digest": "t"})())
    factories = pol.policy_factories(pol.POLICIES, model.cfg.mtp_depth, DEFAULT_POOLS, _state(key, drafter), {})
    workload = pol.Workload(_prompts(6), 12, CONCURRENCIES, 2)
    return pol.run_all(model, "micro@t", factories, workload)


def test_every_policy_and_concurrency_has_a_row(runs):
    # 8 policies x 3 concurrencies, each over both repeats, with positive tokens/s
    rows = summarise(runs, None)
    assert {(r.policy, r.concurrency) for r in rows} == {(p, c) for p in pol.POLICIES for c in CONCURRENCIES}
    assert all(r.repeats == 2 and r.tokens_per_s > 0 and r.step_tokens_per_s > r.tokens_per_s * 0.5
               and r.joules_per_token is None for r in rows)
    assert [r.policy for r in rows[:8]] == list(pol.POLICIES)  # interleaved order kept


def test_tokens_in_steps_are_those_clients_got(runs):
    # every request's tokens but its first (prefill's) came from steps, so the steps' count is their sum
    for r in runs:
        assert r.step_tokens == sum(len(o.tokens) - 1 for o in r.outputs if o.tokens)


def test_step_tokens_are_what_clients_got_less_the_prefills_first_tokens(runs):
    # the scheduler's count (SpecStats.step_streamed): never a token past EOS or max_tokens, and every request's
    # first token comes from its prefill, not from a step
    for r in runs:
        assert r.tokens - len(r.outputs) <= r.step_tokens <= r.tokens, (r.policy, r.concurrency, r.repeat)


def test_runs_interleave_policies_the_order_reversed_every_other_repeat(runs):
    # A B C at each concurrency in repeat 0, C B A in repeat 1: a steady drift favours no policy
    for repeat, order in ((0, list(pol.POLICIES)), (1, list(reversed(pol.POLICIES)))):
        done = [(r.concurrency, r.policy) for r in runs if r.repeat == repeat]
        assert done == [(c, name) for c in CONCURRENCIES for name in order]


def test_greedy_outputs_are_identical_across_policies_and_concurrencies(runs):
    # the engine's guarantee: no run differs from the first, by tokens or by text
    assert mismatches(runs) == []
    assert all(len(r.outputs) == 6 and all(o.tokens for o in r.outputs) for r in runs)


def test_drafting_policies_draft_and_off_does_not(runs):
    # off verifies nothing; fixed-4 at width 1 verifies up to 4 drafts per step; positions never exceed 4
    rows = {(r.policy, r.concurrency): r for r in summarise(runs, None)}
    assert rows["off", 1].mean_accepted_length is None and rows["off", 1].acceptance_at == ()
    assert len(rows["fixed-4", 1].acceptance_at) == 4 and len(rows["fixed-1", 1].acceptance_at) == 1
    fixed4 = next(r for r in runs if r.policy == "fixed-4" and r.concurrency == 1)
    assert max(k for _, _, k, _, _ in fixed4.steps) == 4


def test_rows_share_each_policys_steps_by_mode(runs):
    # off decodes plainly every step; fixed depths draft MTP (a request's last token leaves a plain step);
    # prompt lookup copies or, without a match, decodes plainly; every row's shares add up to 1
    rows = {(r.policy, r.concurrency): r for r in summarise(runs, None)}
    assert rows["off", 1].modes == (("plain", 1.0),)
    assert dict(rows["fixed-3", 1].modes)["mtp"] > 0.5 and set(dict(rows["prompt-lookup", 4].modes)) <= {"plain", "lookup"}
    assert all(abs(sum(share for _, share in r.modes) - 1.0) < 1e-9 for r in rows.values())
    report = markdown({"machine": {"box_class": "b"}, "table": None, "energy_source": None, "calibration": None, "when": "now",
                       "pools": "p", "workload": {"prompts": 6, "prompt_source": "s", "max_tokens": 12,
                                                  "concurrencies": [1], "repeats": 2}, "command": "c",
                       "recipe": "r", "box_class": "b"}, list(rows.values()), [], [])
    assert "| plain 100% |" in report


def test_the_measured_planner_copies_through_the_bench_as_through_the_serve(model):
    # a calibration whose prompt-lookup bins trust copies: the bench's measured policy copies where histories
    # recur (the scheduler must index them for it, as the serve's does), and its outputs stay plain greedy's
    from dataclasses import replace

    from met.speculative.spec_cost import LookupBin

    key = TableKey(BOX, "micro@t", "none", {m: "0" * 16 for m in MODES})
    drafter = mtp_drafter_key(type("R", (), {"name": "micro", "digest": "t"})())
    state = _state(key, drafter)
    cal = replace(state.calibration, lookup=[LookupBin(1, 12, (0.95,) * 4, (400, 300, 200, 100))])
    state = SpecCostState(state.table, cal, 0.1, key, drafter)
    factories = pol.policy_factories(["off", "measured"], model.cfg.mtp_depth, DEFAULT_POOLS, state, {})
    copied = pol.run_all(model, "micro@t", factories, pol.Workload(_prompts(4), 16, (1, 4), 1))
    rows = {(r.policy, r.concurrency): r for r in summarise(copied, None)}
    assert all(dict(rows["measured", c].modes).get("lookup", 0) > 0 for c in (1, 4))
    assert mismatches(copied) == []


def test_pools_clamp_fixed_depths_at_wide_widths(model):
    # 10 requests: fixed-4 verifies four drafts at width 4, one at width 10 (the default pools' wide tier)
    factories = pol.policy_factories(["fixed-4"], model.cfg.mtp_depth, DEFAULT_POOLS, None, {})
    narrow, wide = pol.run_all(model, "micro@t", factories, pol.Workload(_prompts(10, seed=2), 6, (4, 16), 1))
    assert max(k for _, _, k, _, _ in narrow.steps) == 4
    deepest = {k for _, w, k, _, _ in wide.steps if w >= 9}
    assert 1 in deepest and deepest <= {0, 1}  # 0: a request's last token leaves no room for a draft


def test_a_corrupting_policy_is_named(model):
    # off first (the reference), then a policy that changes the text: each mismatch names it and where
    factories = {"off": PlainPolicy, "broken": Corrupting}
    runs = pol.run_all(model, "micro@t", factories, pol.Workload(_prompts(3), 8, (1, 2), 1))
    found = mismatches(runs)
    assert found and {m.policy for m in found} == {"broken"}
    assert re.fullmatch(r"policy broken at concurrency 1 \(repeat 1\), prompt \d: token \d+ is \d+ where off at "
                        r"concurrency 1 gave \d+ \(8 vs 8 tokens\)", found[0].message())


class FailsOne(PlainPolicy):
    """A broken policy: the engine fails the steps of request 1 at concurrency 1 (it raises in the draft)."""

    name = "fails"

    def draft(self, runner, seqs, plan):
        if runner.cache.max_batch == 1 and any(s.request.id == "1" for s in seqs):
            raise RuntimeError("boom")
        return super().draft(runner, seqs, plan)


def test_a_failed_request_in_the_reference_run_is_named_alone(model):
    # the first run fails prompt 1: only that failure is named; the runs that finished it agree with each other
    # (was: every other run of prompt 1 named as differing from the failed one's partial output)
    workload = pol.Workload(_prompts(3), 8, (1, 2), 1)
    runs = pol.run_all(model, "micro@t", {"fails": FailsOne, "off": PlainPolicy}, workload)
    found = mismatches(runs)
    assert [(m.policy, m.concurrency, m.prompt, m.failed) for m in found] == [("fails", 1, 1, True)]
    assert found[0].message().endswith("prompt 1: the request failed: the engine failed this step: boom")


def test_energy_is_priced_from_the_table_when_it_has_joules(runs):
    # a table with joules prices every step: verify joules, plus MTP draft joules on MTP steps
    key = TableKey(BOX, "micro@t", "nvml", {m: "0" * 16 for m in MODES})
    table = _table(key, joules=True)
    off = next(r for r in runs if r.policy == "off" and r.concurrency == 1)
    steps = sum(n for *_, n in off.steps)
    assert price(off, table) == pytest.approx(steps * 1.0)  # plain steps: verify_j of k = 0 only
    assert all(r.joules_per_token is not None for r in summarise(runs, table))


def test_checks_report_the_figures_they_decide_on(runs):
    # three checks, each PASS or FAIL (never silently skipped) with its ratios
    results = checks(summarise(runs, None), runs)
    assert len(results) == 3 and all(c.passed is not None for c in results)
    assert "c=16" in results[0].figures and "needs >= 1.8x" in results[2].figures
    partial = checks([r for r in summarise(runs, None) if r.policy != "measured"], runs)
    assert all(c.passed is None for c in partial)


def test_paired_ratios_cancel_a_drift_that_moves_every_policy_alike():
    # the box runs twice as fast in repeat 2: a is 10% ahead of b within each repeat, whatever the medians say
    def run(policy, repeat, seconds):
        return pol.Run(policy, 1, repeat, 100, seconds, 0, 0, 0, 0, (), (), (), 100, seconds, ())

    runs = [run("a", 0, 1.0), run("b", 0, 1.1), run("a", 1, 0.5), run("b", 1, 0.55), run("a", 2, 2.0),
            run("b", 2, 2.2), run("c", 0, 1.0)]
    assert paired_ratio(runs, "a", "b", 1) == pytest.approx(1.1)
    assert paired_ratio(runs, "a", "c", 1) == pytest.approx(1.0)  # only the repeats both ran
    assert paired_ratio(runs, "a", "b", 4) is None
    failed = [run("a", 0, 1.0), pol.Run("b", 1, 0, 0, 1.0, 0, 0, 0, 0, (), (), (), 0, 1.0, ()),
              run("a", 1, 1.0), run("b", 1, 1.25)]
    assert paired_ratio(failed, "a", "b", 1) == pytest.approx(1.25)  # a repeat whose b run delivered nothing: none


def test_median_interval_takes_the_order_statistics_binomial_coverage_allows():
    # n = 8: [x(2), x(7)] covers 1 - 2 * 9/256 = 93%; x(3), x(6) would cover only 71%
    assert median_interval([8, 1, 7, 2, 6, 3, 5, 4]) == pytest.approx((2, 7, 1 - 18 / 256))
    assert median_interval([5, 4, 3, 2, 1]) == pytest.approx((1, 5, 1 - 2 / 32))  # n = 5: the extremes, 94%
    assert median_interval([1, 2, 3, 4]) is None  # the extremes of 4 cover 88% < 90%
    assert median_interval([3.0] * 16, level=0.5)[:2] == (3.0, 3.0)


def test_median_interval_covers_a_skewed_distributions_median_as_often_as_it_says():
    # lognormal ratios (median 1): over 4000 samples of 12, the 90%+ interval holds the median >= 90% of the time
    rng = np.random.default_rng(0)
    hits, coverages = 0, set()
    for _ in range(4000):
        low, high, coverage = median_interval(np.exp(rng.normal(0.0, 0.3, 12)).tolist())
        hits += low <= 1.0 <= high
        coverages.add(round(coverage, 4))
    assert coverages == {round(1 - 2 * (1 + 12 + 66) / 4096, 4)}  # j = 3: 96%
    assert hits / 4000 == pytest.approx(1 - 2 * 79 / 4096, abs=0.01)


# --- the command -------------------------------------------------------------------------------


@pytest.fixture
def cli_env(monkeypatch, tmp_path, micro_recipe):
    """The command on the micro recipe in float64, short prompts, and a matching hand-made table."""
    monkeypatch.setattr("met.model.recipes.embedded", lambda name: micro_recipe)  # read when the command runs
    texts = ["def f(x):\n    return x + 1\n", "import os\nprint(os.getcwd())\n", "class A:\n    pass\n",
             "for i in range(3):\n    print(i)\n"]
    monkeypatch.setattr(pol, "heldout_code", lambda count, offset, size: texts[:count])
    settings = RunSettings("float64", "cpu", torch.get_num_threads())
    key = serve_table_key(micro_recipe.id, micro_recipe.config, settings, "none", MODES, BOX)
    table = tmp_path / "t.toml"
    table.write_text(_table(key).to_toml())
    (tmp_path / "t.calibration.toml").write_text(_calibration(mtp_drafter_key(micro_recipe)).to_toml())
    return tmp_path, ["bench", "policies", "--quick", "--quiet", "--dtype", "float64", "--device", "cpu",
                      "--box-class", BOX, "--energy", "none", "--table", str(table), "--out-dir",
                      str(tmp_path / "out")]


def test_cli_quick_writes_json_markdown_and_png(cli_env):
    # exit 0; every policy x concurrency in the JSON; the command, machine and recipe in both reports
    tmp_path, args = cli_env
    result = CliRunner().invoke(app, args)
    assert result.exit_code == EX_OK, result.output
    doc = json.loads((tmp_path / "out" / "policies.json").read_text())
    assert {(r["policy"], r["concurrency"]) for r in doc["rows"]} == {(p, c) for p in pol.POLICIES
                                                                      for c in (1, 2, 4)}
    assert doc["outputs_identical"] and doc["meta"]["recipe"].startswith("micro-random@")
    assert doc["meta"]["command"].startswith("met bench policies --recipe")
    md = (tmp_path / "out" / "policies.md").read_text()
    assert "Command: `met bench policies" in md and "box_class `test-box`" in md and "Checks:" in md
    assert "bonus token NOT counted" in md
    if _has_matplotlib():
        assert (tmp_path / "out" / "policies.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_refuses_an_out_dir_it_cannot_write_before_running(cli_env, monkeypatch):
    # a file where the folder goes, or a folder where a result goes: 73 at once (it ran the whole benchmark first)
    tmp_path, args = cli_env
    monkeypatch.setattr(pol, "run_all", lambda *a, **k: pytest.fail("the benchmark ran"))
    (tmp_path / "afile").write_text("x")
    result = CliRunner().invoke(app, [*args, "--out-dir", str(tmp_path / "afile")])
    assert result.exit_code == EX_CANTCREAT and "nothing was run" in result.output
    (tmp_path / "d" / "policies.md").mkdir(parents=True)
    result = CliRunner().invoke(app, [*args, "--out-dir", str(tmp_path / "d")])
    assert result.exit_code == EX_CANTCREAT and "policies.md is a folder" in result.output


def test_cli_replaces_the_result_set_whole_or_not_at_all(cli_env, monkeypatch):
    # the markdown cannot be staged: the old JSON stays (a new JSON beside an old plot before); the report is shown
    import errno

    tmp_path, args = cli_env
    out = tmp_path / "out"
    out.mkdir()
    (out / "policies.json").write_text("old\n")
    real_stage = table_files.stage

    def full(path, text):
        if path.name == "policies.md":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_stage(path, text)

    monkeypatch.setattr(table_files, "stage", full)  # the command imports it when it writes
    result = CliRunner().invoke(app, args)
    assert result.exit_code == EX_CANTCREAT and "the report above was not saved" in result.output
    assert "| policy | concurrency |" in result.output  # the results, on the screen at least
    assert (out / "policies.json").read_text() == "old\n" and sorted(p.name for p in out.iterdir()) == ["policies.json"]


def test_cli_fails_with_70_naming_the_policy_whose_output_differs(cli_env, monkeypatch):
    # a corrupting policy injected into the factories: exit 70, the policy and the prompt named
    tmp_path, args = cli_env
    monkeypatch.setattr(pol, "policy_factories", lambda names, *a, **k: {"off": PlainPolicy, "broken": Corrupting})
    result = CliRunner().invoke(app, [*args, "--policies", "off,fixed-1", "--concurrency", "1"])
    assert result.exit_code == EX_SOFTWARE, result.output
    assert "greedy outputs differ" in result.output and "policy broken at concurrency 1" in result.output
    assert re.search(r"prompt \d: ", result.output)
    assert not json.loads((tmp_path / "out" / "policies.json").read_text())["outputs_identical"]
    assert "a verify rounds otherwise" not in result.output  # float64: no rounding to blame


def test_cli_differing_outputs_in_bfloat16_name_the_rounding(cli_env, micro_recipe, monkeypatch):
    # on an H200 in bf16 speculation changed greedy text (README, "On a GPU"): the error says what to run instead
    tmp_path, args = cli_env
    settings = RunSettings("bfloat16", "cpu", torch.get_num_threads())
    key = serve_table_key(micro_recipe.id, micro_recipe.config, settings, "none", MODES, BOX)
    (tmp_path / "t.toml").write_text(_table(key).to_toml())
    monkeypatch.setattr(pol, "policy_factories", lambda names, *a, **k: {"off": PlainPolicy, "broken": Corrupting})
    bf16 = [a if a != "float64" else "bfloat16" for a in args]
    result = CliRunner().invoke(app, [*bf16, "--policies", "off,fixed-1", "--concurrency", "1"])
    assert result.exit_code == EX_SOFTWARE, result.output
    assert "in bfloat16 a verify rounds otherwise than a one-token step" in result.output
    assert "warning: in bfloat16 a verify rounds" in result.output.split("| policy |")[0]  # said before the run
    assert "--dtype float32 (with a table measured in it) keeps greedy text identical" in result.output


class FailsAll(PlainPolicy):
    """A broken policy: every step it drafts for raises, so every request it runs fails (0 tokens/s)."""

    name = "fails"

    def draft(self, runner, seqs, plan):
        raise RuntimeError("boom")


def test_cli_a_policy_that_fails_every_request_exits_70_naming_it(cli_env, monkeypatch):
    # fixed-1 delivers no token: the report is written, the checks skip it, exit 70 says which requests failed
    # (was: a ZeroDivisionError in the paired ratios, exit 1 and nothing written)
    tmp_path, args = cli_env
    real = pol.policy_factories
    monkeypatch.setattr(pol, "policy_factories", lambda *a, **k: real(*a, **k) | {"fixed-1": FailsAll})
    result = CliRunner().invoke(app, [*args, "--policies", "off,fixed-1,fixed-2,measured"])
    assert result.exit_code == EX_SOFTWARE, result.output
    assert "error: 12 request(s) failed:" in result.output and "greedy outputs differ" not in result.output
    assert "policy fixed-1 at concurrency 1 (repeat 1), prompt 0: the request failed" in result.output
    doc = json.loads((tmp_path / "out" / "policies.json").read_text())
    assert all(m["failed"] and m["policy"] == "fixed-1" for m in doc["mismatches"])
    assert "of fixed-2" in doc["checks"][0]["figures"] and "fixed-1" not in doc["checks"][0]["figures"]


def test_cli_refuses_a_table_of_another_key_with_78(cli_env, micro_recipe):
    # measured under another box class: the serve's refusal, the serve's status
    tmp_path, args = cli_env
    args = [a if a != BOX else "other-box" for a in args]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == EX_CONFIG, result.output
    assert "box_class: table has 'test-box', this serve has 'other-box'" in result.output


def test_cli_refuses_an_invalid_table_with_65_naming_its_own_option(cli_env):
    # the remedy names this command's --table, not the serve's --spec-cost-table
    tmp_path, args = cli_env
    (tmp_path / "t.toml").write_bytes(b"\x9e not a table")
    result = CliRunner().invoke(app, args)
    assert result.exit_code == EX_DATAERR, result.output
    assert "not UTF-8 text" in result.output and "or pass --table PATH" in result.output


def test_cli_bad_options_exit_2(cli_env):
    # an unknown policy, a bad concurrency list, an unknown energy source: usage errors naming the option
    _, args = cli_env
    r = CliRunner().invoke(app, [*args, "--policies", "off,eagle"])
    assert r.exit_code == 2 and "eagle" in r.output and "--policies" in r.output
    for bad in ("1,x", "", "100000"):  # an empty list is not the default; a width past 256 would allocate its KV
        r = CliRunner().invoke(app, [*args, "--concurrency", bad])
        assert r.exit_code == 2 and "--concurrency" in r.output, bad
    r = CliRunner().invoke(app, [*args, "--dtype", "int8"])
    assert r.exit_code == 2 and "--dtype 'int8'" in r.output
    r = CliRunner().invoke(app, [*args, "--policies", "off", "--energy", "nvml"])  # no table, still asked for
    assert r.exit_code == 69 and "--energy nvml: NVML measures a CUDA device" in r.output  # (was exit 0)
    r = CliRunner().invoke(app, [*args, "--energy", "watts"])
    assert r.exit_code == 2 and "--energy" in r.output


@pytest.fixture
def shipped_drafter(micro_recipe):
    """Where the micro recipe's DFlash drafter ships (beside its weights), absent; removed again after the test."""
    from met.model.dflash import shipped_path

    path = shipped_path(micro_recipe)
    path.unlink(missing_ok=True)
    yield path
    path.unlink(missing_ok=True)


def test_cli_dflash_runs_the_recipes_block_drafter_when_named(cli_env, micro_recipe, shipped_drafter):
    # not in the default set; named, it runs the drafter beside the weights with the rung's gamma: a single
    # stream verifies drafts past position 4 (the MTP pools would clamp them to 4), outputs identical to off
    from met.model.dflash import DflashConfig, DflashDrafter, save_drafter

    tmp_path, args = cli_env
    assert "dflash" not in pol.POLICIES
    torch.manual_seed(0)
    save_drafter(DflashDrafter(DflashConfig.for_target(micro_recipe.config, block=8, ffn_dim=32)), shipped_drafter,
                 micro_recipe.id)
    result = CliRunner().invoke(app, [*args, "--policies", "off,dflash"])
    assert result.exit_code == EX_OK, result.output
    doc = json.loads((tmp_path / "out" / "policies.json").read_text())
    assert {(r["policy"], r["concurrency"]) for r in doc["rows"]} == {(p, c) for p in ("off", "dflash")
                                                                      for c in (1, 2, 4)}
    assert doc["outputs_identical"]
    single = [r for r in doc["runs"] if r["policy"] == "dflash" and r["concurrency"] == 1]
    assert single and all(len(r["proposed_at"]) > 4 and r["proposed_at"][4] > 0 for r in single)


def test_cli_dflash_without_a_drafter_exits_66_saying_how_to_train_one(cli_env, shipped_drafter):
    # the drafter is looked for beside the recipe's weights; none there: 66 before anything runs
    tmp_path, args = cli_env
    result = CliRunner().invoke(app, [*args, "--policies", "off,dflash"])
    assert result.exit_code == 66 and "met model train --drafter dflash" in result.output, result.output
    assert not (tmp_path / "out").exists()


def test_policy_factories_refuse_dflash_without_a_drafter():
    with pytest.raises(ValueError, match="DFlash drafter"):
        pol.policy_factories(["dflash"], 3, DEFAULT_POOLS, None, {})


def test_cli_help_lists_the_exit_statuses():
    # every status the command can end with is documented in --help
    result = CliRunner().invoke(app, ["bench", "policies", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    for status in ("0 results written", "2 bad option", "65 (EX_DATAERR)", "66 (EX_NOINPUT)", "69 (EX_UNAVAILABLE)",
                   "70 (EX_SOFTWARE)", "73 (EX_CANTCREAT)", "78 (EX_CONFIG)"):
        assert status in text


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def test_a_mixed_step_is_priced_at_the_width_that_drafted():
    # 4 sequences, one copies and three draft 2 deep: verify joules of cell(4, 2) (3 J) plus the draft joules
    # of cell(3, 2), as the scheduler prices it: 0.6 J, between the table's widths 1 and 4 (0.2 and 0.8 J)
    key = TableKey(BOX, "micro@t", "nvml", {m: "0" * 16 for m in MODES})
    table = CostTable(key, [Cell(n, k, 0.01, 0.001 * k, 1.0 + k, 0.1 * k * n) for n in (1, 4) for k in range(3)])
    run = pol.Run("measured", 4, 0, 8, 1.0, 0, 0, 0, 0, (), (), (("mtp", 4, 2, 3, 2), ("lookup", 4, 2, 0, 1)), 8,
                  1.0, ())
    assert price(run, table) == pytest.approx(2 * (3.0 + 0.6) + 3.0)  # the copies' step: its verify alone


def test_a_copy_past_the_drafters_depth_is_priced_at_the_tables_verify_cell():
    # a lookup step 5 deep at width 1: the verify cell's 7 J; 6 deep is past what the table prices: no figure
    key = TableKey(BOX, "micro@t", "nvml", {m: "0" * 16 for m in MODES})
    cells = [Cell(n, k, 0.01, 0.001 * k, 1.0 + k, 0.1 * k * n) for n in (1, 4) for k in range(3)]
    deeper = [VerifyCell(1, k, 0.02, 4.0 + k) for k in (3, 4, 5)]
    table = CostTable(key, cells, {}, deeper)
    steps = (("lookup", 1, 5, 0, 2), ("mtp", 1, 2, 1, 1))
    run = pol.Run("measured", 1, 0, 8, 1.0, 0, 0, 0, 0, (), (), steps, 8, 1.0, ())
    assert price(run, table) == pytest.approx(2 * 9.0 + (3.0 + 0.2))
    deep = pol.Run("measured", 1, 0, 8, 1.0, 0, 0, 0, 0, (), (), (("lookup", 1, 6, 0, 1),), 8, 1.0, ())
    assert price(deep, table) is None
    drafted_deep = pol.Run("measured", 1, 0, 8, 1.0, 0, 0, 0, 0, (), (), (("mtp", 1, 3, 1, 1),), 8, 1.0, ())
    assert price(drafted_deep, table) is None  # a drafted step past kmax has no draft cost to price


def test_cli_without_out_dir_writes_a_new_folder_of_its_own_not_the_kept_results(cli_env, monkeypatch):
    # the kept results under benchmarks/results/ were replaced by any run without --out-dir; now each run makes
    # met-results/policies-<UTC time>/ (the next name in the same second), and --out-dir still names a folder
    tmp_path, args = cli_env
    monkeypatch.chdir(tmp_path)
    kept = tmp_path / "benchmarks" / "results" / "policies.json"
    kept.parent.mkdir(parents=True)
    kept.write_text("{}")
    args = args[:args.index("--out-dir")]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == EX_OK, first.output
    second = CliRunner().invoke(app, args)
    assert second.exit_code == EX_OK, second.output
    assert kept.read_text() == "{}"
    folders = sorted((tmp_path / "met-results").iterdir())
    assert len(folders) == 2 and all(re.fullmatch(r"policies-\d{8}T\d{6}Z(-\d+)?", f.name) for f in folders)
    for folder in folders:
        doc = json.loads((folder / "policies.json").read_text())
        assert doc["meta"]["command"].endswith(f"--out-dir {folder.relative_to(tmp_path)}")


def _timed(policy: str, c: int, repeat: int, seconds: float) -> pol.Run:
    """A run of 100 tokens in `seconds`."""
    return pol.Run(policy, c, repeat, 100, seconds, 0, 0, 0, 0, (), (), (), 100, seconds, ())


def test_a_choice_is_checked_against_the_best_of_its_drafters_planners_at_each_concurrency():
    # c=1: MTP's planner is the best single one, c=4 the draft model's; the choice is 2% and 10% ahead of them
    speeds = {1: {"measured": 1.0, "draft-measured": 1.2, "mtp+draft-measured": 0.98},
              4: {"measured": 1.3, "draft-measured": 1.0, "mtp+draft-measured": 0.909}}
    runs = [_timed(p, c, k, s * (1 + k / 10)) for c, by in speeds.items() for p, s in by.items() for k in range(5)]
    check = checks(summarise(runs, None), runs)[-1]
    assert check.name.startswith("mtp+draft-measured >= 1.0x the best of measured, draft-measured")
    assert check.passed is True, check.figures
    assert "c=1: 1.020" in check.figures and "of measured" in check.figures and "c=4: 1.100" in check.figures
    slower = [_timed(r.policy, r.concurrency, r.repeat, r.seconds * (1.05 if r.policy.startswith("mtp+") and
                                                                     r.concurrency == 1 else 1.0)) for r in runs]
    assert checks(summarise(slower, None), slower)[-1].passed is False  # 0.971 at c=1, though 1.03 on average
    alone = [r for r in runs if r.policy != "draft-measured"]
    assert checks(summarise(alone, None), alone)[-1].passed is None  # no draft model planner to compare with
