"""`met bench spec-cost` and `met tables check`'s key comparison through CliRunner, on the micro recipe."""

import json
import os
import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from met.bench import meters, spec_cost_cli
from met.bench.table_names import calibration_path
from met.bench.table_files import TableLock
from met.cli import app
from met.exit_codes import (EX_CANTCREAT, EX_CONFIG, EX_DATAERR, EX_INTERRUPTED, EX_NOINPUT, EX_OK, EX_TEMPFAIL,
                            EX_UNAVAILABLE)
from met.speculative.spec_cost import AcceptanceCalibration, CostTable

runner = CliRunner()
# Smaller than --quick: one repeat of tiny windows on short contexts, so each run takes about a second; copies
# verified at depths 1..=2, beside the drafts' depth 1 and past it.
FAST = ["--widths", "1,2", "--max-depth", "1", "--verify-depth", "2", "--context-len", "16", "--repeats", "1",
        "--window", "0.002"]


def met(*args: str):
    return runner.invoke(app, list(args))


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory, micro_recipe):
    """One `--quick` run (sweep and calibration) whose files several tests read."""
    import met.model.recipes as recipes

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(recipes, "embedded", lambda name: micro_recipe)
        out = tmp_path_factory.mktemp("tables") / "t.toml"
        result = met("bench", "spec-cost", "--quick", "--quiet", "--energy", "none", "--out", str(out))
    return result, out


def test_quick_writes_a_table_and_calibration_that_parse(quick_run, micro_recipe):
    result, out = quick_run
    assert result.exit_code == EX_OK, result.output
    assert result.stdout == ""  # --quiet
    table = CostTable.parse(out.read_text())
    assert table.widths == (1, 2) and table.kmax == 2 and table.key.energy_source == "none"
    assert table.key.recipe == micro_recipe.id and table.key.modes == ("decode", "draft_mtp", "verify")
    cal = AcceptanceCalibration.parse(calibration_path(out).read_text())
    assert (cal.drafter.kind, cal.drafter.name, cal.drafter.digest) == ("mtp", "micro-random", micro_recipe.digest)
    # no energy source: every cell was timed inside running decodes, not in windows of one step
    assert table.meta["method"].startswith("in-loop") and "window_s" not in table.meta
    # --quick's verify depth 3: the verify of copies alone at 1..=3 at each width (its max depth 2 below)
    assert [(c.n, c.k) for c in table.verify_cells] == [(n, k) for n in (1, 2) for k in (1, 2, 3)]
    assert "verify_cells" in table.meta and table.verify_depth(1) == 3
    # at depth 2 a copy is priced at its own verify cell, not at the MTP cell's verify
    copy = next(c for c in table.verify_cells if (c.n, c.k) == (2, 2))
    assert table.verify_cell(2, 2) == copy and table.cell(2, 2).draft_s > 0


def test_tables_check_accepts_the_table_on_this_box(quick_run, use_micro):
    _, out = quick_run
    result = met("tables", "check", str(out))
    assert result.exit_code == EX_OK, result.output
    result = met("tables", "check", str(calibration_path(out)))
    assert result.exit_code == EX_OK, result.output


def test_tables_check_lists_every_key_mismatch(quick_run, use_micro, tmp_path):
    # another box class and another dtype: two mismatches, each on its own line, exit 78
    _, out = quick_run
    result = met("tables", "check", "--box-class", "nvidia-h200x1", "--dtype", "float64", str(out))
    assert result.exit_code == EX_CONFIG
    assert "this box is 'nvidia-h200x1'" in result.stderr
    assert result.stderr.count("was measured under plan digest") == 3  # decode, verify and draft_mtp
    assert "Traceback" not in result.output
    assert met("tables", "check", "--no-key", "--box-class", "x", str(out)).exit_code == EX_OK


def test_tables_check_refuses_a_calibration_of_another_drafter(quick_run, use_micro, tmp_path):
    _, out = quick_run
    other = tmp_path / "cal.toml"
    other.write_text(calibration_path(out).read_text().replace(use_micro.digest, "0000feed"))
    result = met("tables", "check", str(other))
    assert result.exit_code == EX_CONFIG and "calibration fitted on drafter mtp 'micro-random' @ 0000feed" in result.stderr


def test_tables_check_without_the_recipe_says_66(quick_run, monkeypatch):
    import met.model.recipes as recipes

    def missing(name):
        raise recipes.RecipeError(f"no embedded recipe {name!r}")

    monkeypatch.setattr(recipes, "embedded", missing)
    result = met("tables", "check", str(quick_run[1]))
    assert result.exit_code == EX_NOINPUT and "--no-key" in result.stderr


def test_second_run_reports_each_cells_change(use_micro, tmp_path):
    out = tmp_path / "t.toml"
    assert met("bench", "spec-cost", *FAST, "--no-calibrate", "--out", str(out)).exit_code == EX_OK
    result = met("bench", "spec-cost", *FAST, "--no-calibrate", "--out", str(out))
    assert result.exit_code == EX_OK, result.output
    assert "n=2 k=1: verify " in result.stdout and "%)" in result.stdout
    for k in (1, 2):  # each copy verify cell against the old table's
        assert re.search(rf"n=2 k={k} copies: verify [0-9.]+ ms \([+-][0-9.]+%\)", result.stdout), result.stdout
    assert f"wrote {out} (4 cells, 4 copy verify cells," in result.stdout
    assert not calibration_path(out).exists()


def test_verify_depth_caps_the_copies_and_0_measures_none(use_micro, tmp_path):
    out = tmp_path / "t.toml"
    result = met("bench", "spec-cost", *FAST, "--verify-depth", "4", "--no-calibrate", "--out", str(out))
    assert result.exit_code == EX_OK, result.output
    assert "copies verified at depths 1..=4" in result.stderr  # the progress lines
    table = CostTable.parse(out.read_text())
    assert [(c.n, c.k) for c in table.verify_cells] == [(n, k) for n in (1, 2) for k in (1, 2, 3, 4)]
    # not above --max-depth 1: still the verify of 1 copy, beside the cell at depth 1
    result = met("bench", "spec-cost", *FAST, "--verify-depth", "1", "--no-calibrate", "--out", str(out))
    assert result.exit_code == EX_OK, result.output
    assert "copies verified at depths 1..=1" in result.stderr and "4 cells, 2 copy verify cells" in result.stdout
    assert [(c.n, c.k) for c in CostTable.parse(out.read_text()).verify_cells] == [(1, 1), (2, 1)]
    # 0: no verify cells, nothing said of them
    result = met("bench", "spec-cost", *FAST, "--verify-depth", "0", "--no-calibrate", "--out", str(out))
    assert result.exit_code == EX_OK, result.output
    table = CostTable.parse(out.read_text())
    assert table.verify_cells == () and "verify_cells" not in table.meta
    assert "copies verified" not in result.output and "copy verify" not in result.output


def test_lock_held_exits_75_and_leaves_the_table_untouched(use_micro, tmp_path):
    out = tmp_path / "t.toml"
    out.write_text("the old table\n")
    before = out.stat().st_mtime_ns
    with TableLock(out):
        result = met("bench", "spec-cost", *FAST, "--out", str(out))
    assert result.exit_code == EX_TEMPFAIL
    assert "another met bench spec-cost run holds" in result.stderr and "Traceback" not in result.output
    assert out.read_text() == "the old table\n" and out.stat().st_mtime_ns == before


def test_an_unwritable_table_exits_73_in_one_line(use_micro, tmp_path, monkeypatch):
    # --out a folder, under a file, or in a folder that cannot be made: refused before measuring, no traceback
    (tmp_path / "a-file").write_text("")
    for out, words in ((tmp_path, "is a directory"),
                       (tmp_path / "a-file" / "t.toml", f"under {tmp_path / 'a-file'}: it is a file, not a folder"),
                       (Path("/proc/met-no-such/t.toml"), "cannot create the lock file")):
        result = met("bench", "spec-cost", *FAST, "--out", str(out))
        assert result.exit_code == EX_CANTCREAT and words in result.stderr, result.output
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.output
    # the disk fills up at the write: 73, and the table there before is untouched
    import errno

    import met.bench.table_files as table_files

    out = tmp_path / "t.toml"
    assert met("bench", "spec-cost", *FAST, "--quiet", "--out", str(out)).exit_code == EX_OK
    cal = out.with_name("t.calibration.toml")
    before = out.read_bytes(), cal.read_bytes()
    real_stage = table_files.stage

    def full(path, text):  # the calibration is staged, then the disk is full for the table
        if path == out and text:  # (the write check before measuring stages an empty file: it still fits)
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_stage(path, text)

    monkeypatch.setattr(table_files, "stage", full)  # the command imports it when it writes
    result = met("bench", "spec-cost", *FAST, "--quiet", "--out", str(out))
    assert result.exit_code == EX_CANTCREAT and "Traceback" not in result.output
    assert result.stderr == (f"error: cannot write {out}: No space left on device; the table and calibration "
                             "there before are untouched\n")
    assert (out.read_bytes(), cal.read_bytes()) == before  # neither replaced (the calibration was, before)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "t.calibration.toml", "t.toml", "t.toml.lock"]


def test_a_write_that_would_fail_is_refused_before_measuring(use_micro, tmp_path):
    # --out names so long that the calibration's temp file, or the calibration itself, would pass the file
    # system's NAME_MAX: 73 in one line before the sweep (was: after the whole sweep, or a traceback)
    name_max = os.pathconf(tmp_path, "PC_NAME_MAX")
    for stem in (name_max - 25, name_max - 15):  # `.STEM.calibration.toml.XXXXXXXX.tmp`; `STEM.calibration.toml`
        out = tmp_path / f"{'t' * stem}.toml"
        result = met("bench", "spec-cost", *FAST, "--out", str(out))
        assert result.exit_code == EX_CANTCREAT and "File name too long; nothing was measured" in result.stderr
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.output, result.output
    assert all(p.name.endswith(".lock") for p in tmp_path.iterdir())  # no table, no temp file


RUN_ONCE = r"""
import sys
from pathlib import Path
import met.model.recipes as recipes
from met.cli import app
from met.model.config import ModelConfig
from met.model.recipes import Recipe
recipes.embedded = lambda name: Recipe("micro-random", ModelConfig.from_name("micro"), Path(sys.argv[1]),
                                       sys.argv[2], {})
app(sys.argv[3:], prog_name="met")
"""


def test_output_that_cannot_be_written_does_not_change_the_outcome(micro_recipe, tmp_path):
    # a cron log on a full disk (stdout and stderr to /dev/full): the table is still measured and written, exit 0
    # (was: exit 1 at the first progress line, nothing written); a held lock is still 75 (was 1)
    import subprocess
    import sys

    out = tmp_path / "t.toml"

    def run() -> int:
        with open("/dev/full", "w") as full:
            return subprocess.run([sys.executable, "-c", RUN_ONCE, str(micro_recipe.weights), micro_recipe.digest,
                                   "bench", "spec-cost", *FAST, "--energy", "none", "--out", str(out)],
                                  stdout=full, stderr=full, timeout=300).returncode

    assert run() == EX_OK
    assert CostTable.parse(out.read_text()) and AcceptanceCalibration.parse(calibration_path(out).read_text())
    with TableLock(out):
        assert run() == EX_TEMPFAIL


def test_what_is_at_out_decides_whether_it_may_be_replaced(use_micro, tmp_path):
    # someone's other file (73) or another box's table (78) is refused before measuring unless --replace;
    # a damaged table of ours is replaced, with a warning even under --quiet; a symlink's target is replaced
    notes = tmp_path / "notes.md"
    notes.write_text("# my notes\n")
    result = met("bench", "spec-cost", *FAST, "--quiet", "--out", str(notes))
    assert result.exit_code == EX_CANTCREAT and "not a met cost table" in result.stderr and "--replace" in result.stderr
    assert notes.read_text() == "# my notes\n" and not notes.with_name("notes.md.calibration.toml").exists()
    other = tmp_path / "other.toml"
    assert met("bench", "spec-cost", *FAST, "--no-calibrate", "--quiet", "--box-class", "nvidia-h200x1",
               "--out", str(other)).exit_code == EX_OK
    kept = other.read_bytes()
    result = met("bench", "spec-cost", *FAST, "--no-calibrate", "--quiet", "--out", str(other))
    assert result.exit_code == EX_CONFIG and "holds the table of box_class 'nvidia-h200x1'" in result.stderr
    assert other.read_bytes() == kept
    assert met("bench", "spec-cost", *FAST, "--no-calibrate", "--quiet", "--replace", "--out",
               str(other)).exit_code == EX_OK
    assert CostTable.parse(other.read_text()).key.box_class != "nvidia-h200x1"
    damaged = tmp_path / "damaged.toml"
    damaged.write_text(other.read_text().replace("schema = 1", "schema = 99"))
    result = met("bench", "spec-cost", *FAST, "--no-calibrate", "--quiet", "--out", str(damaged))
    assert result.exit_code == EX_OK and result.stderr.startswith(f"warning: {damaged} is not a valid table")
    beside = tmp_path / "beside.toml"  # the calibration's path holds someone's file: refused too
    beside.with_name("beside.calibration.toml").write_text("my notes\n")
    result = met("bench", "spec-cost", *FAST, "--quiet", "--out", str(beside))
    assert result.exit_code == EX_CANTCREAT and "is not a met calibration" in result.stderr
    assert beside.with_name("beside.calibration.toml").read_text() == "my notes\n" and not beside.exists()
    (tmp_path / "real").mkdir()
    link = tmp_path / "link.toml"
    link.symlink_to(tmp_path / "real" / "t.toml")  # dangling: refused, nothing written anywhere
    result = met("bench", "spec-cost", *FAST, "--quiet", "--out", str(link))
    assert result.exit_code == EX_CANTCREAT and "which does not exist" in result.stderr
    assert list((tmp_path / "real").iterdir()) == []
    assert met("bench", "spec-cost", *FAST, "--quiet", "--out", str(tmp_path / "real" / "t.toml")).exit_code == EX_OK
    assert met("bench", "spec-cost", *FAST, "--quiet", "--out", str(link)).exit_code == EX_OK
    assert link.is_symlink() and CostTable.parse((tmp_path / "real" / "t.toml").read_text())
    assert (tmp_path / "real" / "t.calibration.toml").exists()  # beside the table, where met serve looks for it
    assert not (tmp_path / "link.calibration.toml").exists()


def test_energy_nvml_unavailable_exits_69_with_the_reason(use_micro, tmp_path):
    out = tmp_path / "t.toml"
    result = met("bench", "spec-cost", *FAST, "--energy", "nvml", "--device", "cpu", "--out", str(out))
    assert result.exit_code == EX_UNAVAILABLE
    assert "--energy nvml: NVML measures a CUDA device" in result.stderr
    assert not out.exists()


def test_energy_rapl_unavailable_exits_69(use_micro, tmp_path, monkeypatch):
    monkeypatch.setattr(meters, "RAPL_ROOT", tmp_path / "no-powercap")
    result = met("bench", "spec-cost", *FAST, "--energy", "rapl", "--out", str(tmp_path / "t.toml"))
    assert result.exit_code == EX_UNAVAILABLE and "no RAPL package zones" in result.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["--widths", "1,x"], "'x' in '1,x' is not a whole number in 1..256"),
    (["--widths", "2,2"], "repeats a value"),
    (["--energy", "joules"], "'joules' is not one of"),
    (["--box-class", "../up"], "is not a name"),
    (["--dtype", "float99"], "dtype 'float99'"),
    (["--context-len", "500"], "exceed the model's max_seq_len 128"),
    (["--widths", ""], "'' in '' is not a whole number"),  # not the default widths
    (["--widths", "100000"], "is not a whole number in 1..256"),  # would allocate 100000 KV caches
    (["--dtype", "int8"], "--dtype 'int8' is not one of"),  # was a TypeError at the model's load
    (["--device", "bogus"], "--device 'bogus' is not a torch device"),
    (["--verify-depth", "17"], "'--verify-depth': Input should be less than or equal to 16"),  # none copies deeper
    (["--verify-depth", "16", "--context-len", "100"], "or --verify-depth"),  # 100 + 2 + 16 + 1 > 128
], ids=["widths", "repeated-width", "energy", "box-class", "dtype", "context", "empty-widths", "huge-width",
        "int-dtype", "device", "verify-depth", "verify-depth-context"])
def test_bad_values_exit_2_with_the_value(use_micro, tmp_path, args, message):
    result = met("bench", "spec-cost", *FAST, *args, "--out", str(tmp_path / "t.toml"))
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "t.toml").exists()


def test_quick_without_out_exits_2_and_leaves_the_default_table_alone(use_micro, tmp_path, monkeypatch):
    # a smoke run must not replace the table a serve plans from (tables/<box>/<recipe>.toml)
    monkeypatch.chdir(tmp_path)
    result = met("bench", "spec-cost", "--quick")
    assert result.exit_code == 2 and "pass --out" in result.output and not (tmp_path / "tables").exists()


@pytest.mark.parametrize("where", ["tables/cpu-box-1t/t.toml", "link.toml"])
def test_quick_never_writes_inside_a_tables_folder(use_micro, tmp_path, monkeypatch, where):
    # `--quick --out tables/<box>/<recipe>.toml` replaced the table a serve plans from; so did a link into tables/
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tables" / "cpu-box-1t").mkdir(parents=True)
    (tmp_path / "link.toml").symlink_to(tmp_path / "tables" / "cpu-box-1t" / "t.toml")
    result = met("bench", "spec-cost", "--quick", *FAST, "--out", where)
    assert result.exit_code == 2, result.output
    assert "inside a tables folder" in " ".join(result.output.split()) and "Traceback" not in result.output
    assert list((tmp_path / "tables").rglob("*.toml")) == []


def test_a_quick_table_says_so_in_its_meta(quick_run, use_micro, tmp_path):
    assert CostTable.parse(quick_run[1].read_text()).meta["quick"] is True
    out = tmp_path / "t.toml"
    assert met("bench", "spec-cost", *FAST, "--no-calibrate", "--out", str(out)).exit_code == EX_OK
    assert "quick" not in CostTable.parse(out.read_text()).meta


def test_missing_recipe_exits_66(tmp_path):
    result = met("bench", "spec-cost", *FAST, "--recipe", "no-such-recipe", "--out", str(tmp_path / "t.toml"))
    assert result.exit_code == EX_NOINPUT and "no embedded recipe 'no-such-recipe'" in result.stderr


def test_calibration_prompts_missing_invalid_or_too_few(use_micro, tmp_path):
    out = tmp_path / "t.toml"
    result = met("bench", "spec-cost", *FAST, "--calibration-prompts", str(tmp_path / "nope.jsonl"), "--out", str(out))
    assert result.exit_code == EX_NOINPUT and "nope.jsonl: no such file" in result.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('"fine"\n{not json\n')
    result = met("bench", "spec-cost", *FAST, "--calibration-prompts", str(bad), "--out", str(out))
    assert result.exit_code == EX_DATAERR and "bad.jsonl:2: not JSON" in result.stderr
    # one short prompt gives far fewer than 100 judged drafts: refused, and nothing is written
    few = tmp_path / "few.jsonl"
    few.write_text(json.dumps("def f():") + "\n")
    result = met("bench", "spec-cost", "--quick", *FAST, "--calibration-prompts", str(few), "--out", str(out))
    assert result.exit_code == EX_DATAERR and "needs at least 100 judged drafts" in result.stderr
    assert not out.exists() and not calibration_path(out).exists()


def test_calibration_prompts_from_a_folder(use_micro, tmp_path):
    folder = tmp_path / "prompts"
    folder.mkdir()
    for i in range(8):
        (folder / f"p{i}.py").write_text(f"def f{i}(x):\n    return x * {i}\n" * 4)
    out = tmp_path / "t.toml"
    result = met("bench", "spec-cost", *FAST, "--calibration-prompts", str(folder), "--out", str(out))
    assert result.exit_code == EX_OK, result.output
    assert AcceptanceCalibration.parse(calibration_path(out).read_text()).meta["prompts"] == 8
    binary, empty = tmp_path / "binary", tmp_path / "empty"  # nothing usable: said for what it is, exit 65
    binary.mkdir(), empty.mkdir()
    (binary / "blob").write_bytes(b"\xff\xfe\xfd" * 40)
    for folder, words in ((binary, "1 files, none with UTF-8 text in its first"), (empty, "holds no files")):
        result = met("bench", "spec-cost", *FAST, "--calibration-prompts", str(folder), "--out", str(out))
        assert result.exit_code == EX_DATAERR and words in result.stderr, result.output


def test_help_documents_the_exit_statuses():
    result = runner.invoke(app, ["bench", "spec-cost", "--help"])
    assert result.exit_code == EX_OK
    text = " ".join(result.stdout.split())  # the help is wrapped to the terminal
    for status in ("65 (EX_DATAERR)", "66 (EX_NOINPUT)", "69 (EX_UNAVAILABLE)", "73 (EX_CANTCREAT)",
                   "75 (EX_TEMPFAIL)", "78 (EX_CONFIG)", "--replace"):
        assert status in text


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_nvml_sweep_on_this_gpu(use_micro, tmp_path):
    # a one-width NVML sweep: every cell has joules; NVML that does not work here is a skip, with its reason
    out = tmp_path / "t.toml"
    result = met("bench", "spec-cost", *FAST, "--widths", "1", "--window", "1.0", "--device", "cuda",
                 "--energy", "nvml", "--no-calibrate", "--out", str(out))
    if result.exit_code == EX_UNAVAILABLE:
        pytest.skip(f"NVML energy unavailable here: {result.stderr.strip()}")
    assert result.exit_code == EX_OK, result.output
    table = CostTable.parse(out.read_text())
    assert table.key.energy_source == "nvml" and all(c.verify_j > 0 for c in table.cells)
    assert table.key.box_class.startswith("nvidia-")


def test_ctrl_c_is_exit_130_in_one_line_and_the_files_stay_whole(use_micro, tmp_path, monkeypatch):
    # Ctrl-C mid-sweep ended with a bare blank line; now one line says what state the files are in
    out = tmp_path / "t.toml"
    assert met("bench", "spec-cost", *FAST, "--quiet", "--out", str(out)).exit_code == EX_OK
    before = out.read_bytes(), calibration_path(out).read_bytes()

    def interrupted(request, reporter):
        raise KeyboardInterrupt

    monkeypatch.setattr(spec_cost_cli, "_run", interrupted)
    result = met("bench", "spec-cost", *FAST, "--quiet", "--out", str(out))
    assert result.exit_code == EX_INTERRUPTED
    assert result.stderr == (f"error: interrupted: {out} and its calibration are each whole, as they were or as "
                             "this run wrote them\n")
    assert (out.read_bytes(), calibration_path(out).read_bytes()) == before


def test_tables_check_this_box_checks_only_this_box_classs_folder(quick_run, use_micro, tmp_path):
    # tables/ as committed: this box's folder beside another box class's. A check of the whole folder exits 78
    # on every box (the other box's table is not this box's); --this-box checks this box's folder alone.
    _, out = quick_run
    box = CostTable.parse(out.read_text()).key.box_class
    mine, other = tmp_path / "tables" / box, tmp_path / "tables" / "nvidia-h200x1"
    mine.mkdir(parents=True)
    other.mkdir()
    (mine / "micro-random.toml").write_text(out.read_text())
    (mine / "micro-random.calibration.toml").write_text(calibration_path(out).read_text())
    (other / "micro-random.toml").write_text(out.read_text().replace(f'"{box}"', '"nvidia-h200x1"'))
    assert met("tables", "check", str(tmp_path / "tables")).exit_code == EX_CONFIG
    result = met("tables", "check", "--this-box", str(tmp_path / "tables"))
    assert result.exit_code == EX_OK, result.output
    assert f"{mine}: 2 of 2 files pass" in result.stdout and "nvidia-h200x1" not in result.output
    # a box class with no folder there: 66, naming the class and the folders there are
    result = met("tables", "check", "--this-box", "--box-class", "cpu-other-1t", str(tmp_path / "tables"))
    assert result.exit_code == EX_NOINPUT
    assert f"no folder for this box's class 'cpu-other-1t' (it holds {box}, nvidia-h200x1)" in result.stderr


def test_tables_check_compares_a_table_under_the_dtype_it_was_measured_in(quick_run, use_micro, tmp_path):
    # A table measured in float64 is for a serve run with --dtype float64: checked as such unless --dtype says else.
    _, out = quick_run
    measured = tmp_path / "t.float64.toml"
    assert met("bench", "spec-cost", *FAST, "--no-calibrate", "--dtype", "float64", "--out",
               str(measured)).exit_code == EX_OK
    assert met("tables", "check", str(measured)).exit_code == EX_OK
    assert met("tables", "check", "--dtype", "float32", str(measured)).exit_code == EX_CONFIG
