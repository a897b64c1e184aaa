"""A completion request, the events it streams back, and the per-sequence state the scheduler keeps for it.

A request's events go through its Sink, which the scheduler thread calls: a `QueueSink` for
threads (tests, offline use), the server's sink hands them to its event loop. Events in order:
any number of `Delta`s, then exactly one `Finished` (or `Failed`).
"""

import queue
from dataclasses import dataclass, field
from typing import Protocol

from met.engine.proposer import Proposer
from met.engine.logits import TokenLogprob
from met.engine.runner import Sampling
from met.engine.textstream import TextStream

FINISH_REASONS = ("stop", "length", "cancelled", "error")  # "stop": EOS or a stop string


@dataclass(frozen=True, slots=True)
class Request:
    """What a client asked for, tokenized and validated."""

    id: str
    prompt: tuple[int, ...]
    max_tokens: int
    sampling: Sampling = Sampling()
    stop: tuple[str, ...] = ()  # generation ends before the first of these appears; it is not returned
    tenant: str = "default"  # the shared-lookup scope's tenant: requests only share tokens within one
    stop_ids: frozenset[int] = frozenset()  # token ids that end it besides the tokenizer's EOS (a chat's end of turn)
    ignore_eos: bool = False  # the tokenizer's EOS does not end it (stop_ids still do)
    include_stop: bool = False  # the stop string that ended it is returned at the end of its text

    def __post_init__(self) -> None:
        if not self.prompt:
            raise ValueError("the prompt is empty; send at least one token")
        if self.max_tokens < (0 if self.sampling.prompt_logprobs else 1):  # 0 with echo: score the prompt alone
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if len(self.stop) > 4 or any(not s for s in self.stop):
            raise ValueError(f"stop takes at most 4 non-empty strings, got {list(self.stop)}")


@dataclass(frozen=True, slots=True)
class Delta:
    """New text of a request (may be empty when only held-back bytes arrived) and tokens it took."""

    text: str
    tokens: int
    logprobs: tuple[TokenLogprob, ...] = ()  # the tokens' own, when the request asks (Sampling.logprobs)
    prompt_logprobs: tuple[TokenLogprob, ...] | None = None  # echo: the prompt's from its second token, sent first


@dataclass(frozen=True, slots=True)
class Finished:
    """The end of a request: why, its last text, and the usage counts."""

    reason: str  # one of FINISH_REASONS
    text: str  # the final delta (text held back until the end)
    prompt_tokens: int
    completion_tokens: int  # generated tokens consumed; EOS and tokens after a stop string are not counted
    draft_tokens: int = 0  # drafts verified for this request
    accepted_tokens: int = 0  # of those, accepted (bonus tokens not counted)
    tokens: tuple[int, ...] = ()  # the generated token ids completion_tokens counts (met generate decodes them)


@dataclass(frozen=True, slots=True)
class Failed:
    """The request could not be served; the message says why."""

    message: str


Event = Delta | Finished | Failed


class Sink(Protocol):
    """Where the scheduler thread puts a request's events; must not block."""

    def put(self, event: Event) -> None: ...


class QueueSink:
    """A thread-safe sink backed by queue.Queue, for callers on plain threads."""

    def __init__(self) -> None:
        self.queue: queue.Queue[Event] = queue.Queue()

    def put(self, event: Event) -> None:
        self.queue.put(event)

    def collect(self, timeout: float = 60.0) -> tuple[str, Finished | Failed]:
        """Block until the request ends; returns (its whole text, the final event)."""
        parts = []
        while True:
            event = self.queue.get(timeout=timeout)
            if isinstance(event, Delta):
                parts.append(event.text)
            else:
                if isinstance(event, Finished):
                    parts.append(event.text)
                return "".join(parts), event


@dataclass(slots=True)
class SeqState:
    """A running request: its slot, proposer, emitted tokens and text stream."""

    request: Request
    sink: Sink
    slot: int
    proposer: Proposer
    text: TextStream
    generated: list[int] = field(default_factory=list)  # tokens the client got: no EOS, none past a stop string
    confidences: list[float] = field(default_factory=list)  # the drafter's confidences of the last step's drafts
    drafted_by: str = ""  # the step mode that drafted them ("mtp", "draft"): a planner reads only its own drafter's
    drafted: int = 0  # drafts verified for it so far
    accepted: int = 0  # of those, accepted
    finish: str | None = None  # set when the sequence must leave at the end of this tick

    @property
    def remaining(self) -> int:
        """Tokens the request may still receive."""
        return self.request.max_tokens - self.text.tokens
