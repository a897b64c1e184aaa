"""The weight digest cache (met.model.digest_cache): a hit skips hashing; any change to a file is hashed again."""

import json
import os

import pytest

from met.model.digest_cache import CACHE_FILE, cache_dir, cached_digest
from met.model.hf_checkpoint import files_digest


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A folder of two weight files, the cache in a folder of its own."""
    monkeypatch.setenv("MET_CACHE_DIR", str(tmp_path / "cache"))
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "a.safetensors").write_bytes(b"a" * 1000)
    (ckpt / "b.safetensors").write_bytes(b"b" * 2000)
    return ckpt


class Counting:
    """files_digest, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, files):
        self.calls += 1
        return files_digest(files)


def files_of(folder):
    return sorted(folder.glob("*.safetensors"))


def test_the_second_start_reads_the_digest_from_the_cache(folder):
    digest = Counting()
    first = cached_digest(folder, files_of(folder), digest)
    second = cached_digest(folder, files_of(folder), digest)
    assert first == second == files_digest(files_of(folder)) and digest.calls == 1
    assert str(folder.resolve()) in json.loads((cache_dir() / CACHE_FILE).read_text())


def test_a_rewritten_file_is_hashed_again_even_with_its_size_and_mtime_put_back(folder):
    digest = Counting()
    before = cached_digest(folder, files_of(folder), digest)
    path = folder / "a.safetensors"
    st = path.stat()
    path.write_bytes(b"c" * 1000)  # same size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same mtime: only the ctime tells
    after = cached_digest(folder, files_of(folder), digest)
    assert digest.calls == 2 and after == files_digest(files_of(folder)) != before


def test_a_file_added_or_removed_is_hashed_again(folder):
    digest = Counting()
    cached_digest(folder, files_of(folder), digest)
    (folder / "c.safetensors").write_bytes(b"c")
    assert cached_digest(folder, files_of(folder), digest) == files_digest(files_of(folder))
    (folder / "c.safetensors").unlink()
    assert cached_digest(folder, files_of(folder), digest) == files_digest(files_of(folder))
    assert digest.calls == 3


@pytest.mark.parametrize("junk", ["not json", "[1, 2]", '{"x": 1}', "\udc80"])
def test_a_corrupt_cache_is_ignored_and_replaced(folder, junk):
    cache_dir().mkdir(parents=True)
    (cache_dir() / CACHE_FILE).write_text(junk, encoding="utf-8", errors="surrogateescape")
    digest = Counting()
    assert cached_digest(folder, files_of(folder), digest) == files_digest(files_of(folder))
    assert cached_digest(folder, files_of(folder), digest) == files_digest(files_of(folder)) and digest.calls == 1


def test_a_cache_entry_with_a_wrong_shape_is_a_miss(folder):
    digest = Counting()
    cached_digest(folder, files_of(folder), digest)
    doc = json.loads((cache_dir() / CACHE_FILE).read_text())
    doc[str(folder.resolve())]["digest"] = 12  # not a digest
    (cache_dir() / CACHE_FILE).write_text(json.dumps(doc))
    assert cached_digest(folder, files_of(folder), digest) == files_digest(files_of(folder)) and digest.calls == 2


def test_an_unwritable_cache_costs_a_hash_and_nothing_else(folder, monkeypatch, tmp_path):
    (tmp_path / "blocker").write_text("a file where the cache folder would be")
    monkeypatch.setenv("MET_CACHE_DIR", str(tmp_path / "blocker" / "met"))
    digest = Counting()
    for _ in range(2):
        assert cached_digest(folder, files_of(folder), digest) == files_digest(files_of(folder))
    assert digest.calls == 2


def test_the_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("MET_CACHE_DIR", str(tmp_path / "m"))
    assert cache_dir() == tmp_path / "m"
    monkeypatch.delenv("MET_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache_dir() == tmp_path / "x" / "met"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    assert cache_dir() == tmp_path / "h" / ".cache" / "met"
    # a relative XDG_CACHE_HOME is ignored, as the XDG spec says (it was read from the working directory)
    monkeypatch.setenv("XDG_CACHE_HOME", "cache")
    assert cache_dir() == tmp_path / "h" / ".cache" / "met"


def test_no_home_costs_a_hash_and_nothing_else(folder, monkeypatch):
    # no $HOME and a uid without a passwd entry (Path.home() raises RuntimeError): hashed, no traceback
    monkeypatch.delenv("MET_CACHE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.setattr(os.path, "expanduser", lambda path: path)  # what it returns when the passwd lookup fails
    assert cache_dir() is None
    digest = Counting()
    for _ in range(2):
        assert cached_digest(folder, files_of(folder), digest) == files_digest(files_of(folder))
    assert digest.calls == 2
