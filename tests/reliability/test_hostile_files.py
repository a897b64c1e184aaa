"""Hostile files at every path met reads: a FIFO, /dev/zero (and a link to it), a 200 KB dotted-key bomb, nesting
100,000 deep. Each reader refuses each with its documented status (65; 73 at --out) in one line, at once, without
the memory a parser would need, and never blocks; the table files are replaced as a pair, at a link's target.

The readers run in one subprocess (hostile_files.py) so that its peak memory is theirs alone.
"""

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from met import bounded_read
from met.bench import table_files
from met.bench.table_files import TableLock, Unwritable, commit_pair, resolve_out, stage
from met.exit_codes import EX_CANTCREAT, EX_DATAERR
from met.speculative.spec_cost import TableParseError
from met.speculative.spec_cost.fields import check_toml_shape

HERE = Path(__file__).parent
ACCEPTED_AS_PROMPTS = {"dotted-key bomb", "nested arrays", "nested tables", "nested JSON"}  # text, cut to 64 bytes


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile")
    run = subprocess.run([sys.executable, str(HERE / "hostile_files.py"), str(folder)], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]


def test_every_reader_refuses_every_hostile_file_in_one_line_at_once(cases):
    # 12 readers x 7 files (3 at --out): each refused with its status, one line, within 2 s and 200 MB
    assert len(cases) == 11 * 7 + 3
    for case in cases:
        where = f"{case['reader']} on {case['file']}: {case}"
        if case["reader"] == "prompts folder" and case["file"] in ACCEPTED_AS_PROMPTS:
            assert case["outcome"] == "accepted", where  # a text file's first bytes are a prompt
        else:
            want = EX_CANTCREAT if case["reader"].endswith("--out") else EX_DATAERR
            assert case["outcome"] == want, where
            assert case["message"] and "\n" not in case["message"] and "Traceback" not in case["message"], where
        assert case["seconds"] < 2.0, where
        assert case["peak_rise_kib"] < 200 * 1024, where


def test_the_refusal_names_what_the_file_is(cases):
    by = {(c["reader"], c["file"]): c["message"] for c in cases}
    assert "is a FIFO (named pipe), not a regular file" in by["met tables check", "fifo"]
    assert "is a character device" in by["met serve: keys file", "link to /dev/zero"]
    assert "dotted key of more than 32 parts" in by["met tables show", "dotted-key bomb"]
    assert "nested more than 32 deep" in by["met serve: cost table", "nested tables"]
    assert "the table's path" in by["met bench spec-cost --out", "fifo"]


def test_a_fifo_is_never_opened_and_a_large_file_never_read_whole(tmp_path):
    # a FIFO without a writer would block an ordinary open(); past the limit only limit + 1 bytes are read
    fifo = tmp_path / "p"
    os.mkfifo(fifo)
    with pytest.raises(bounded_read.NotRegular, match="FIFO"):
        bounded_read.read_bytes(fifo, 10)
    big = tmp_path / "big"
    big.write_bytes(b"x" * 100)
    with pytest.raises(bounded_read.TooLarge, match="100 bytes, more than the 99"):
        bounded_read.read_bytes(big, 99)
    assert bounded_read.read_bytes(big, 100) == b"x" * 100
    with pytest.raises(IsADirectoryError):
        bounded_read.read_bytes(tmp_path, 10)


@pytest.mark.parametrize("text, ok", [
    ("a.b.c = 1\n[key.plan_digests]\nx = 1.5\n", True),  # the shapes a met file has
    ('note = "' + "." * 500 + '"\n', True),  # dots in a string are no key's
    ("note = '''" + "[" * 500 + "'''\n", True),  # nor brackets in a multi-line literal string
    ("# " + "{" * 500 + "\n", True),  # nor in a comment
    ("a" + ".a" * 32 + " = 1\n", False),  # 33 parts
    ("a" + ".a" * 31 + " = 1\n", True),  # 32 parts
    ("a = " + "[" * 33 + "]" * 33 + "\n", False),  # 33 deep
    ("a = " + "[" * 32 + "]" * 32 + "\n", True),  # 32 deep
    ("[" + ". a" * 40 + "]\n", False),  # a header's dotted key, spaced
])
def test_the_shape_scan_counts_only_toml_structure(text, ok):
    if ok:
        check_toml_shape(text)
    else:
        with pytest.raises(TableParseError, match="refused before parsing"):
            check_toml_shape(text)


def test_escape_shows_control_characters_instead_of_dropping_them():
    # "cpu-amd\x1b[2K-epyc" must not print as the same text as "cpu-amd-epyc"
    assert bounded_read.escape("cpu-amd\x1b[2K-epyc") == "cpu-amd\\x1b[2K-epyc"
    assert bounded_read.escape("a\nb\\c") == "a\\nb\\\\c"
    assert bounded_read.escape("plain ascii") == "plain ascii"


def test_a_dangling_link_at_out_is_refused_and_a_link_resolves_to_its_target(tmp_path):
    link = tmp_path / "link.toml"
    link.symlink_to(tmp_path / "elsewhere" / "t.toml")
    with pytest.raises(Unwritable, match="which does not exist"):
        resolve_out(link)
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "t.toml").write_text("x")
    good = tmp_path / "good.toml"
    good.symlink_to(tmp_path / "real" / "t.toml")
    assert resolve_out(good) == (tmp_path / "real" / "t.toml").resolve()


def test_the_pair_is_replaced_whole_or_not_at_all(tmp_path, monkeypatch):
    # the second rename fails: the first file is put back as it was; no temp is left
    cal, table = tmp_path / "t.calibration.toml", tmp_path / "t.toml"
    cal.write_text("old calibration")
    table.write_text("old table")
    staged = [(stage(cal, "new calibration"), cal), (stage(table, "new table"), table)]
    real = os.replace

    def failing(src, dst):
        if Path(dst) == table:
            raise OSError(errno.EPERM, "Operation not permitted", str(dst))
        return real(src, dst)

    monkeypatch.setattr(table_files.os, "replace", failing)
    with pytest.raises(OSError):
        commit_pair(staged)
    assert (cal.read_text(), table.read_text()) == ("old calibration", "old table")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.calibration.toml", "t.toml"]
    monkeypatch.setattr(table_files.os, "replace", real)
    commit_pair([(stage(cal, "new calibration"), cal), (stage(table, "new table"), table)])
    assert (cal.read_text(), table.read_text()) == ("new calibration", "new table")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.calibration.toml", "t.toml"]


def test_a_pair_with_no_calibration_before_is_undone_by_removing_it(tmp_path, monkeypatch):
    cal, table = tmp_path / "t.calibration.toml", tmp_path / "t.toml"
    table.write_text("old table")
    staged = [(stage(cal, "new calibration"), cal), (stage(table, "new table"), table)]
    real = os.replace
    monkeypatch.setattr(table_files.os, "replace",
                        lambda s, d: (_ for _ in ()).throw(OSError(errno.EBUSY, "busy")) if Path(d) == table
                        else real(s, d))
    with pytest.raises(OSError):
        commit_pair(staged)
    assert not cal.exists() and table.read_text() == "old table"


def test_a_full_disk_before_any_lock_file_is_73_and_leaves_no_lock_file(tmp_path, monkeypatch):
    # the lock file is created, then its pid cannot be written (ENOSPC): Unwritable (73), and it is removed again
    table = tmp_path / "t.toml"

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(table_files.os, "pwrite", full)
    with pytest.raises(Unwritable, match="No space left on device"):
        with TableLock(table):
            pass
    assert list(tmp_path.iterdir()) == []


def test_a_lock_file_that_is_a_fifo_is_refused_unopened(tmp_path):
    table = tmp_path / "t.toml"
    os.mkfifo(table_files.lock_path(table))
    with pytest.raises(Unwritable, match="the lock file .* is a FIFO"):
        with TableLock(table):
            pass


def test_a_key_mismatch_escapes_control_characters_instead_of_dropping_them():
    # a terminal (and click) drops ESC sequences: "cpu-amd\x1b[2K-epyc-1t" must not read as "cpu-amd-epyc-1t"
    from met.speculative.spec_cost import TableKey

    table = TableKey("cpu-amd\x1b[2K-epyc-1t", "r@1", "none", {"decode": "d"})
    serve = TableKey("cpu-amd-epyc-1t", "r@1", "none", {"decode": "d"})
    message = table.check(serve)[0].message()
    assert "'cpu-amd\\x1b[2K-epyc-1t'" in message and "\x1b" not in message


def test_show_writes_a_wide_table_as_plain_grids_quickly(tmp_path):
    # 30,000 widths once took minutes (a rich grid per width); past MANY_WIDTHS each width is plain text
    import time

    from typer.testing import CliRunner

    from met.bench.table_view import MANY_WIDTHS
    from met.bench.tables_cli import tables_app
    from met.speculative.spec_cost import Cell, CostTable, TableKey

    widths = range(1, 3 * MANY_WIDTHS + 1)
    key = TableKey("box", "r@1", "none", {"decode": "d"})
    path = tmp_path / "wide.toml"
    path.write_text(CostTable(key, [Cell(n, k, 0.01 + 1e-6 * n, 0.001 * k) for n in widths for k in (0, 1)]).to_toml())
    started = time.perf_counter()
    result = CliRunner().invoke(tables_app, ["show", str(path)])
    assert result.exit_code == 0, result.output
    assert time.perf_counter() - started < 30
    assert result.stdout.count("width n = ") == len(widths) and f"width n = {widths[-1]}\nk  verify ms" in result.stdout
