"""The progress reporter (met.bench.progress): plain lines in a log, a bar on a terminal, silence when quiet."""

import io

from met.bench.progress import Reporter


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_plain_lines_when_not_a_terminal():
    # a phase's first step, and its last, always get a line; steps in between are rate-limited
    stream = io.StringIO()
    with Reporter(stream=stream) as r:
        r.say("energy source: none")
        for done in range(1, 4):
            r.step("sweep", done, 3, f"n=1 k={done}")
    assert stream.getvalue() == "energy source: none\nsweep: 1/3 n=1 k=1\nsweep: 3/3 n=1 k=3\n"


def test_quiet_prints_nothing():
    stream = Terminal()
    with Reporter(quiet=True, stream=stream) as r:
        r.say("hello")
        r.step("sweep", 1, 1)
    assert stream.getvalue() == ""


def test_a_terminal_gets_a_bar():
    stream = Terminal()
    with Reporter(stream=stream) as r:
        r.step("sweep", 2, 4, "n=2 k=0 verify")
    assert r.rich and "2/4" in stream.getvalue() and "sweep" in stream.getvalue()
