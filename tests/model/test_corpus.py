"""Held-out prompts (met.model.corpus): the calibration's windows never share a byte with the benchmarks'; near-copies."""

from pathlib import Path

import pytest

from met.bench.policies import PROMPT_BYTES, PROMPT_OFFSET
from met.bench.policies_cli import DEFAULTS
from met.model.corpus import (CALIBRATION_START, CALIBRATION_STRIDE, benchmark_files, calibration_windows,
                              heldout_code, heldout_prompts, is_heldout, near_copies)

LINE = 16  # each line of a fake file is "#" + its own byte offset, so a window says where it was cut


def _lines(size: int) -> bytes:
    return b"".join(f"#{off:014d}\n".encode() for off in range(0, size, LINE))


def _offsets(text: str) -> list[int]:
    return [int(line[1:]) for line in text.split("\n") if len(line) == LINE - 1]


@pytest.fixture
def root(tmp_path):
    """A fake stdlib of three held-out files (10, 5 and 1 KiB) and one training file."""
    names = sorted([n for n in (f"m{i}.py" for i in range(2000)) if is_heldout(n)][:3])  # as listed
    trained = next(n for n in (f"t{i}.py" for i in range(2000)) if not is_heldout(n))
    for name, size in zip(names, (10240, 5120, 1024)):
        (tmp_path / name).write_bytes(_lines(size))
    (tmp_path / trained).write_bytes(_lines(10240).replace(b"#", b"t"))  # no held-out line: none a near-copy
    return tmp_path


def test_calibration_windows_start_past_the_benchmark_prompts_and_their_continuations():
    assert PROMPT_OFFSET + PROMPT_BYTES + DEFAULTS["max_tokens"] + LINE <= CALIBRATION_START


def test_calibration_windows_go_round_the_files_then_deeper(root):
    windows = calibration_windows(100, size=64, root=root)
    starts = [_offsets(w)[0] for w in windows]
    # each from the first line start after its offset; the 1 KiB file gives none, the 5 KiB file two
    assert starts == [o + LINE for o in (2048, 2048, 4096, 4096, 6144, 8192)]
    assert all(len(w) == 64 for w in windows)
    assert calibration_windows(3, size=64, root=root) == windows[:3]


def test_calibration_windows_share_no_byte_with_the_benchmark_prompts(root):
    bench = [o for t in heldout_code(16, offset=PROMPT_OFFSET, size=PROMPT_BYTES, root=root) for o in _offsets(t)]
    calib = [o for t in calibration_windows(100, root=root) for o in _offsets(t)]
    assert bench and calib
    assert max(bench) + LINE <= CALIBRATION_START <= min(calib)
    assert all(o % CALIBRATION_STRIDE < PROMPT_BYTES + LINE for o in calib)


def test_no_held_out_files_give_no_windows(tmp_path):
    assert calibration_windows(8, root=tmp_path) == []


def test_a_long_line_does_not_carry_a_benchmark_prompt_into_the_calibration_windows(tmp_path):
    # the first line start after byte 1024 lies past CALIBRATION_START: from there both cuts would take the same bytes
    name = next(n for n in (f"m{i}.py" for i in range(2000)) if is_heldout(n))
    data = b"x = 1\n" * 150 + b"s = '" + b"y" * 1500 + b"'\n" + b"z = 2\n" * 500
    (tmp_path / name).write_bytes(data)
    assert data.find(b"\n", PROMPT_OFFSET) + 1 > CALIBRATION_START
    bench = heldout_code(16, offset=PROMPT_OFFSET, size=PROMPT_BYTES, root=tmp_path)
    calib = calibration_windows(100, size=PROMPT_BYTES, root=tmp_path)
    assert calib and not set(bench) & set(calib)
    assert bench == []  # no window of this file ends by CALIBRATION_START


def test_near_copies_are_held_out_files_made_of_training_lines(tmp_path):
    # a held-out table whose rows a training file holds too is a near-copy; fresh code is not; the share is
    # of line bytes (stripped, blank lines left out), so indentation and blank lines do not count
    held = [n for n in (f"h{i}.py" for i in range(2000)) if is_heldout(n)][:3]
    trained = next(n for n in (f"t{i}.py" for i in range(2000)) if not is_heldout(n))
    rows = "".join(f"    {i:#06x}: 'x{i}',\n" for i in range(40))
    (tmp_path / trained).write_text("TABLE = {\n" + rows + "}\n")
    (tmp_path / held[0]).write_text("MAP = {\n\n" + rows + "}\n")  # the rows again, its own first line
    (tmp_path / held[1]).write_text("def fresh():\n    return 1\n")
    (tmp_path / held[2]).write_text("# half\n" * 3 + "    0x0001: 'x1',\n" * 3)
    found = near_copies(root=tmp_path)
    assert set(found) == {held[0]} and 0.95 < found[held[0]] < 1.0
    assert set(near_copies(share=0.5, root=tmp_path)) == {held[0], held[2]}


def test_no_prompt_or_window_is_cut_from_a_near_copy(tmp_path):
    # two held-out files long enough for every cut: one a copy of a training file's lines, one fresh
    held = sorted(n for n in (f"h{i}.py" for i in range(2000)) if is_heldout(n))[:2]
    trained = next(n for n in (f"t{i}.py" for i in range(2000)) if not is_heldout(n))
    (tmp_path / trained).write_bytes(_lines(8192))
    (tmp_path / held[0]).write_bytes(_lines(8192))  # sorts first: every cut would start with it
    (tmp_path / held[1]).write_bytes(b"".join(f"y{i:013d}\n".encode() for i in range(512)))
    assert set(near_copies(root=tmp_path)) == {held[0]} and list(benchmark_files(tmp_path)) == [held[1]]
    cuts = (heldout_prompts(8, root=tmp_path) + heldout_code(8, offset=PROMPT_OFFSET, size=PROMPT_BYTES, root=tmp_path)
            + calibration_windows(8, root=tmp_path))
    assert len(cuts) == 1 + 1 + 3 and all(text.startswith("y") for text in cuts)  # 7,680 bytes: 3 windows


def test_benchmark_files_are_read_once_per_root_and_files(root, monkeypatch):
    # a second call reads no file (the stdlib takes a second); a caller's edit of its dict reaches no later call;
    # the same folder by another name is the same root; a file rewritten, or one more, is read again
    from met.model import corpus

    reads = []
    read_split = corpus._read_split
    monkeypatch.setattr(corpus, "_read_split", lambda r: reads.append(r) or read_split(r))
    first = benchmark_files(root)
    first.clear()
    alias = root / "alias"  # a link to a folder is not walked: root's files stay the same
    alias.symlink_to(root)
    again = benchmark_files(alias)
    assert len(reads) == 1 and len(again) == 3
    name = list(again)[2]  # the 1 KiB file
    (root / name).write_bytes(_lines(2048))
    assert len(benchmark_files(root)[name]) == 2048 and len(reads) == 2
    (root / "sub").mkdir()
    (root / "sub" / name).write_bytes(_lines(64))
    assert benchmark_files(root) is not benchmark_files(root) and len(reads) == 3


def test_met_corpus_root_points_every_cut_at_another_stdlib(root, monkeypatch):
    # a box whose python is another version reads the card's stdlib instead of its own (scripts/gpu_check.sh)
    import sysconfig

    from met.model.corpus import CORPUS_ROOT_ENV, stdlib_root

    monkeypatch.delenv(CORPUS_ROOT_ENV, raising=False)
    assert stdlib_root() == Path(sysconfig.get_paths()["stdlib"])
    monkeypatch.setenv(CORPUS_ROOT_ENV, str(root))
    assert stdlib_root() == root
    assert list(benchmark_files()) == list(benchmark_files(root)) and len(benchmark_files()) == 3
    assert heldout_prompts(2) == heldout_prompts(2, root=root)


def test_a_corpus_with_no_held_out_files_is_refused_naming_where_it_was_read(tmp_path, monkeypatch):
    # a MET_CORPUS_ROOT with no stdlib in it (a wrong path on a GPU box): 66, the folder and the variable named
    from typer.testing import CliRunner

    from met.cli import app
    from met.exit_codes import EX_NOINPUT

    monkeypatch.setenv("MET_CORPUS_ROOT", str(tmp_path))
    for args in (["bench", "policies", "--quick", "--out-dir", str(tmp_path / "out")],
                 ["bench", "spec-cost", "--quick", "--out", str(tmp_path / "t.toml")]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == EX_NOINPUT, result.output
        assert f"(read from {tmp_path} (MET_CORPUS_ROOT))" in result.output
