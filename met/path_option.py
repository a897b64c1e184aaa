"""path_option: the parsers of every option and argument that names a file or folder; an empty one is refused.

typer reads `--out-dir ''` (an unset shell variable, say) as Path(""), which is Path("."): the
command would read or write the current folder. A parser sees the text before that, so each such
option passes `parser=nonempty_path` (--model: `parser=nonempty_model`), and click answers '' with
its usage error, exit 2 and `Error: Invalid value for '--out-dir': ...`, before the command starts.
"""

from pathlib import Path

import typer


def nonempty_path(value: str | Path) -> Path:
    """The Path an option names (its default arrives as a Path already); BadParameter (exit 2) for ''."""
    if value == "":
        raise typer.BadParameter("is empty; pass a path ('.' for the current folder)")
    return Path(value)


def nonempty_model(value: str) -> str:
    """--model's value, an embedded recipe's name or a checkpoint folder; BadParameter (exit 2) for ''."""
    if value == "":
        raise typer.BadParameter("is empty; pass an embedded recipe's name or a checkpoint folder "
                                 "('.' for the current folder)")
    return value
