"""A request's answer: its choices queued as engine requests, their events as they come back, the response or stream.

Each choice is one engine request; their events arrive on one queue, tagged with the choice's
index (LoopSink). `Answer` keeps each choice's text, log-probabilities and timing, observes the
latency histograms (time to first token, inter-token, end-to-end), and builds OpenAI's response
(completions or chat) when every choice has finished, or its stream chunk by chunk. A client that
leaves, or a choice that fails, cancels the job's other choices.
"""

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse

from met.engine.logits import TokenLogprob
from met.engine.requests import Delta, Event, Failed, Finished, Request
from met.engine.scheduler import Draining, Scheduler
from met.model.tokenizer import StreamDecoder, Tokenizer
from met.serve import responses as shapes
from met.serve.errors import ApiError
from met.serve.metrics import ServeMetrics

log = logging.getLogger("met.serve")

DISCONNECT_POLL_S = 0.5  # how often a plain (non-streamed) request checks that its client is still there
MAX_NAMED = 16  # ignored fields named in the header and the log


@dataclass(frozen=True, slots=True)
class Aborted(Failed):
    """The server stopped before the request finished: a 503, not an engine failure."""


@dataclass(slots=True)
class Choice:
    """One choice of a response: its engine request and what came back for it."""

    index: int
    prompt: int  # which of the request's prompts
    request: Request
    parts: list[str] = field(default_factory=list)  # text deltas
    logprobs: list[TokenLogprob] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)  # each logprob token's share of the text (for text_offset)
    decoder: StreamDecoder | None = None  # decodes the logprob tokens into those shares
    prompt_logprobs: tuple[TokenLogprob, ...] = ()
    end: Finished | None = None
    sent: int = 0  # completion tokens counted so far (continuous usage)
    first: float | None = None  # when its first token arrived (clock of the serve's loop)
    last: float | None = None

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def score(self) -> float:
        """Summed log-probability of its tokens (best_of ranks by it)."""
        return sum(lp.logprob for lp in self.logprobs)


@dataclass(slots=True)
class Job:
    """A request's choices and how to answer it."""

    chat: bool
    id: str
    model: str
    choices: list[Choice]
    n: int  # choices returned per prompt (best_of picks these of its candidates)
    prompts: list[list[int]]
    prompt_texts: list[str]  # echo's
    echo: bool = False
    logprobs: int | None = None  # alternatives returned per token; None: log-probabilities not returned
    include_usage: bool = False
    continuous: bool = False
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def kind(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"


class LoopSink:
    """Hands a request's events from the scheduler thread to the request's event loop, tagged with its choice."""

    def __init__(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue | None = None, index: int = 0) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[tuple[int, Event]] = queue if queue is not None else asyncio.Queue()
        self.index = index

    def put(self, event: Event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (self.index, event))
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass


class Served(Protocol):
    """What an answer needs of the service: the scheduler, its tokenizer, the requests in flight."""

    scheduler: Scheduler
    tokenizer: Tokenizer
    open: dict[str, "LoopSink"]  # request id -> its sink, while queued or running


async def answer(service: Served, metrics: ServeMetrics, http: HttpRequest, job: Job, stream: bool,
                  ignored: list[str]) -> Response:
    """Queue the job's choices and answer: a stream of chunks, or one response when all have finished."""
    headers = {}
    if ignored:
        # a header is latin-1: a name of other characters is written escaped (and the list cut short)
        shown = [n.encode("ascii", "backslashreplace").decode("ascii")[:64] for n in ignored[:MAX_NAMED]]
        more = f", and {len(ignored) - MAX_NAMED} more" if len(ignored) > MAX_NAMED else ""
        headers["x-met-ignored-fields"] = ", ".join(shown) + more
        log.warning("%s %s: ignored fields met does not apply: %s%s", http.method, http.url.path, ", ".join(shown),
                    more)
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    started = loop.time()
    for c in job.choices:
        sink = LoopSink(loop, queue, c.index)
        try:
            service.scheduler.submit(c.request, sink)
        except Draining as exc:
            _cancel(service, job)
            raise ApiError(503, str(exc), "shutting_down") from None
        service.open[c.request.id] = sink
    run = Answer(service, metrics, job, queue, started)
    if stream:
        return StreamingResponse(run.stream(), media_type="text/event-stream",
                                 headers=headers | {"cache-control": "no-cache"})
    return await run.collect(http, headers)


def _cancel(service: Served, job: Job) -> None:
    """Cancel the job's choices still in flight (their client left, or a sibling failed)."""
    for c in job.choices:
        if service.open.pop(c.request.id, None) is not None:
            service.scheduler.cancel(c.request.id)


class Answer:
    """A job's events as they arrive: choices updated, latency observed, chunks or the final response built."""

    def __init__(self, service: Served, metrics: ServeMetrics, job: Job, queue: asyncio.Queue,
                 started: float) -> None:
        self.service, self.metrics, self.job, self.queue, self.started = service, metrics, job, queue, started
        self.tok = service.tokenizer
        self.left = len(job.choices)

    async def next(self) -> tuple[Choice, Event]:
        """The next event of a choice, with the choice updated; ApiError for a failure of any choice."""
        index, event = await self.queue.get()
        c = self.job.choices[index]
        now = asyncio.get_running_loop().time()
        if isinstance(event, Delta):
            c.parts.append(event.text)
            if event.prompt_logprobs is not None:
                c.prompt_logprobs = event.prompt_logprobs
            if event.logprobs:
                c.logprobs.extend(event.logprobs)
                c.decoder = c.decoder if c.decoder is not None else self.tok.stream()
                c.texts.extend(_piece(c.decoder, lp.token) for lp in event.logprobs)
            if event.tokens:
                if c.first is None:
                    self.metrics.ttft.observe(now - self.started)
                else:  # the step's tokens share its interval
                    for _ in range(event.tokens):
                        self.metrics.itl.observe((now - c.last) / event.tokens)
                c.first = c.first if c.first is not None else now
                c.last = now
            return c, event
        self.left -= 1
        self.service.open.pop(c.request.id, None)
        if isinstance(event, Failed):
            raise ApiError(*_failure(event))
        c.parts.append(event.text)
        if c.texts and c.decoder is not None:
            c.texts[-1] += c.decoder.flush()
        c.end = event
        self.metrics.e2e.observe(now - self.started)
        return c, event

    def usage(self, final: bool) -> dict:
        """Usage over the returned choices; the last one also counts the speculation."""
        prompt = sum(len(p) for p in self.job.prompts)
        done = sum(c.end.completion_tokens if c.end is not None else c.sent for c in self.returned())
        drafts = None
        if final:
            drafts = (sum(c.end.draft_tokens for c in self.job.choices if c.end is not None),
                      sum(c.end.accepted_tokens for c in self.job.choices if c.end is not None))
        return shapes.usage(prompt, done, drafts)

    def returned(self) -> list[Choice]:
        """The choices the response holds, in index order: best_of's best n of each prompt's candidates."""
        job = self.job
        per = len(job.choices) // len(job.prompts)
        if per == job.n:
            return job.choices
        out = []
        for p in range(len(job.prompts)):
            candidates = job.choices[p * per : (p + 1) * per]
            out += sorted(candidates, key=lambda c: -c.score())[: job.n]
        return out

    def logprobs_doc(self, c: Choice, entries: list[TokenLogprob], texts: list[str], echo: bool) -> dict | None:
        job = self.job
        if job.logprobs is None:
            return None
        if job.chat:
            return shapes.chat_logprobs(self.tok, entries, job.logprobs)
        if echo:
            prompt = self.job.prompts[c.prompt]
            head: list = [prompt[0], *c.prompt_logprobs]
            ptexts = _token_texts(self.tok, prompt)
            return shapes.completion_logprobs(self.tok, head + entries, job.logprobs, ptexts + texts)
        return shapes.completion_logprobs(self.tok, entries, job.logprobs, texts)

    async def collect(self, http: HttpRequest, headers: dict) -> Response:
        """One response once every choice finished; cancels them if the client leaves first."""
        loop = asyncio.get_running_loop()
        checked = loop.time()
        try:
            while self.left:
                try:
                    await asyncio.wait_for(self.next(), DISCONNECT_POLL_S)
                except TimeoutError:
                    pass
                if loop.time() - checked >= DISCONNECT_POLL_S:  # events may arrive faster than the poll
                    checked = loop.time()
                    if await http.is_disconnected():
                        return Response(status_code=499)  # nobody reads it; the finally cancels the requests
            return JSONResponse(self.response(), headers=headers)
        finally:
            _cancel(self.service, self.job)

    def response(self) -> dict:
        job, out = self.job, []
        for i, c in enumerate(self.returned()):
            index = i
            if job.chat:
                out.append(shapes.chat_choice(index, c.text, c.end.reason, self.logprobs_doc(c, c.logprobs, c.texts,
                                                                                             False)))
            else:
                prefix = job.prompt_texts[c.prompt] if job.echo else ""
                lp = self.logprobs_doc(c, c.logprobs, c.texts, job.echo)
                out.append(shapes.completion_choice(index, prefix + c.text, c.end.reason, lp))
        make = shapes.chat if job.chat else shapes.completion
        return make(job.id, job.model, job.created, out, self.usage(final=True))

    async def stream(self) -> AsyncIterator[bytes]:
        """Server-sent events: per choice its deltas, the last with finish_reason; usage as asked; then [DONE].

        A chat choice begins with a chunk holding only the role, as OpenAI's. Under echo a choice's first
        chunk is its prompt: at once without log-probabilities, with them once the prefill scored it.
        """
        job = self.job
        usage_key = job.include_usage or job.continuous

        def chunk(choice: dict) -> bytes:
            use = self.usage(final=False) if job.continuous else None
            return shapes.sse(shapes.chunk(job.kind, job.id, job.model, job.created, [choice], use, usage_key))

        try:
            for c in job.choices:
                if job.chat:
                    yield chunk(shapes.chat_delta(c.index, {"role": "assistant", "content": ""}))
                elif job.echo and job.logprobs is None:
                    yield chunk(self._delta(c, job.prompt_texts[c.prompt], None, None))
            failed = False
            while self.left:
                try:
                    c, event = await self.next()
                except ApiError as exc:
                    yield shapes.sse(exc.body())
                    failed = True
                    break
                if isinstance(event, Finished):
                    yield chunk(self._delta(c, event.text, event.reason, None))
                    continue
                c.sent += event.tokens
                new = c.logprobs[len(c.logprobs) - len(event.logprobs):] if event.logprobs else []
                texts = c.texts[len(c.texts) - len(new):] if new else []
                echo = job.echo and event.prompt_logprobs is not None
                text = job.prompt_texts[c.prompt] + event.text if echo else event.text
                if text or new or echo:
                    yield chunk(self._delta(c, text, None, self.logprobs_doc(c, new, texts, echo)))
            if job.include_usage and not failed:
                yield shapes.sse(shapes.chunk(job.kind, job.id, job.model, job.created, [], self.usage(final=True)))
            yield shapes.sse("[DONE]")
        finally:
            _cancel(self.service, job)

    def _delta(self, c: Choice, text: str, finish: str | None, lp: dict | None) -> dict:
        if self.job.chat:
            return shapes.chat_delta(c.index, {"content": text} if text or finish is None else {}, finish, lp)
        return shapes.completion_choice(c.index, text, finish, lp)


def _piece(decoder: StreamDecoder, token: int) -> str:
    """The text a token adds to its choice's (empty while a character is incomplete)."""
    try:
        return decoder.add(token)
    except ValueError:  # an id the tokenizer has no text for
        return ""


def _token_texts(tokenizer: Tokenizer, tokens: list[int]) -> list[str]:
    """Each token's share of the decoded text (text_offset of an echoed prompt), by a stream decode."""
    stream, out = tokenizer.stream(), []
    for t in tokens:
        try:
            out.append(stream.add(t))
        except ValueError:
            out.append("")
    if out:
        out[-1] += stream.flush()
    return out


def _failure(event: Failed) -> tuple[int, str, str]:
    """Status, message and code of a request that failed: 503 if the server stopped, else the engine's 500."""
    if isinstance(event, Aborted):
        return 503, event.message, "shutting_down"
    return 500, event.message, "engine_error"
