"""Running the app under uvicorn: on loopback by default; SIGTERM (or Ctrl-C) drains, within a stated time, and exits 0.

uvicorn with its h11 protocol, subclassed in met.serve.limits (head and body deadlines, a cap
on connections, JSON refusals), and the BodyBudget layer around the app; its own
timeout_keep_alive and h11_max_incomplete_event_size are used as they are (limits.py says why
its limit_concurrency is not).

The drain (DrainingServer.shutdown replaces uvicorn's, whose wait for open connections has no
end while a client does not read): on SIGTERM the server stops accepting, closes idle
connections and those still sending a request, and cuts those that read none of their answers
(nothing more can reach them). Requests in flight get until `drain_s` less ABORT_GRACE_S to
finish; those still running then are ended as a second Ctrl-C ends them (a 503, or in a stream
an error chunk with code `shutting_down`, then [DONE]), ABORT_GRACE_S is left for those last
chunks to be written, and whatever is still open is cut. The app's lifespan shutdown then drains
the scheduler. uvicorn re-raises the signal it caught to the handler installed before it; `run`
installs one that only records the signal, so the process ends with status 0, within `drain_s`
(and the few seconds the scheduler's stop takes), whatever the clients do. A second Ctrl-C
during the drain ends every request in flight at once and exits 130; a third quits at once
(uvicorn's force exit: connections are cut), also 130.
"""

import asyncio
import errno
import logging
import resource
import signal
import socket
import threading
from collections.abc import Callable

import uvicorn
from fastapi import FastAPI

from met.exit_codes import EX_INTERRUPTED
from met.serve.app import MAX_BODY_BYTES
from met.serve.limits import HEAD_BYTES, KEEP_ALIVE_S, BodyBudget, BoundedH11Protocol, Limits, rate_limit_logs

DRAIN_S = 30.0  # the longest a drain takes, from SIGTERM to the scheduler's stop
ABORT_GRACE_S = 2.0  # of it, what is left for requests ended at its end to write their last chunk

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
    """uvicorn's server with a drain that ends in `drain_s`; a second Ctrl-C during it ends the requests in flight."""

    def __init__(self, config: uvicorn.Config, abort: Callable[..., int] | None, drain_s: float = DRAIN_S) -> None:
        super().__init__(config)
        self.abort = abort  # ends every request in flight, on the event loop; returns how many
        self.drain_s = drain_s
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

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.drain_s
        log.info("Shutting down: draining for at most %g s", self.drain_s)
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        state = self.server_state
        for conn in list(state.connections):
            conn.shutdown()  # idle ones, and those still sending a request, close now; busy ones after their answer
            if getattr(conn, "flow", None) is not None and conn.flow.write_paused:
                conn.transport.abort()  # it reads nothing: no answer can reach it
        await self._until_idle(deadline - ABORT_GRACE_S)
        if state.tasks and self.abort is not None and not self.aborted and not self.force_exit:
            log.warning("The drain time (%g s) ran out: ending %d requests in flight (shutting_down)",
                        self.drain_s, self.abort(f"its drain time of {self.drain_s:g} s ran out"))
            await self._until_idle(deadline)
        if state.connections or state.tasks:
            log.warning("Cutting %d connections still open at the end of the drain", len(state.connections))
        for conn in list(state.connections):
            conn.transport.abort()
        for task in list(state.tasks):
            task.cancel()
        await asyncio.sleep(0.05)
        if not self.force_exit:
            try:  # the scheduler's stop: its requests have ended above, so it has nothing left to run
                await asyncio.wait_for(self.lifespan.shutdown(), max(5.0, deadline - loop.time()))
            except TimeoutError:
                log.error("The scheduler did not stop within the drain; exiting without it")

    async def _until_idle(self, until: float) -> None:
        loop = asyncio.get_running_loop()
        state = self.server_state
        while (state.tasks or state.connections) and not self.force_exit and loop.time() < until:
            await asyncio.sleep(0.05)


def run(app: FastAPI, host: str, port: int, log_level: str = "info",
        on_started: Callable[[uvicorn.Server], None] | None = None, drain_s: float = DRAIN_S,
        limits: Limits = Limits()) -> int:
    """Serve until SIGTERM/SIGINT, drain (within drain_s), and return the exit status (0; 130 if a second Ctrl-C
    cut the drain short).

    BindError if uvicorn cannot listen.
    """
    limits = _fit_open_files(limits)
    BoundedH11Protocol.limits = limits
    abort = getattr(app.state, "abort", None)
    config = uvicorn.Config(BodyBudget(app, limits.body_bytes, MAX_BODY_BYTES), host=host, port=port,
                            log_level=log_level, lifespan="on", http=BoundedH11Protocol,
                            timeout_keep_alive=KEEP_ALIVE_S, h11_max_incomplete_event_size=HEAD_BYTES,
                            timeout_graceful_shutdown=None)
    rate_limit_logs()
    server = DrainingServer(config, abort, drain_s)
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


def _fit_open_files(limits: Limits) -> Limits:
    """Raise the open-file limit toward the connection cap (and what the serve itself holds), else lower the cap.

    Past the limit accept() fails, asyncio stops accepting for a second and logs each failure:
    the cap must be reached first.
    """
    reserve = 256  # the model's files, the loop, the log, threads' pipes
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = limits.connections + reserve
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < want:
        fitted = max(1, soft - reserve)
        log.warning("The open-file limit is %d: serving at most %d connections, not %d", soft, fitted,
                    limits.connections)
        return Limits(fitted, limits.body_bytes)
    return limits


def _when_started(server: uvicorn.Server, callback: Callable[[uvicorn.Server], None]) -> None:
    while not server.started and not server.should_exit:
        threading.Event().wait(0.05)
    if server.started:
        callback(server)


def bound_port(server: uvicorn.Server) -> int:
    """The port a started server listens on (what port 0 became)."""
    return server.servers[0].sockets[0].getsockname()[1]
