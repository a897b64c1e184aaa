"""Running the app under uvicorn: on loopback by default; SIGTERM (or Ctrl-C) drains in-flight requests and exits 0.

On SIGTERM uvicorn stops accepting connections, waits for the open ones (streams included) to
finish, then runs the app's lifespan shutdown, which drains the scheduler. Uvicorn then
re-raises the signal it caught to the handler that was installed before it; `run` installs one
that only records the signal, so the process ends with status 0 instead of dying by the signal.
A second Ctrl-C during the drain ends every request in flight with a 503 (a stream with an
error chunk and [DONE]), then shuts down as before and exits 130; a third quits at once
(uvicorn's force exit: connections are cut), also 130.
"""

import asyncio
import errno
import logging
import signal
import socket
import threading
from collections.abc import Callable

import uvicorn
from fastapi import FastAPI

from met.exit_codes import EX_INTERRUPTED

log = logging.getLogger("uvicorn.error")  # uvicorn's own lines go there: ours read beside them

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")  # uvicorn's; any other is a KeyError in it
# what to do about the bind errors an operator can fix; others are reported with the OS's words
BIND_HINTS = {errno.EADDRINUSE: "the address is already in use; stop what listens there or pass another --port",
              errno.EADDRNOTAVAIL: "not an address of this machine; pass --host 127.0.0.1, 0.0.0.0 or one of its own",
              errno.EACCES: "permission denied; pass a --port above 1023 or run with the privilege to bind it"}


class BindError(Exception):
    """The server cannot listen on host:port; the message names both and what to do."""


def check_bind(host: str, port: int) -> None:
    """Bind (and release) every address host:port resolves to, as uvicorn's asyncio server will; BindError if one fails.

    A port held by another server, a host that does not resolve or is not this machine's fail
    here in milliseconds, before the model loads, instead of in uvicorn after it.
    """
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        raise BindError(f"cannot listen on {where}: the host does not resolve ({exc}); pass --host 127.0.0.1, "
                        "0.0.0.0 or an address of this machine") from None
    for family, kind, proto, _, address in dict.fromkeys(infos):
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio's create_server
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                why = BIND_HINTS.get(exc.errno, exc.strerror or str(exc))
                raise BindError(f"cannot listen on {where}: {why}") from None


class DrainingServer(uvicorn.Server):
    """uvicorn's server, but a second Ctrl-C during the drain ends the requests in flight instead of cutting them."""

    def __init__(self, config: uvicorn.Config, abort: Callable[[], int] | None) -> None:
        super().__init__(config)
        self.abort = abort  # ends every request in flight, on the event loop; returns how many
        self.aborted = False
        self.loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame) -> None:
        if (sig == signal.SIGINT and self.should_exit and not self.aborted and self.abort is not None
                and self.loop is not None):
            self.aborted = True
            self.loop.call_soon_threadsafe(self._abort)
            return
        super().handle_exit(sig, frame)

    def _abort(self) -> None:
        log.warning("Interrupted during the drain: ended %d requests in flight with a 503 "
                    "(Ctrl-C again to quit at once)", self.abort())


def run(app: FastAPI, host: str, port: int, log_level: str = "info",
        on_started: Callable[[uvicorn.Server], None] | None = None) -> int:
    """Serve until SIGTERM/SIGINT, drain, and return the exit status (0; 130 if a second Ctrl-C cut the drain short).

    BindError if uvicorn cannot listen.
    """
    server = DrainingServer(uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                                           timeout_graceful_shutdown=None), getattr(app.state, "abort", None))
    caught: list[int] = []
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, lambda signum, frame: caught.append(signum))
    if on_started is not None:
        threading.Thread(target=_when_started, args=(server, on_started), daemon=True).start()
    try:
        server.run()
    except SystemExit:
        if not server.started:  # uvicorn exits 3 when it cannot bind: say why, as check_bind would have
            check_bind(host, port)
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if server.aborted or server.force_exit:
        return EX_INTERRUPTED
    return 0 if server.started else 1


def _when_started(server: uvicorn.Server, callback: Callable[[uvicorn.Server], None]) -> None:
    while not server.started and not server.should_exit:
        threading.Event().wait(0.05)
    if server.started:
        callback(server)


def bound_port(server: uvicorn.Server) -> int:
    """The port a started server listens on (what port 0 became)."""
    return server.servers[0].sockets[0].getsockname()[1]
