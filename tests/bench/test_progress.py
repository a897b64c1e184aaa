"""The progress reporter (met.bench.progress): plain lines in a log, a bar on a terminal, silence when quiet."""

import io
import sys
from unittest import mock

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


class Full(io.StringIO):
    """A log on a full disk: every write fails."""

    def write(self, text: str) -> int:
        raise OSError(28, "No space left on device")


def test_a_stream_that_cannot_be_written_stops_the_news_not_the_run():
    # a log on a full disk, and no stderr at all (a process started with 2>&-): no exception
    with Reporter(stream=Full()) as r:
        r.say("energy source: none")
        r.step("sweep", 1, 1)
    with mock.patch.object(sys, "stderr", None), Reporter() as r:  # sys.stderr is None under 2>&-
        r.say("energy source: none")
        r.step("sweep", 1, 1)
    assert not r.rich
