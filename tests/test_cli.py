"""The CLI wiring: help, version, the sub-apps it exposes, and output that cannot be written."""

import subprocess
import sys
from pathlib import Path

import pytest
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
