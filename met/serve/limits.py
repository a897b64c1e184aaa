"""What one client can hold of a serve: connections, time on a connection, bytes of bodies, and log lines.

uvicorn (with h11) gives the keep-alive timeout (`timeout_keep_alive`: an idle connection
between requests is closed) and the size of a request head (`h11_max_incomplete_event_size`);
it has no timeout on reading a request's head or body, none on a client that stops reading its
answers, and its `limit_concurrency` counts idle connections alongside requests (1,000 slow
connections would answer /health with 503) and answers in plain text. So this module adds, in
a small subclass of uvicorn's h11 protocol (BoundedH11Protocol) and an ASGI layer (BodyBudget):
- a head deadline: a request's line and headers must arrive within HEAD_TIMEOUT_S of the
  connection opening or of the previous answer, however slowly the bytes trickle (slowloris);
- a body deadline: a body must arrive within BODY_TIMEOUT_S of its head;
- a write stall limit: a client that reads nothing of its answers for WRITE_STALL_S is cut;
- a cap on open connections (Limits.connections): past it, a new connection displaces the one
  that has waited longest without a request in flight (idle or still sending its head), so a
  probe always gets in; with every connection busy it is answered 429 and closed;
- a cap on bytes of request bodies in flight (Limits.body_bytes): a request whose body would
  pass it is answered 429 (Retry-After: 1) before its body is read;
  429 as OpenAI answers a client it cannot serve now (its clients retry it), not a 5xx: the
  server is well, the client is asked to come back;
- OpenAI-shaped errors for what the protocol refuses itself (431 for a head over the size
  limit, 400 for a malformed one) instead of uvicorn's plain text;
- RateLimitedLog: each cause of a log line (a logger and its message template; for the access
  log, the status) writes at most LOG_BURST lines per LOG_WINDOW_S, then one line saying how
  many were suppressed.
"""

import asyncio
import json
import logging
import time
from dataclasses import dataclass

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from met.serve.errors import error_body

HEAD_TIMEOUT_S = 10.0  # a request line and headers, from the connection's start or the previous answer
BODY_TIMEOUT_S = 60.0  # a request body, from its head (4 MiB at 70 KB/s)
WRITE_STALL_S = 30.0  # a client that reads nothing of its answer for this long is cut
KEEP_ALIVE_S = 5  # an idle connection between requests (uvicorn's timeout_keep_alive)
HEAD_BYTES = 64 << 10  # most bytes of one request head (h11_max_incomplete_event_size)
LOG_BURST, LOG_WINDOW_S = 20, 10.0


@dataclass(frozen=True, slots=True)
class Limits:
    """The serve's caps: open connections and bytes of request bodies in flight."""

    connections: int = 1024
    body_bytes: int = 64 << 20  # 16 of the largest bodies the API reads (4 MiB) at once

    def __post_init__(self) -> None:
        if self.connections < 1 or self.body_bytes < 1:
            raise ValueError(f"limits must be at least 1, got {self.connections} connections, "
                             f"{self.body_bytes} body bytes")


def refusal(status: int, message: str, code: str) -> bytes:
    """An OpenAI error body; a 429's type is OpenAI's own for it ("requests")."""
    doc = error_body(status, message, code)
    if status == 429:
        doc["error"]["type"] = "requests"
    return json.dumps(doc).encode()


def error_response(status: int, message: str, code: str) -> bytes:
    """A whole HTTP/1.1 response that closes the connection, its body an OpenAI error."""
    body = refusal(status, message, code)
    reason = {400: b"Bad Request", 429: b"Too Many Requests", 431: b"Request Header Fields Too Large"}[status]
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nretry-after: 1\r\n"
            b"connection: close\r\n\r\n" % (status, reason, len(body)) + body)


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the deadlines, the connection cap and JSON refusals above."""

    limits = Limits()  # set per serve by server.run (a class attribute: uvicorn builds the protocol itself)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None  # head or body deadline, whichever is running
        self._stall: asyncio.TimerHandle | None = None
        self._error_hint = 400
        self.waiting_since = time.monotonic()  # since when no request has been in flight (for eviction)
        next_event = self.conn.next_event

        def watched():  # the head's end cancels its deadline; a protocol error remembers its status
            try:
                event = next_event()
            except h11.RemoteProtocolError as exc:
                self._error_hint = exc.error_status_hint
                raise
            if isinstance(event, h11.Request):
                self._arm(BODY_TIMEOUT_S if _has_body(event) else None)
            elif isinstance(event, h11.EndOfMessage):
                self._arm(None)
            return event

        self.conn.next_event = watched

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.connections and not self._evict():
            transport.write(error_response(429, f"the server holds its most connections "
                                           f"({self.limits.connections}), all with requests in flight; retry "
                                           "later", "too_many_connections"))
            transport.close()
            return
        self._arm(HEAD_TIMEOUT_S)

    def _evict(self) -> bool:
        """Close the connection waiting longest with no request in flight (not this one); False if there is none."""
        idle = [c for c in self.connections if c is not self and isinstance(c, BoundedH11Protocol)
                and (c.cycle is None or c.cycle.response_complete) and not c.transport.is_closing()]
        if not idle:
            return False
        min(idle, key=lambda c: c.waiting_since).transport.abort()
        return True

    def _arm(self, seconds: float | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = None if seconds is None else self.loop.call_later(seconds, self._late)

    def _late(self) -> None:
        """The head or body did not arrive in time: close (the app, if reading a body, sees a disconnect)."""
        self._deadline = None
        if not self.transport.is_closing():
            self.transport.close()

    def on_response_complete(self) -> None:
        self.waiting_since = time.monotonic()
        if not self.transport.is_closing():
            self._arm(HEAD_TIMEOUT_S)  # the next request's head; the keep-alive timer closes an idle one sooner
        super().on_response_complete()  # may read a pipelined request's head at once, which disarms it

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._deadline, self._stall):
            if timer is not None:
                timer.cancel()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stall is None:
            self._stall = self.loop.call_later(WRITE_STALL_S, self.transport.abort)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None

    def send_400_response(self, msg: str) -> None:
        if self._error_hint == 431:
            message = (f"the request's line and headers are more than the {HEAD_BYTES} bytes this server reads; "
                       "send fewer or shorter headers")
            self.transport.write(error_response(431, message, "headers_too_large"))
        else:
            self.transport.write(error_response(400, "the request is not valid HTTP/1.1", "invalid_http"))
        self.transport.close()


def _has_body(request: h11.Request) -> bool:
    for name, value in request.headers:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() not in (b"", b"0")):
            return True
    return False


class BodyBudget:
    """ASGI layer: a request whose body would pass the bytes of bodies in flight is answered 429, unread.

    A body reserves its Content-Length (one without, `largest`) from its head until its last
    chunk is read; a Content-Length above `largest` reserves nothing (the app answers 413 unread).
    """

    def __init__(self, app, budget: int, largest: int) -> None:
        self.app, self.budget, self.largest = app, budget, largest
        self.held = 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        size = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        want = int(size) if size is not None and size.isdigit() else self.largest
        want = 0 if want > self.largest else want
        if want and self.held + want > self.budget:
            body = refusal(429, f"the server is reading {self.held} bytes of request bodies, near its limit of "
                           f"{self.budget}; retry shortly", "rate_limit_exceeded")
            await send({"type": "http.response.start", "status": 429,
                        "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
                                    (b"retry-after", b"1")]})  # the body is read and dropped: no reset
            await send({"type": "http.response.body", "body": body})
            return
        self.held += want
        reserved = want

        async def counted():
            nonlocal reserved
            message = await receive()
            if reserved and (message["type"] != "http.request" or not message.get("more_body", False)):
                self.held -= reserved
                reserved = 0
            return message

        try:
            await self.app(scope, counted, send)
        finally:
            self.held -= reserved


class RateLimitedLog(logging.Filter):
    """Each cause logs at most LOG_BURST lines per LOG_WINDOW_S; the next line after says how many were dropped."""

    def __init__(self) -> None:
        super().__init__()
        self.windows: dict[tuple, list] = {}  # cause -> [window start, lines in it, suppressed]

    def filter(self, record: logging.LogRecord) -> bool:
        cause = (record.name, record.levelno, str(record.msg))
        if record.name == "uvicorn.access" and isinstance(record.args, tuple) and record.args:
            cause += (record.args[-1],)  # per status: a flood of 404s does not hide the 200s
        now = time.monotonic()
        window = self.windows.get(cause)
        if window is None or now - window[0] >= LOG_WINDOW_S:
            dropped = window[2] if window else 0
            if len(self.windows) > 1024:  # causes are few; never let them grow without end
                self.windows.clear()
            self.windows[cause] = [now, 1, 0]
            if dropped:
                record.msg = f"{record.msg} ({dropped} more lines like this were suppressed)"
            return True
        if window[1] < LOG_BURST:
            window[1] += 1
            return True
        window[2] += 1
        return False


def rate_limit_logs() -> None:
    """Put one RateLimitedLog on uvicorn's and asyncio's loggers (where accept() errors are logged)."""
    limit = RateLimitedLog()
    for name in ("uvicorn.error", "uvicorn.access", "asyncio"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RateLimitedLog) for f in logger.filters):
            logger.addFilter(limit)
