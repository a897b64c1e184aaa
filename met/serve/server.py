"""Running the app under uvicorn: on loopback by default; SIGTERM (or Ctrl-C) drains in-flight requests and exits 0.

On SIGTERM uvicorn stops accepting connections, waits for the open ones (streams included) to
finish, then runs the app's lifespan shutdown, which drains the scheduler. Uvicorn then
re-raises the signal it caught to the handler that was installed before it; `run` installs one
that only records the signal, so the process ends with status 0 instead of dying by the signal.
"""

import signal
import threading
from collections.abc import Callable

import uvicorn
from fastapi import FastAPI


def run(app: FastAPI, host: str, port: int, log_level: str = "info",
        on_started: Callable[[uvicorn.Server], None] | None = None) -> int:
    """Serve until SIGTERM/SIGINT, drain, and return the exit status (0)."""
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                                           timeout_graceful_shutdown=None))
    caught: list[int] = []
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, lambda signum, frame: caught.append(signum))
    if on_started is not None:
        threading.Thread(target=_when_started, args=(server, on_started), daemon=True).start()
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0 if server.started else 1


def _when_started(server: uvicorn.Server, callback: Callable[[uvicorn.Server], None]) -> None:
    while not server.started and not server.should_exit:
        threading.Event().wait(0.05)
    if server.started:
        callback(server)


def bound_port(server: uvicorn.Server) -> int:
    """The port a started server listens on (what port 0 became)."""
    return server.servers[0].sockets[0].getsockname()[1]
