"""The CLI wiring: help, version, and the sub-apps it exposes."""

from typer.testing import CliRunner

from met import __version__
from met.cli import app

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
