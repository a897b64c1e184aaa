"""The CLI wiring: help, version, the sub-apps it exposes, and output that cannot be written."""

import functools
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from met import __version__
from met.cli import app
from met.exit_codes import EX_IOERR

runner = CliRunner()


def test_version_prints_package_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"met {__version__}"


def test_help_lists_every_sub_app():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for name in ("bench", "tables", "model", "generate", "serve", "top"):
        assert name in result.stdout


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("args", [["--help"], ["model", "info"], ["tables", "check", "--no-key", "tables"]])
def test_output_on_a_full_disk_is_exit_74_in_one_line(args):
    # stdout on a full disk (a cron log): one line on stderr and EX_IOERR, not a traceback and exit 1
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-c", "from met.cli import main; main()", *args], stdout=full,
                              stderr=subprocess.PIPE, text=True, cwd=Path(__file__).parent.parent, timeout=120)
    assert done.returncode == EX_IOERR
    assert done.stderr == "error: cannot write the output: No space left on device\n"


def _commands(group, words: tuple[str, ...] = ()):
    """Every command of met's click tree with the words that name it, (("tables", "check"), command), ..."""
    for name, command in getattr(group, "commands", {}).items():
        if getattr(command, "commands", None):
            yield from _commands(command, words + (name,))
        else:
            yield words + (name,), command


def _names_a_path(hint) -> bool:
    """Whether an Annotated parameter's type is Path or holds it (Path | None)."""
    kind = typing.get_args(hint)[0]
    return kind is Path or Path in typing.get_args(kind)


# (command words, its function, the parameter): every option and argument naming a file or folder, and --model
PATH_PARAMS = [(words, command.callback, param) for words, command in _commands(typer.main.get_command(app))
               for hints in [typing.get_type_hints(command.callback, include_extras=True)]
               for param in command.params if _names_a_path(hints[param.name]) or "--model" in param.opts]


def test_the_path_audit_sees_every_command():
    found = {(" ".join(words), param.opts[0]) for words, _, param in PATH_PARAMS}
    assert {("model train", "--out-dir"), ("tables check", "path"), ("serve", "--api-keys-file"),
            ("bench spec-cost", "--out"), ("generate", "--model")} <= found and len(found) >= 20


@pytest.mark.parametrize("words, function, param", PATH_PARAMS,
                         ids=[f"{' '.join(w)} {p.opts[0]}" for w, _, p in PATH_PARAMS])
def test_an_empty_path_is_exit_2_naming_the_option_before_the_command_runs(words, function, param):
    # typer reads '' as Path('.'): `met model train --out-dir ''` (an unset variable) wrote into the current
    # folder. A stub with the command's signature stands in for it: only the parse runs, as it does in met
    calls = []

    @functools.wraps(function)
    def stub(**kwargs):
        calls.append(kwargs)

    one = typer.Typer(rich_markup_mode=None, pretty_exceptions_enable=False)
    one.command()(stub)
    arguments = ["x" for p in typer.main.get_command(one).params if p.param_type_name == "argument"]

    def run(value: str):
        return CliRunner().invoke(one, [value] if param.param_type_name == "argument" else
                                  [*arguments, param.opts[0], value])

    result = run("")
    lines = [line for line in result.output.splitlines() if "is empty" in line]
    assert result.exit_code == 2 and not calls, result.output
    assert len(lines) == 1 and f"Invalid value for '{param.opts[0]}'" in lines[0]
    result = run("a/b")  # a value is still what the command reads: a Path for a path, the text for --model
    assert result.exit_code == 0 and calls[0][param.name] == (Path("a/b") if "--model" not in param.opts else "a/b")


HEAVY = ("torch", "fastapi", "matplotlib")
SHIPPED = str(Path(__file__).parents[1] / "tables" / "cpu-amd-epyc-1t" / "met-tiny-py.toml")
# Runs the command line in a fresh interpreter and prints which heavy modules it imported.
IMPORTS = """
import sys
from met.cli import app
try:
    app(sys.argv[1:], prog_name="met")
except SystemExit as exc:
    status = exc.code
print(sorted(m for m in {heavy} if m in sys.modules), status)
"""


@pytest.mark.parametrize("args, allowed", [
    (["--help"], ()),
    (["bench", "--help"], ()),
    (["serve", "--help"], ()),
    (["tables", "check", "--help"], ()),
    (["tables", "check", "--no-key", SHIPPED], ()),
    (["tables", "check", "--box-class", "cpu-amd-epyc-1t", SHIPPED], ("torch",)),  # the key holds torch's version
])
def test_met_starts_without_importing_torch_fastapi_or_matplotlib(args, allowed):
    # `met --help` took 2-3 s importing all three for every command; each command now imports what it uses
    run = subprocess.run([sys.executable, "-c", IMPORTS.format(heavy=HEAVY), *args], capture_output=True, text=True,
                         timeout=120)
    imported, status = run.stdout.strip().splitlines()[-1].rsplit(" ", 1)
    assert status in ("0", "78"), run.stderr  # 78: this box's plan digests need not match the shipped table's
    assert [m for m in eval(imported) if m not in allowed] == [], run.stderr


def _interrupt(tmp_path: Path, args: list[str], delay: float) -> subprocess.CompletedProcess:
    """`met ARGS` sent SIGINT `delay` seconds after met's own code starts; its status and output."""
    import signal
    import time

    code = "import sys; sys.stderr.write('started\\n'); sys.stderr.flush(); from met.cli import main; main()"
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp_path)
    assert proc.stderr.readline() == "started\n"
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.05, 0.5, 1.0, 2.0])
@pytest.mark.parametrize("command", ["bench", "serve"])
def test_ctrl_c_while_met_starts_exits_130_in_one_line(tmp_path, command, delay):
    # in the first seconds a command is still importing torch: Ctrl-C there printed a traceback
    # a full sweep, minutes long: the signal comes while it runs (a --quick one may be done in 2 s)
    args = (["bench", "spec-cost", "--quiet", "--energy", "none", "--out", str(tmp_path / "t.toml")]
            if command == "bench" else ["serve", "--port", "0"])
    run = _interrupt(tmp_path, args, delay)
    assert "Traceback" not in run.stderr, run.stderr
    if run.returncode == 0 and "Uvicorn running" in run.stderr:  # a serve already listening drains and exits 0
        return
    assert run.returncode == 130, run.stderr
    lines = run.stderr.splitlines()
    # one line for the interruption; a serve past loading has printed its banner before it
    assert "interrupted" in lines[-1] and sum("interrupted" in line for line in lines) == 1, run.stderr
    assert len(lines) == 1 or command == "serve" and lines[0].startswith("met serve:"), run.stderr
