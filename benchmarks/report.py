"""How every benchmark script ends: its markdown report printed and, with --out, written (the folder made)."""

from pathlib import Path


def publish(lines: list[str], out: Path | None) -> int:
    """Print the report (lines joined, newline-ended), write it to `out` if given; 0, the script's exit status."""
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    return 0
