"""OpenAI-compatible HTTP API: /v1/completions and /v1/chat/completions (plain and SSE), /v1/models[/{model}],
/tokenize, /detokenize, /tokenizer_info, /v1/snapshot, /health, /metrics, /openapi.json and /docs.

Requests are checked in this order, each refusal an OpenAI-shaped error that touches nothing
else: API key (401, before the body is read), body size (413), JSON and fields (400
invalid_request_error naming the field), model (404), a chat for a model without a template
(400), token ids outside the model's vocabulary (400), prompt longer than the context, or prompt +
max_tokens (400 context_length_exceeded, as OpenAI's, which clients look for), more requests in
flight than the server holds (429), a server that is draining (503). Only then are the request's
choices queued for the scheduler: one engine request per choice (n per prompt, best_of
candidates per prompt when it asks more), in the order of their index.

A client that disconnects, mid-stream or while waiting for a plain response, has its requests
cancelled, which frees their slots; one that disconnects while its body is read never reaches
the scheduler (499 in /metrics, as the others). Every response carries the x-request-id it was
sent (or one made up), and x-met-ignored-fields when the body held fields met does not apply.
"""

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request as HttpRequest
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from met.engine.policy import PolicyConfig, build_policy
from met.engine.prompts import unencodable
from met.engine.requests import Request
from met.engine.runner import ModelRunner, Sampling
from met.engine.scheduler import Scheduler
from met.model.chat_template import EMBEDDED, ChatTemplate, TemplateError
from met.model.dflash import DflashDrafter
from met.model.eagle3 import Eagle3Head
from met.model.tokenizer import BYTES, Tokenizer
from met.model.transformer import Transformer
from met.serve import responses as shapes, schemas
from met.serve.answer import Aborted, Choice, Job, LoopSink, answer
from met.serve.auth import DEFAULT_TENANT, AuthLayer, KeyRing
from met.serve.errors import ApiError, error_body
from met.serve.metrics import ServeMetrics, StatusLayer
from met.serve.report import snapshot_doc
from met.serve.request_id import RequestIdLayer
from met.speculative.spec_cost import SpecCostState

MAX_BODY_BYTES = 4 << 20  # far above any prompt a context holds; refuses a runaway upload early
MAX_IN_FLIGHT = 1024  # engine requests queued or running; past it a request is a 429 (retry later)


@dataclass(slots=True)
class Service:
    """What the API serves: the scheduler, the model names it answers to, the keys, the chat template."""

    scheduler: Scheduler
    model_names: tuple[str, ...]  # the first is the id /v1/models lists; the rest are accepted aliases
    keys: KeyRing = field(default_factory=lambda: KeyRing({}))
    created: int = field(default_factory=lambda: int(time.time()))
    tokenizer: Tokenizer | None = None  # encodes text prompts; None: the scheduler's, which decodes the completions
    open: dict[str, LoopSink] = field(default_factory=dict)  # requests in flight (queued or running) by id
    chat: ChatTemplate | None = EMBEDDED  # renders chat messages; None: the model has none (chat is a 400)
    max_in_flight: int = MAX_IN_FLIGHT

    def __post_init__(self) -> None:
        if self.tokenizer is None:  # prompts encoded by another tokenizer than the one decoding them would be garbled
            self.tokenizer = self.scheduler.tokenizer

    @classmethod
    def build(cls, model: Transformer, model_id: str, names: tuple[str, ...], policy: PolicyConfig,
              max_batch: int, max_len: int | None = None, cost_state: SpecCostState | None = None,
              keys: KeyRing | None = None, tokenizer: Tokenizer = BYTES,
              dflash: DflashDrafter | None = None, chat: ChatTemplate | None = EMBEDDED,
              draft_model: Transformer | None = None, eagle: Eagle3Head | None = None,
              draft_cost_state: SpecCostState | None = None,
              cost_states: Mapping[str, SpecCostState] | None = None) -> "Service":
        """A runner for the model (and every drafter it holds: its DFlash drafter, a draft model, an EAGLE-3 head),
        the policy the flags compose, and a scheduler over them.

        cost_states: a choice's measured states by drafter name (policy.build_policy). The scheduler is
        not started yet. ValueError for a draft model of a shorter context than max_len.
        """
        # a serve that drafts with something else never drafts with the MTP block: no catch-up rows to keep for it
        others = ("draft", "eagle", "draft+eagle")
        runner = ModelRunner(model, max_batch, max_len, track_mtp=policy.spec not in others,
                             dflash=dflash, draft_model=draft_model, eagle=eagle)
        num_drafts = model.cfg.mtp_depth if model.mtp is not None else 0
        built = build_policy(policy, num_drafts, cost_state, dflash_block=dflash.block if dflash is not None else None,
                             draft_model=draft_model is not None, eagle=eagle is not None,
                             draft_cost_state=draft_cost_state, cost_states=cost_states)
        scheduler = Scheduler(runner, built, model_id, tokenizer=tokenizer)
        return cls(scheduler, names, keys if keys is not None else KeyRing({}), chat=chat)

    def check_model(self, name: str | None) -> None:
        """ApiError 404 unless the name is one this server answers to (None: the served model)."""
        if name is not None and name not in self.model_names:
            raise ApiError(404, f"the model {name!r} is not served here; this server serves "
                           f"{self.model_names[0]!r} (GET /v1/models)", "model_not_found", "model")

    @property
    def turn_ids(self) -> frozenset[int]:
        """Token ids that end a chat turn besides the tokenizer's EOS: the template's eos_token, if one token."""
        end = self.chat.end_of_turn if self.chat is not None else None
        ids = self.tokenizer.encode(end, add_special_tokens=False) if end else []
        return frozenset(ids) if len(ids) == 1 else frozenset()

    def render(self, messages: list[schemas.Message], add_generation_prompt: bool = True, tools: list | None = None,
               kwargs: dict | None = None) -> list[int]:
        """The token ids of a conversation through the chat template; ApiError 400 without one or if it fails."""
        if self.chat is None:
            raise ApiError(400, f"the model {self.model_names[0]!r} has no chat template (no chat_template in its "
                           "tokenizer_config.json, no chat_template.jinja): send the text as a prompt to "
                           "POST /v1/completions", "chat_template_missing", "messages")
        docs = [m.for_template() for m in messages]
        try:
            text = self.chat.render(docs, add_generation_prompt, tools=tools, variables=kwargs)
        except TemplateError as exc:
            raise ApiError(400, str(exc), "invalid_value", "messages") from None
        if (bad := unencodable(text)) is not None:  # JSON's \ud800 escapes decode to lone surrogates
            raise ApiError(400, f"the conversation {bad}", "invalid_value", "messages")
        return self.tokenizer.encode(text, add_special_tokens=False)  # the template writes the special tokens

    def prompt_ids(self, prompt: str | list[int], add_special_tokens: bool = True) -> list[int]:
        """A prompt's token ids, checked against the vocabulary and the context; ApiError 400 if they do not fit."""
        ids = self.tokenizer.encode(prompt, add_special_tokens) if isinstance(prompt, str) else list(prompt)
        vocab = self.scheduler.runner.model.cfg.vocab_size
        if bad := [t for t in ids if t >= vocab]:
            raise ApiError(400, f"token ids {bad[:5]} are outside the vocabulary 0..{vocab - 1}", "invalid_value",
                           "prompt")
        if not ids:
            raise ApiError(400, "the prompt encodes to no tokens", "invalid_value", "prompt")
        n, ctx = len(ids), self.scheduler.max_len
        if n + 1 > ctx:
            raise ApiError(400, f"the prompt is {n} tokens and the context holds {ctx} (prompt + at least one "
                           f"new token); shorten the prompt to at most {ctx - 1} tokens", "context_length_exceeded",
                           "prompt")
        return ids

    def limit(self, prompt: list[int], max_tokens: int | None, param: str = "max_tokens") -> int:
        """The request's max_tokens, checked to fit the context with the prompt (None: the rest of the context)."""
        n, ctx = len(prompt), self.scheduler.max_len
        want = max_tokens if max_tokens is not None else ctx - n
        if n + want > ctx:
            raise ApiError(400, f"the context holds {ctx} tokens, the prompt is {n} and {param} asks for "
                           f"{want}; ask for at most {ctx - n}", "context_length_exceeded", param)
        return want

    def sampling(self, body: schemas.Sampled, seed: int | None, logprobs: int | None, echo: bool,
                 ends: frozenset[int]) -> Sampling:
        """The engine's Sampling for a body (one choice's seed); ApiError 400 for what it refuses."""
        vocab = self.scheduler.runner.model.cfg.vocab_size
        bias = tuple((int(k), float(v)) for k, v in (body.logit_bias or {}).items())
        if bad := [t for t, _ in bias if t >= vocab]:
            raise ApiError(400, f"logit_bias names token ids {bad[:5]} outside the vocabulary 0..{vocab - 1}",
                           "invalid_value", "logit_bias")
        try:
            return Sampling(1.0 if body.temperature is None else body.temperature,
                            1.0 if body.top_p is None else body.top_p, seed, top_k=max(0, body.top_k or 0),
                            min_p=body.min_p or 0.0, presence_penalty=body.presence_penalty or 0.0,
                            frequency_penalty=body.frequency_penalty or 0.0,
                            repetition_penalty=body.repetition_penalty or 1.0, logit_bias=bias,
                            min_tokens=body.min_tokens or 0, eos_ids=ends, logprobs=logprobs,
                            prompt_logprobs=echo and logprobs is not None)
        except ValueError as exc:
            raise ApiError(400, str(exc), "invalid_value") from None

    def choices(self, prompts: list[list[int]], body: schemas.Sampled, max_tokens: int | None, per_prompt: int,
                logprobs: int | None, echo: bool, tenant: str, chat: bool) -> list["Choice"]:
        """One engine request per choice: per_prompt for each prompt, prompt by prompt (their index order)."""
        extra = frozenset(body.stop_token_ids or ()) | (self.turn_ids if chat else frozenset())
        ends = (frozenset() if body.ignore_eos else self.tokenizer.eos_ids) | extra  # what min_tokens bans
        if body.min_tokens and max_tokens is not None and body.min_tokens > max_tokens:
            raise ApiError(400, f"min_tokens ({body.min_tokens}) is more than max_tokens ({max_tokens})",
                           "invalid_value", "min_tokens")
        out = []
        param = "max_completion_tokens" if isinstance(body, schemas.ChatRequest) and body.max_completion_tokens \
            else "max_tokens"
        for p, ids in enumerate(prompts):
            want = self.limit(ids, max_tokens, param)
            for c in range(per_prompt):
                seed = body.seed if body.seed is None or c == 0 else (body.seed + c) % (1 << 64)  # a choice each
                sampling = self.sampling(body, seed, logprobs, echo, ends)
                try:
                    req = Request(f"cmpl-{uuid.uuid4().hex[:24]}", tuple(ids), want, sampling, body.stop_strings(),
                                  tenant, extra, bool(body.ignore_eos), bool(body.include_stop_str_in_output))
                except ValueError as exc:
                    raise ApiError(400, str(exc), "invalid_value") from None
                out.append(Choice(len(out), p, req))
        if len(self.open) + len(out) > self.max_in_flight:
            raise ApiError(429, f"the server holds {self.max_in_flight} requests in flight and has "
                           f"{len(self.open)}; retry shortly", "rate_limit_exceeded")
        return out

    def abort(self, why: str = "Ctrl-C during its drain") -> int:
        """End every request in flight now with a 503 (a second Ctrl-C, or the drain time ran out); returns how many.

        Runs on the event loop's thread. Each request's client gets Aborted before its own last
        event, and the scheduler frees its slot as for a client that left.
        """
        for request_id, sink in list(self.open.items()):
            sink.put(Aborted(f"the server was stopped ({why}) before this request finished; "
                             "retry it on another server"))
            self.scheduler.cancel(request_id)
        return len(self.open)


_ERROR = {"description": "An error in OpenAI's shape",
          "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}}
_ERROR_SCHEMAS = {
    "ErrorResponse": {"type": "object", "required": ["error"],
                      "properties": {"error": {"$ref": "#/components/schemas/ErrorObject"}}},
    "ErrorObject": {"type": "object", "required": ["message", "type", "code"],
                    "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                                   "code": {"type": ["string", "null"]}, "param": {"type": ["string", "null"]}}},
}


def _body_doc(model: type[BaseModel], schemas_out: dict, streams: bool = False) -> dict:
    """openapi_extra and responses documenting a route that reads the body as `model` (parsed by hand)."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas_out.update(schema.pop("$defs", {}))
    schemas_out[model.__name__] = schema
    ok = {"application/json": {}} | ({"text/event-stream": {}} if streams else {})
    return {"openapi_extra": {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}},
            "responses": {200: {"description": "OK", "content": ok}, "default": _ERROR}}


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

    app = FastAPI(title="met", summary="An OpenAI-compatible server whose speculative decoding is planned from "
                  "measured cost tables", lifespan=lifespan, redoc_url=None)
    app.state.abort = service.abort  # server.run calls it on a second Ctrl-C
    app.router.redirect_slashes = False  # /v1/completions/ is not a route: a 404, not a redirect a client may drop
    app.add_middleware(AuthLayer, ring=service.keys)
    app.add_middleware(StatusLayer, metrics=metrics)
    app.add_middleware(RequestIdLayer)
    body_schemas = dict(_ERROR_SCHEMAS)

    def openapi() -> dict:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
            found = doc.setdefault("components", {}).setdefault("schemas", {})
            found.update(body_schemas)
            served = {"type": "string", "enum": list(names)}  # the names this server answers to, not any string
            for name in ("CompletionRequest", "ChatRequest"):
                found[name]["properties"]["model"] = served | {"title": "Model"}
            for name in ("TokenizeRequest", "DetokenizeRequest"):  # optional there
                found[name]["properties"]["model"] = {"anyOf": [served, {"type": "null"}], "title": "Model"}
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi

    def get(path: str, **kwargs):
        """A GET route that answers HEAD too (as a GET without its body)."""
        def register(fn):
            app.head(path, include_in_schema=False)(fn)
            return app.get(path, responses={"default": _ERROR}, **kwargs)(fn)
        return register

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
                               if isinstance(route, APIRoute) and route.include_in_schema
                               for method in sorted(route.methods))
            message += f"; this server serves {served}"
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

    @app.post("/v1/completions", **_body_doc(schemas.CompletionRequest, body_schemas, streams=True))
    async def completions(request: HttpRequest) -> Response:
        body = schemas.parse(await _read_body(request), schemas.CompletionRequest)
        service.check_model(body.model)
        prompts = [service.prompt_ids(p, body.add_special_tokens is not False) for p in body.prompts()]
        n = body.n or 1
        per_prompt = max(n, body.best_of or 1)
        wanted = body.logprobs
        # best_of ranks its candidates by their summed log-probability: computed even when not returned
        computed = wanted if wanted is not None else (0 if per_prompt > n else None)
        choices = service.choices(prompts, body, body.max_tokens, per_prompt, computed, bool(body.echo),
                                  _tenant(request), chat=False)
        texts = [p if isinstance(p, str) else service.tokenizer.decode(p) for p in body.prompts()] \
            if body.echo else []
        job = Job(False, f"cmpl-{uuid.uuid4().hex[:24]}", names[0], choices, n, prompts, texts, bool(body.echo),
                  wanted, *_usage_options(body))
        return await answer(service, metrics, request, job, bool(body.stream), body.ignored())

    @app.post("/v1/chat/completions", **_body_doc(schemas.ChatRequest, body_schemas, streams=True))
    async def chat_completions(request: HttpRequest) -> Response:
        body = schemas.parse(await _read_body(request), schemas.ChatRequest)
        service.check_model(body.model)
        prompt = service.render(body.messages, body.add_generation_prompt is not False, body.tools,
                                body.chat_template_kwargs)
        prompt = service.prompt_ids(prompt)
        wanted = (body.top_logprobs or 0) if body.logprobs else None
        choices = service.choices([prompt], body, body.limit(), body.n or 1, wanted, False, _tenant(request),
                                  chat=True)
        job = Job(True, f"chatcmpl-{uuid.uuid4().hex[:24]}", names[0], choices, body.n or 1, [prompt], [], False,
                  wanted, *_usage_options(body))
        return await answer(service, metrics, request, job, bool(body.stream), body.ignored())

    @app.post("/tokenize", **_body_doc(schemas.TokenizeRequest, body_schemas))
    async def tokenize(request: HttpRequest) -> JSONResponse:
        body = schemas.parse(await _read_body(request), schemas.TokenizeRequest)
        service.check_model(body.model)
        if body.messages is not None:
            ids = service.render(body.messages, body.add_generation_prompt is not False)
        else:
            if (bad := unencodable(body.prompt or "")) is not None:
                raise ApiError(400, f"the prompt {bad}", "invalid_value", "prompt")
            ids = service.tokenizer.encode(body.prompt or "", body.add_special_tokens is not False)
        doc = {"count": len(ids), "max_model_len": service.scheduler.max_len, "tokens": ids, "token_strs": None}
        if body.return_token_strs:
            doc["token_strs"] = [shapes.token_text(service.tokenizer, t) for t in ids]
        return JSONResponse(doc)

    @app.post("/detokenize", **_body_doc(schemas.DetokenizeRequest, body_schemas))
    async def detokenize(request: HttpRequest) -> JSONResponse:
        body = schemas.parse(await _read_body(request), schemas.DetokenizeRequest)
        service.check_model(body.model)
        vocab = service.scheduler.runner.model.cfg.vocab_size
        if bad := [t for t in body.tokens if t >= vocab]:
            raise ApiError(400, f"token ids {bad[:5]} are outside the vocabulary 0..{vocab - 1}", "invalid_value",
                           "tokens")
        return JSONResponse({"prompt": service.tokenizer.decode(body.tokens)})

    @get("/tokenizer_info")
    async def tokenizer_info() -> dict:
        tok, chat = service.tokenizer, service.chat
        doc = {"tokenizer_class": "ByteTokenizer" if tok.name == "byte" else "PreTrainedTokenizerFast",
               "name": tok.name, "vocab_size": tok.vocab_size, "model_max_length": service.scheduler.max_len,
               "eos_token_ids": sorted(tok.eos_ids), "chat_template": chat.source if chat is not None else None}
        return doc | (chat.tokens if chat is not None else {})

    @get("/v1/models")
    async def models() -> dict:
        return shapes.model_list([names[0]], service.created)

    @get("/v1/models/{model:path}")
    async def model(model: str) -> dict:
        service.check_model(model)  # an alias answers with the model it names
        return shapes.model_object(names[0], service.created)

    @get("/v1/snapshot")
    async def snapshot() -> dict:
        return snapshot_doc(service.scheduler.cell.latest())

    @get("/health")
    async def health() -> JSONResponse:
        if service.scheduler.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        snap = service.scheduler.cell.latest()
        return JSONResponse({"status": "ok", "model": names[0], "active": snap.active, "queued": snap.queued})

    @get("/metrics", response_class=Response)
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


def _tenant(request: HttpRequest) -> str:
    return request.scope.get("state", {}).get("tenant", DEFAULT_TENANT)


def _usage_options(body: schemas.Sampled) -> tuple[bool, bool]:
    options = body.stream_options
    return (options is not None and options.include_usage, options is not None and options.continuous_usage_stats)


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
