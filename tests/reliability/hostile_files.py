"""Hostile files at every path met reads, and the readers that must refuse them: shared by the test and the benchmark.

`python3 hostile_files.py DIR` builds the files in DIR, runs every reader on every file in this
one process, and prints one JSON line per case: reader, file, outcome (the exit status the
command would end with, or "accepted"), the message, seconds, and how far the process's peak
memory rose (KiB) while that reader read every file. A reader that raises anything but its
documented refusal prints the exception's type as the outcome.
"""

import json
import os
import resource
import sys
import time
from pathlib import Path

DOTTED = "a" + ".a" * 100_000 + " = 1\n"  # a 200 KB key of 100,001 parts
NESTED = "a = " + "[" * 100_000 + "]" * 100_000 + "\n"  # arrays 100,000 deep
TABLES = "a = " + "{b = " * 50_000 + "1" + "}" * 50_000 + "\n"  # inline tables 50,000 deep
JSON_NESTED = "[" * 100_000 + "]" * 100_000


def build(folder: Path) -> dict[str, Path]:
    """The hostile files: name -> path."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {"fifo": folder / "fifo", "/dev/zero": Path("/dev/zero"), "link to /dev/zero": folder / "zero-link",
             "dotted-key bomb": folder / "dotted.toml", "nested arrays": folder / "nested.toml",
             "nested tables": folder / "tables.toml", "nested JSON": folder / "nested.json"}
    if not files["fifo"].exists():
        os.mkfifo(files["fifo"])
    if not files["link to /dev/zero"].is_symlink():
        files["link to /dev/zero"].symlink_to("/dev/zero")
    for name, text in (("dotted-key bomb", DOTTED), ("nested arrays", NESTED), ("nested tables", TABLES),
                       ("nested JSON", JSON_NESTED)):
        files[name].write_text(text)
    return files


def _at(folder: Path, name: str, target: Path) -> Path:
    """`folder/name` as a link to the hostile file (a checkpoint folder's config.json, a folder of prompts)."""
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / name
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target)
    return link


def readers(scratch: Path) -> dict:
    """reader name -> function(path) returning the exit status its command ends with and the message."""
    from typer import Typer
    from typer.testing import CliRunner

    from met.bench import calibrate
    from met.bench.measured_boot import BootError, load_calibration, load_table
    from met.bench.spec_cost_cli import spec_cost
    from met.bench.tables_cli import tables_app
    from met.engine.prompts import PromptError, read_jsonl_prompts
    from met.exit_codes import EX_DATAERR
    from met.model.errors import RecipeError
    from met.model.hf_config import read_hf_config
    from met.model.hf_tokenizer import HfTokenizer
    from met.model.weights import read_card
    from met.serve.auth import KeysFileError, read_keys_file

    runner = CliRunner()
    bench = Typer()
    bench.command()(spec_cost)

    def cli(app, *args: str):
        result = runner.invoke(app, list(args))
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception
        return result.exit_code, (result.stderr or result.stdout).strip()

    def caught(call, errors, code=EX_DATAERR):
        try:
            call()
        except errors as exc:
            return getattr(exc, "code", getattr(exc, "status", code)), str(exc)
        return "accepted", ""

    valid = scratch / "valid-table.toml"
    from table_mutations import valid_table
    valid.write_bytes(valid_table())
    return {
        "met tables check": lambda p: cli(tables_app, "check", "--no-key", str(p)),
        "met tables show": lambda p: cli(tables_app, "show", str(p)),
        "met tables show --calibration": lambda p: cli(tables_app, "show", str(valid), "--calibration", str(p)),
        "met serve: cost table": lambda p: caught(lambda: load_table(p), BootError),
        "met serve: calibration": lambda p: caught(lambda: load_calibration(p), BootError),
        "met serve: keys file": lambda p: caught(lambda: read_keys_file(p), KeysFileError),
        "checkpoint config.json": lambda p: caught(lambda: read_hf_config(_at(scratch / "ckpt", "config.json", p).parent),
                                                   RecipeError),
        "checkpoint tokenizer.json": lambda p: caught(lambda: HfTokenizer(p, ()), RecipeError),
        "model card": lambda p: caught(lambda: read_card(p), ValueError),
        "prompts file": lambda p: caught(lambda: read_jsonl_prompts(p), PromptError),
        "prompts folder": lambda p: caught(lambda: calibrate.read_prompts(_at(scratch / "prompts", "p.txt", p).parent,
                                                                          calibrate.QUICK_CALIBRATION), PromptError),
        "met bench spec-cost --out": lambda p: cli(bench, "--quick", "--no-calibrate", "--out", str(p)),
    }


def main(folder: Path) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    files = build(folder)
    table = readers(folder)
    for reader, read in table.items():
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for name, path in files.items():
            if reader == "met bench spec-cost --out" and name not in ("fifo", "/dev/zero", "link to /dev/zero"):
                continue  # a bomb at --out is a file that is no table: the case of read_existing, read above
            started = time.perf_counter()
            try:
                outcome, message = read(path)
            except Exception as exc:  # noqa: BLE001 - reported, and the test fails on it
                outcome, message = type(exc).__name__, str(exc)[:300]
            seconds = time.perf_counter() - started
            rise = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
            print(json.dumps({"reader": reader, "file": name, "outcome": outcome, "message": message[:400],
                              "seconds": round(seconds, 3), "peak_rise_kib": rise}), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
