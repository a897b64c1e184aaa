"""Crash safety of `met bench spec-cost`: runs SIGKILLed at random moments, in the writes too; two runs at once.

Each run is the real command in its own process (bench_runs.ForkServer: forked from a warm
interpreter, on the micro recipe). A kill lands at a random moment of the run, or at the moment the
watch of the table's folder sees the run create a temp file or rename one into place. After every
kill both files are whole: byte for byte the previous ones unless the watch saw the run rename a new
one into place, and `met tables check` (key included) accepts them. The next successful run leaves
no temp file behind, and a second run started while one holds the lock exits 75 at once.
"""

import os
import random
import signal
import statistics
import time

import pytest
from typer.testing import CliRunner

from bench_runs import FolderWatch, ForkServer
from met.bench.table_names import calibration_path
from met.bench.tables_cli import tables_app
from met.exit_codes import EX_OK, EX_TEMPFAIL
from met.speculative.spec_cost import AcceptanceCalibration, CostTable

FAST = ["--widths", "1,2", "--max-depth", "1", "--context-len", "16", "--repeats", "1", "--window", "0.002"]
KILL_BUDGET_S = 15.0  # kills keep coming until this is spent (and at least MIN_KILLS have landed)
MIN_KILLS, MAX_KILLS = 12, 60
if os.environ.get("MET_CRASH_KILLS"):  # a longer run: exactly this many kills, whatever they take
    MIN_KILLS = MAX_KILLS = int(os.environ["MET_CRASH_KILLS"])
# Where a kill lands: at a random moment of the whole run, or at an event the folder watch sees:
# the calibration's or the table's temp file created (then 0-2 ms later, mid-write), the
# calibration renamed into place (between the two writes), the table renamed into place.
MOMENTS = ("anytime", "calibration temp", "anytime", "table temp", "between writes", "anytime", "table renamed")
REQUIRED = ("calibration temp", "table temp", "between writes")  # moments a kill must have landed at


@pytest.fixture(scope="module")
def forks(micro_recipe):
    server = ForkServer(micro_recipe.weights, micro_recipe.digest)
    yield server
    server.close()


def check(path) -> int:
    """`met tables check PATH`, the key compared with this box and the micro recipe (use_micro)."""
    result = CliRunner().invoke(tables_app, ["check", str(path)])
    assert result.exit_code == EX_OK and "Traceback" not in result.output, result.output
    return result.exit_code


def argv(out, *extra: str) -> list[str]:
    return ["bench", "spec-cost", *FAST, "--quick", "--quiet", "--energy", "none", *extra, "--out", str(out)]


def _trigger(moment: str, table: str, cal: str):
    """The folder event a kill waits for (None: a random moment instead)."""
    return {"calibration temp": lambda e: e[0] == "created" and e[1].startswith(f".{cal}."),
            "table temp": lambda e: e[0] == "created" and e[1].startswith(f".{table}."),
            "between writes": lambda e: e == ("moved", cal),
            "table renamed": lambda e: e == ("moved", table)}.get(moment)


def test_runs_killed_at_random_moments_leave_whole_files(forks, use_micro, tmp_path):
    out = tmp_path / "t.toml"
    cal = calibration_path(out)
    watch = FolderWatch(tmp_path)
    durations = []
    for _ in range(2):  # the first table, and how long a whole run takes here
        t0 = time.monotonic()
        assert forks.wait(forks.start(argv(out), tmp_path / "err")) == EX_OK, (tmp_path / "err").read_text()
        durations.append(time.monotonic() - t0)
    rng = random.Random(11)
    landed: dict[str, int] = {}
    temps_left = 0
    started = time.monotonic()
    for attempt in range(3 * MAX_KILLS):
        kills = sum(landed.values())
        # a kill sent 0-2 ms after a temp appears can land after its rename: go on past the budget (up to
        # MAX_KILLS) until the writes are known to have been hit, each moment landed and a temp left behind
        hit = temps_left and all(landed.get(m) for m in REQUIRED)
        if kills >= MAX_KILLS or (kills >= MIN_KILLS and hit and time.monotonic() - started > KILL_BUDGET_S):
            break
        moment = MOMENTS[attempt % len(MOMENTS)]
        before = out.read_bytes(), cal.read_bytes()
        watch.drain()
        watch.seen = []
        t0 = time.monotonic()
        pid = forks.start(argv(out), tmp_path / "err")
        trigger = _trigger(moment, out.name, cal.name)
        if trigger is None:
            time.sleep(rng.uniform(0.0, 1.2 * statistics.median(durations)))
        else:
            assert watch.wait_for(trigger, time.monotonic() + 20 * max(durations)), f"no {moment} event"
            if moment.endswith("temp"):
                time.sleep(rng.uniform(0.0, 0.002))
        os.kill(pid, signal.SIGKILL)
        status = forks.wait(pid)
        if status == EX_OK:
            durations.append(time.monotonic() - t0)  # it finished before the kill: still a fine table
        else:
            assert status == -signal.SIGKILL, (tmp_path / "err").read_text()
        landed[moment] = landed.get(moment, 0) + (status != EX_OK)
        watch.drain()
        events = watch.seen  # everything the run did before it died
        for path, old in zip((out, cal), before):
            if ("moved", path.name) not in events:
                assert path.read_bytes() == old, f"{path.name} changed without a rename ({moment})"
        CostTable.parse(out.read_text())
        AcceptanceCalibration.parse(cal.read_text())
        check(out)
        check(cal)
        temps_left += any(p.name.endswith(".tmp") for p in tmp_path.iterdir())
    print(f"kills by moment: {landed}, {temps_left} left a temp file")
    assert sum(landed.values()) >= MIN_KILLS
    assert all(landed.get(m) for m in REQUIRED), landed
    assert temps_left, "no kill left a temp file behind: the writes were never hit"
    # a kill mid-write of the calibration, then a run that does not calibrate: it still clears every temp.
    # The write is short: a kill sent when the temp appears can land after its rename, so try a few times.
    for _ in range(5):
        pid = forks.start(argv(out), tmp_path / "err")
        assert watch.wait_for(_trigger("calibration temp", out.name, cal.name), time.monotonic() + 60)
        os.kill(pid, signal.SIGKILL)
        forks.wait(pid)
        watch.drain()
        if any(p.name.startswith(f".{cal.name}.") for p in tmp_path.iterdir()):
            break
    assert any(p.name.startswith(f".{cal.name}.") for p in tmp_path.iterdir()), "no kill landed mid-write"
    assert forks.wait(forks.start(argv(out, "--no-calibrate"), tmp_path / "err")) == EX_OK
    assert sorted(p.name for p in tmp_path.iterdir()) == ["err", "t.calibration.toml", "t.toml", "t.toml.lock"]
    watch.close()


def test_a_second_run_exits_75_at_once_while_the_first_writes(forks, use_micro, tmp_path):
    # A holds the lock (its pid is in the lock file) and is sweeping; B, started then, exits 75 before A
    # writes anything and without touching the table; then A writes its table
    out = tmp_path / "t.toml"
    lock = tmp_path / "t.toml.lock"
    out.write_text("the old table\n")
    watch = FolderWatch(tmp_path)
    slow = ["--repeats", "3", "--window", "0.05"]  # A sweeps for a few seconds
    a = forks.start(argv(out, *slow, "--no-calibrate", "--replace"), tmp_path / "a.err")  # over a file not a table
    deadline = time.monotonic() + 30
    while (not lock.exists() or lock.read_text().strip() != str(a)) and time.monotonic() < deadline:
        time.sleep(0.005)
    t0 = time.monotonic()
    b = forks.start(argv(out), tmp_path / "b.err")
    assert forks.wait(b) == EX_TEMPFAIL
    waited = time.monotonic() - t0
    assert ("moved", "t.toml") not in watch.drain() + watch.seen  # B was answered before A wrote
    assert out.read_text() == "the old table\n" and not calibration_path(out).exists()
    err = (tmp_path / "b.err").read_text()
    assert err == f"error: another met bench spec-cost run holds {lock} (pid {a}); the table was not touched, " \
                  "try again when it has finished\n"
    assert waited < 2.0, f"B took {waited:.2f} s to give up"
    assert forks.wait(a) == EX_OK, (tmp_path / "a.err").read_text()
    CostTable.parse(out.read_text())
    check(out)
    watch.close()


def test_two_runs_started_together_one_writes_one_exits_75(forks, use_micro, tmp_path):
    out = tmp_path / "t.toml"
    runs = [forks.start(argv(out, "--no-calibrate"), tmp_path / f"{i}.err") for i in range(2)]
    assert sorted(forks.wait(pid) for pid in runs) == [EX_OK, EX_TEMPFAIL]
    check(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0.err", "1.err", "t.toml", "t.toml.lock"]
