"""OpenAI-compatible HTTP API: /v1/completions (plain and SSE), /v1/models[/{model}], /v1/snapshot, /health, /metrics.

Requests are checked in this order, each refusal an OpenAI-shaped error that touches nothing
else: API key (401, before the body is read), body size (413), JSON (400), fields (422), model
(404), token ids outside the model's vocabulary (422), prompt longer than the context, or prompt + max_tokens
(400 context_length_exceeded, as OpenAI's, which clients look for).
Only then is the request queued for the scheduler. A client that disconnects, mid-stream or
while waiting for a plain response, has its request cancelled, which frees its slot; one that
disconnects while its body is read never reaches the scheduler (499 in /metrics, as the others).
"""

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request as HttpRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from met.engine.policy import PolicyConfig, build_policy
from met.engine.requests import Delta, Event, Failed, Finished, Request
from met.engine.runner import ModelRunner, Sampling
from met.engine.scheduler import Draining, Scheduler
from met.model.dflash import DflashDrafter
from met.model.tokenizer import BYTES, Tokenizer
from met.model.transformer import Transformer
from met.serve import schemas
from met.serve.auth import DEFAULT_TENANT, AuthLayer, KeyRing
from met.serve.errors import ApiError, error_body
from met.serve.metrics import ServeMetrics, StatusLayer
from met.serve.report import snapshot_doc
from met.speculative.spec_cost import SpecCostState

MAX_BODY_BYTES = 4 << 20  # far above any prompt a context holds; refuses a runaway upload early
DISCONNECT_POLL_S = 0.5  # how often a plain (non-streamed) request checks that its client is still there


@dataclass(slots=True)
class Service:
    """What the API serves: the scheduler, the model names it answers to, the keys."""

    scheduler: Scheduler
    model_names: tuple[str, ...]  # the first is the id /v1/models lists; the rest are accepted aliases
    keys: KeyRing = field(default_factory=lambda: KeyRing({}))
    created: int = field(default_factory=lambda: int(time.time()))
    tokenizer: Tokenizer = BYTES  # encodes text prompts; the scheduler's, which decodes the completions
    open: dict[str, "LoopSink"] = field(default_factory=dict)  # requests in flight (queued or running) by id

    @classmethod
    def build(cls, model: Transformer, model_id: str, names: tuple[str, ...], policy: PolicyConfig,
              max_batch: int, max_len: int | None = None, cost_state: SpecCostState | None = None,
              keys: KeyRing | None = None, tokenizer: Tokenizer = BYTES,
              dflash: DflashDrafter | None = None) -> "Service":
        """A runner for the model (and its DFlash drafter), the policy the flags compose, and a scheduler over them.

        The scheduler is not started yet.
        """
        runner = ModelRunner(model, max_batch, max_len, dflash=dflash)
        num_drafts = model.cfg.mtp_depth if model.mtp is not None else 0
        built = build_policy(policy, num_drafts, cost_state, dflash_block=dflash.block if dflash is not None else None)
        scheduler = Scheduler(runner, built, model_id, tokenizer=tokenizer)
        return cls(scheduler, names, keys if keys is not None else KeyRing({}), tokenizer=tokenizer)

    def check_model(self, name: str) -> None:
        """ApiError 404 unless the name is one this server answers to."""
        if name not in self.model_names:
            raise ApiError(404, f"the model {name!r} is not served here; this server serves "
                           f"{self.model_names[0]!r} (GET /v1/models)", "model_not_found", "model")

    def to_request(self, body: schemas.CompletionRequest, tenant: str) -> Request:
        """The scheduler's Request for a validated body; ApiError 404/422/400 for what the engine cannot serve."""
        self.check_model(body.model)
        prompt = self.tokenizer.encode(body.prompt) if isinstance(body.prompt, str) else list(body.prompt)
        vocab = self.scheduler.runner.model.cfg.vocab_size
        if bad := [t for t in prompt if t >= vocab]:
            raise ApiError(422, f"token ids {bad[:5]} are outside the vocabulary 0..{vocab - 1}", "invalid_value",
                           "prompt")
        if not prompt:
            raise ApiError(422, "the prompt encodes to no tokens", "invalid_value", "prompt")
        n, ctx = len(prompt), self.scheduler.max_len
        if n + 1 > ctx:
            raise ApiError(400, f"the prompt is {n} tokens and the context holds {ctx} (prompt + at least one "
                           f"new token); shorten the prompt to at most {ctx - 1} tokens", "context_length_exceeded",
                           "prompt")
        max_tokens = body.max_tokens if body.max_tokens is not None else ctx - n
        if n + max_tokens > ctx:
            raise ApiError(400, f"the context holds {ctx} tokens, the prompt is {n} and max_tokens asks for "
                           f"{max_tokens}; ask for at most {ctx - n}", "context_length_exceeded", "max_tokens")
        try:
            sampling = Sampling(1.0 if body.temperature is None else body.temperature,
                                1.0 if body.top_p is None else body.top_p, body.seed)
            return Request(f"cmpl-{uuid.uuid4().hex[:24]}", tuple(prompt), max_tokens, sampling,
                           body.stop_strings(), tenant)
        except ValueError as exc:
            raise ApiError(422, str(exc), "invalid_value") from None

    def abort(self) -> int:
        """End every request in flight now with a 503 (a second Ctrl-C during the drain); returns how many.

        Runs on the event loop's thread. Each request's client gets Aborted before its own last
        event, and the scheduler frees its slot as for a client that left.
        """
        for request_id, sink in list(self.open.items()):
            sink.put(Aborted("the server was stopped (Ctrl-C during its drain) before this request finished; "
                             "retry it on another server"))
            self.scheduler.cancel(request_id)
        return len(self.open)


@dataclass(frozen=True, slots=True)
class Aborted(Failed):
    """The server stopped before the request finished: a 503, not an engine failure."""


class LoopSink:
    """Hands a request's events from the scheduler thread to the request's event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[Event] = asyncio.Queue()

    def put(self, event: Event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass


def create_app(service: Service) -> FastAPI:
    """The FastAPI app; its lifespan starts the scheduler and, on shutdown, drains it."""
    metrics = ServeMetrics(service.scheduler.cell)
    names = service.model_names

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not service.scheduler.started:
            service.scheduler.start()
        yield
        await asyncio.to_thread(service.scheduler.stop)

    app = FastAPI(title="met", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.abort = service.abort  # server.run calls it on a second Ctrl-C
    app.router.redirect_slashes = False  # /v1/completions/ is not a route: a 404, not a redirect a client may drop
    app.add_middleware(AuthLayer, ring=service.keys)
    app.add_middleware(StatusLayer, metrics=metrics)

    @app.exception_handler(ApiError)
    async def _api_error(request: HttpRequest, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(HTTPException)
    async def _routing_error(request: HttpRequest, exc: HTTPException) -> JSONResponse:
        # an unknown path (404) or a method the path does not take (405), in OpenAI's shape like every error
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        message = f"{request.method} {request.url.path}: {exc.detail}"
        if exc.status_code == 404:
            served = ", ".join(f"{method} {route.path_format}" for route in request.app.routes
                               if isinstance(route, APIRoute) for method in sorted(route.methods))
            message += f"; this server serves {served}"
            if request.url.path.rstrip("/").endswith("/chat/completions"):
                message += ("; chat completions are not served (no chat template is applied): send the text as a "
                            "prompt to POST /v1/completions")
        return JSONResponse(error_body(exc.status_code, message, code), status_code=exc.status_code,
                            headers=exc.headers)

    @app.exception_handler(ClientDisconnect)
    async def _client_left(request: HttpRequest, exc: ClientDisconnect) -> Response:
        # the client hung up while its body was read: nobody reads an answer, and no bug of ours to log as a 500
        return Response(status_code=499)

    @app.exception_handler(Exception)
    async def _server_error(request: HttpRequest, exc: Exception) -> JSONResponse:
        # a bug of ours, not the client's: logged with its traceback by the server, answered in OpenAI's shape
        return JSONResponse(error_body(500, f"internal error ({type(exc).__name__})", "internal_error"),
                            status_code=500)

    @app.post("/v1/completions")
    async def completions(request: HttpRequest) -> Response:
        raw = await _read_body(request)
        body = schemas.parse_request(raw)
        req = service.to_request(body, request.scope.get("state", {}).get("tenant", DEFAULT_TENANT))
        sink = LoopSink(asyncio.get_running_loop())
        try:
            service.scheduler.submit(req, sink)
        except Draining as exc:
            raise ApiError(503, str(exc), "shutting_down") from None
        service.open[req.id] = sink
        created = int(time.time())
        if body.stream:
            usage = body.stream_options is not None and body.stream_options.include_usage
            return StreamingResponse(_stream(service, req, sink, names[0], created, usage),
                                     media_type="text/event-stream", headers={"cache-control": "no-cache"})
        return await _collect(service, request, req, sink, names[0], created)

    @app.get("/v1/models")
    async def models() -> dict:
        return schemas.model_list([names[0]], service.created)

    @app.get("/v1/models/{model:path}")
    async def model(model: str) -> dict:
        service.check_model(model)  # an alias answers with the model it names
        return schemas.model_object(names[0], service.created)

    @app.get("/v1/snapshot")
    async def snapshot() -> dict:
        return snapshot_doc(service.scheduler.cell.latest())

    @app.get("/health")
    async def health() -> JSONResponse:
        if service.scheduler.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        snap = service.scheduler.cell.latest()
        return JSONResponse({"status": "ok", "model": names[0], "active": snap.active, "queued": snap.queued})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


async def _read_body(request: HttpRequest) -> bytes:
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > MAX_BODY_BYTES:
        raise ApiError(413, f"the body is {size} bytes, more than the {MAX_BODY_BYTES} this server reads",
                       "body_too_large")
    chunks, total = [], 0
    async for part in request.stream():
        total += len(part)
        if total > MAX_BODY_BYTES:
            raise ApiError(413, f"the body is more than the {MAX_BODY_BYTES} bytes this server reads",
                           "body_too_large")
        chunks.append(part)
    return b"".join(chunks)


async def _stream(service: Service, req: Request, sink: LoopSink, model: str, created: int,
                  include_usage: bool) -> AsyncIterator[bytes]:
    """Server-sent events: a chunk per delta, the last with finish_reason, optionally usage, then [DONE]."""
    done = False
    try:
        while not done:
            event = await sink.queue.get()
            if isinstance(event, Delta):
                if event.text:
                    yield schemas.sse(schemas.chunk(req.id, model, created, event.text, None, include_usage))
                continue
            done = True
            if isinstance(event, Finished):
                yield schemas.sse(schemas.chunk(req.id, model, created, event.text, event.reason, include_usage))
                if include_usage:
                    yield schemas.sse(schemas.usage_chunk(req.id, model, created, event.prompt_tokens,
                                                          event.completion_tokens))
            else:
                yield schemas.sse(error_body(*_failure(event)))
        yield schemas.sse("[DONE]")
    finally:
        service.open.pop(req.id, None)
        if not done:  # the client went away (the task was cancelled): free the slot now
            service.scheduler.cancel(req.id)


async def _collect(service: Service, http: HttpRequest, req: Request, sink: LoopSink, model: str,
                   created: int) -> Response:
    """A plain response once the request finishes; cancels the request if the client leaves first."""
    parts: list[str] = []
    done = False
    loop = asyncio.get_running_loop()
    checked = loop.time()
    try:
        while True:
            try:
                event = await asyncio.wait_for(sink.queue.get(), DISCONNECT_POLL_S)
            except TimeoutError:
                event = None
            if loop.time() - checked >= DISCONNECT_POLL_S:  # deltas may arrive faster than the poll: check by time
                checked = loop.time()
                if await http.is_disconnected():
                    return Response(status_code=499)  # nobody reads it; the finally cancels the request
            if event is None:
                continue
            if isinstance(event, Delta):
                parts.append(event.text)
                continue
            done = True
            if isinstance(event, Failed):
                raise ApiError(*_failure(event))
            parts.append(event.text)
            return JSONResponse(schemas.completion(req.id, model, created, "".join(parts), event.reason,
                                                   event.prompt_tokens, event.completion_tokens))
    finally:
        service.open.pop(req.id, None)
        if not done:
            service.scheduler.cancel(req.id)


def _failure(event: Failed) -> tuple[int, str, str]:
    """Status, message and code of a request that failed: 503 if the server stopped, else the engine's 500."""
    if isinstance(event, Aborted):
        return 503, event.message, "shutting_down"
    return 500, event.message, "engine_error"
