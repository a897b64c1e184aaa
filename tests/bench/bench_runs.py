"""`met bench spec-cost` runs to kill: a fork server that starts them fast, and an inotify watch of their folder.

Each run is a real process running the command end to end (lock, meter, micro recipe, sweep,
calibration, atomic writes); the fork server imports torch and met once, so a run starts in
milliseconds instead of the seconds an import takes, and a test can kill dozens of runs. The
watch (Linux inotify through ctypes) reports the files the runs create and rename in the table's
folder as they happen, so a test can kill a run at the moment it writes, with no hook in the
command: it observes the file system from outside, as an operator would.
"""

import ctypes
import json
import os
import select
import struct
import subprocess
import sys
import time
from pathlib import Path

# The fork server: imports once, then for each line `[argv, stderr path]` on stdin forks a run and
# prints its pid; a line `wait PID` waits for that run and prints its exit status (-9: killed).
SERVER = r"""
import json, os, sys
from pathlib import Path
import torch
torch.set_num_threads(1)
import met.bench.calibrate, met.bench.loop_sweep, met.bench.progress, met.bench.sweep  # what a run imports
import met.model.recipes as recipes
from met.cli import app
from met.model.config import ModelConfig
from met.model.recipes import Recipe
weights, digest = sys.argv[1], sys.argv[2]
recipe = Recipe("micro-random", ModelConfig.from_name("micro"), Path(weights), digest, {})
recipes.embedded = lambda name: recipe
print("ready", flush=True)
for line in sys.stdin:
    if line.startswith("wait "):
        _, status = os.waitpid(int(line.split()[1]), 0)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        print(code, flush=True)
        continue
    argv, err = json.loads(line)
    pid = os.fork()
    if pid == 0:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 2)
        code = 70
        try:
            app(argv, prog_name="met")
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        finally:
            os._exit(code)
    print(pid, flush=True)
"""


class ForkServer:
    """Starts `met bench spec-cost` runs (as `met ARGV`) in processes forked from one warm interpreter."""

    def __init__(self, weights: Path, digest: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, str(weights), digest], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready", "the fork server did not start"

    def start(self, argv: list[str], stderr: Path) -> int:
        """Fork a run; its pid (stdout is discarded, stderr goes to the file)."""
        self.proc.stdin.write(json.dumps([argv, str(stderr)]) + "\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def wait(self, pid: int) -> int:
        """The run's exit status, once it has ended (-9 when it was killed with SIGKILL)."""
        self.proc.stdin.write(f"wait {pid}\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def close(self) -> None:
        """Stop the server (its runs have all been waited for)."""
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


IN_CREATE, IN_MOVED_TO, IN_CLOSE_WRITE = 0x100, 0x80, 0x8
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len: then len bytes of name


class FolderWatch:
    """inotify on one folder: (event, file name) for every file created, renamed into it, or closed after writing."""

    def __init__(self, folder: Path) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0 or libc.inotify_add_watch(self.fd, str(folder).encode(),
                                                 IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE) < 0:
            raise OSError(ctypes.get_errno(), "inotify is not available")
        self.seen: list[tuple[str, str]] = []

    def poll(self, timeout: float) -> list[tuple[str, str]]:
        """Events that arrive within `timeout` seconds (returns as soon as some have); also kept in `seen`."""
        if not select.select([self.fd], [], [], timeout)[0]:
            return []
        data, events = os.read(self.fd, 1 << 16), []
        at = 0
        while at < len(data):
            _, mask, _, size = _EVENT.unpack_from(data, at)
            name = data[at + _EVENT.size: at + _EVENT.size + size].rstrip(b"\0").decode()
            at += _EVENT.size + size
            kind = "moved" if mask & IN_MOVED_TO else "created" if mask & IN_CREATE else "written"
            events.append((kind, name))
        self.seen += events
        return events

    def drain(self) -> list[tuple[str, str]]:
        """Every event not read yet (after a run has died, what it did before it died)."""
        events = []
        while batch := self.poll(0):
            events += batch
        return events

    def wait_for(self, match, deadline: float) -> tuple[str, str] | None:
        """The first event for which match(event) holds, or None if the deadline (monotonic) passes first."""
        while (left := deadline - time.monotonic()) > 0:
            for event in self.poll(left):
                if match(event):
                    return event
        return None

    def close(self) -> None:
        os.close(self.fd)
