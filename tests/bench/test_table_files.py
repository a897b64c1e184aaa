"""Table files (met.bench.table_files): the lock, atomic replacement under SIGKILL, the change report."""

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from met.bench.table_files import (Existing, LockHeld, TableLock, changes, lock_path, read_existing,
                                   remove_stale_temps, write_atomic)
from met.speculative.spec_cost import Cell, CostTable, TableKey, VerifyCell

KEY = TableKey("cpu-test-1t", "micro@0", "none", {"decode": "d1", "verify": "v1"})


def table(scale: float = 1.0, key: TableKey = KEY) -> CostTable:
    """Two widths at depths 0..=1, every cost times `scale`."""
    return CostTable(key, [Cell(1, 0, 0.010 * scale, 0.0), Cell(1, 1, 0.012 * scale, 0.002 * scale),
                           Cell(2, 0, 0.011 * scale, 0.0), Cell(2, 1, 0.014 * scale, 0.003 * scale)])


def test_write_atomic_replaces_the_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "sub" / "t.toml"
    write_atomic(path, "a = 1\n")
    write_atomic(path, "a = 2\n")
    assert path.read_text() == "a = 2\n"
    assert sorted(p.name for p in path.parent.iterdir()) == ["t.toml"]


def test_remove_stale_temps_only_removes_this_tables_temps(tmp_path):
    path = tmp_path / "t.toml"
    (tmp_path / ".t.toml.abc123.tmp").write_text("half a tab")  # a killed write's leftover
    (tmp_path / ".other.toml.x.tmp").write_text("")  # another table's: not ours to remove
    removed = remove_stale_temps(path)
    assert [p.name for p in removed] == [".t.toml.abc123.tmp"]
    assert (tmp_path / ".other.toml.x.tmp").exists()


def test_lock_refuses_a_second_holder_and_names_the_first(tmp_path):
    path = tmp_path / "t.toml"
    with TableLock(path):
        with pytest.raises(LockHeld, match=f"holds {lock_path(path)} \\(pid {os.getpid()}\\)"):
            with TableLock(path):
                pass
    with TableLock(path):  # released: the next run gets it
        pass


def test_lock_is_released_when_its_holder_is_killed(tmp_path):
    # a run killed with SIGKILL does not leave the table locked forever
    path = tmp_path / "t.toml"
    code = f"from met.bench.table_files import TableLock; import time\nwith TableLock(__import__('pathlib').Path({str(path)!r})):\n print('locked', flush=True); time.sleep(60)"
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(LockHeld):
            with TableLock(path):
                pass
    finally:
        holder.kill()
        holder.wait()
    with TableLock(path):
        pass


WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from met.bench.table_files import write_atomic
    path, texts = Path(sys.argv[1]), [Path(a).read_text() for a in sys.argv[2:]]
    print("ready", flush=True)
    i = 0
    while True:
        write_atomic(path, texts[i % len(texts)])
        i += 1
""")


def test_sigkill_at_any_moment_leaves_a_whole_table(tmp_path):
    # a writer replacing the table in a loop is killed at random moments: the table is always one of
    # the two versions whole, and the next write under the lock clears the killed writes' temp files
    versions = [table(1.0).to_toml(), table(1.7).to_toml()]
    sources = []
    for i, text in enumerate(versions):
        sources.append(tmp_path / f"v{i}.toml")
        sources[-1].write_text(text)
    path = tmp_path / "tables" / "t.toml"
    write_atomic(path, versions[0])
    rng = random.Random(5)
    for _ in range(6):
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path), *map(str, sources)],
                                  stdout=subprocess.PIPE, text=True)
        assert writer.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.05))
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        text = path.read_text()
        assert text in versions
        assert CostTable.parse(text) in (table(1.0), table(1.7))
    with TableLock(path):
        remove_stale_temps(path)
        write_atomic(path, versions[1])
    assert sorted(p.name for p in path.parent.iterdir()) == ["t.toml", "t.toml.lock"]


def test_changes_against_the_old_table(tmp_path):
    lines = changes(Existing(table(1.0)), table(1.1))
    assert lines[0] == "n=1 k=0: verify 11 ms (+10.0%)"
    assert lines[1] == "n=1 k=1: verify 13.2 ms (+10.0%), draft 2.2 ms (+10.0%)"
    # the last line is what two back-to-back runs are judged by
    assert lines[-1] == "median |change| over 4 cells: step time 10.0% (verify 10.0%, draft 10.0%)"


def test_changes_report_each_copy_verify_cell_against_what_the_old_table_priced_copies_at():
    copies = [VerifyCell(1, 1, 0.0099), VerifyCell(1, 2, 0.0165), VerifyCell(1, 3, 0.018)]
    new = CostTable(KEY, table(1.1).cells, verify_cells=copies)  # copies verified from k = 1, kmax 1
    old = CostTable(KEY, table(1.0).cells, verify_cells=[VerifyCell(1, 2, 0.015)])  # an older table: past kmax only
    lines = changes(Existing(old), new)
    # k = 1: the old table priced a copy at its cell's verify (12 ms); k = 2 at its verify cell; k = 3 not at all
    assert lines[4:7] == ["n=1 k=1 copies: verify 9.9 ms (-17.5%)", "n=1 k=2 copies: verify 16.5 ms (+10.0%)",
                          "n=1 k=3 copies: verify 18 ms (new)"]
    # against a table with the same verify cells: each against its own, not the cell's verify at its depth
    assert changes(Existing(new), new)[4:7] == ["n=1 k=1 copies: verify 9.9 ms (+0.0%)",
                                                "n=1 k=2 copies: verify 16.5 ms (+0.0%)",
                                                "n=1 k=3 copies: verify 18 ms (+0.0%)"]
    # the verify of 2 copies is compared with a table whose cells went as deep: what it priced them at
    deeper = CostTable(KEY, [*table(1.0).cells, Cell(1, 2, 0.012, 0.004), Cell(2, 2, 0.02, 0.005)])
    assert changes(Existing(deeper), new)[5] == "n=1 k=2 copies: verify 16.5 ms (+37.5%)"
    # a width the old table never measured is new, not compared with a neighbour's
    wider = CostTable(KEY, [*table(1.1).cells, Cell(4, 0, 0.02, 0.0), Cell(4, 1, 0.03, 0.004)],
                      verify_cells=[VerifyCell(4, 1, 0.025)])
    assert changes(Existing(old), wider)[6] == "n=4 k=1 copies: verify 25 ms (new)"
    assert changes(Existing(new), new)[-1].startswith("median |change| over 4 cells: step time 0.0%")


def test_changes_report_a_new_key_a_bad_old_file_and_no_file(tmp_path):
    other = TableKey("cpu-test-2t", "micro@0", "none", {"decode": "d2", "verify": "v1"})
    lines = changes(Existing(table(1.0)), table(1.0, other))
    assert lines[0] == ("the key changed: box_class 'cpu-test-1t' -> 'cpu-test-2t'; "
                        "plan digest of decode d1 -> d2")
    bad = tmp_path / "bad.toml"
    bad.write_text("schema = 1\n[key\n")
    old = read_existing(bad)
    assert old.table is None and "not valid TOML" in old.problem and old.foreign  # not even TOML: not ours
    assert changes(old, table())[0] == "n=1 k=0: verify 10 ms (new)"  # the caller says what was there
    bad.write_text('schema = 1\n[key]\nbox_class = "x"\n')  # a table of ours, damaged: replaced, not foreign
    assert read_existing(bad).problem and not read_existing(bad).foreign
    bad.write_text('hello = "world"\n')  # TOML, but no table
    assert read_existing(bad).foreign
    bad.write_bytes(b"\xff\xfe")  # not text
    assert read_existing(bad).foreign and "not UTF-8" in read_existing(bad).problem
    assert changes(read_existing(tmp_path / "none.toml"), table()) == ["no table there before; every cell is new"]
