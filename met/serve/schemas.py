"""The /v1/completions request (validated with pydantic) and OpenAI's response, chunk and model-list shapes."""

import json
import time
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from met.engine.prompts import unencodable
from met.serve.errors import ApiError

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions


class StreamOptions(BaseModel):
    """OpenAI's stream_options: include_usage adds a last chunk with the usage counts."""

    model_config = ConfigDict(extra="forbid", strict=True)  # as the request's: "yes" is not true
    include_usage: bool = False


class CompletionRequest(BaseModel):
    """POST /v1/completions: the fields met serves; unsupported ones are refused, not ignored.

    Strict types, as OpenAI's API: "5" is not a max_tokens, nor true a stream (an int is still a float).
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str
    prompt: str | list[int]  # one prompt: text, [text], token ids or [token ids]
    max_tokens: Annotated[int, Field(ge=1)] | None = DEFAULT_MAX_TOKENS  # None: up to the context
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = 1.0
    stop: str | Annotated[list[str], Field(max_length=4)] | None = None
    seed: Annotated[int, Field(ge=-(1 << 63), lt=1 << 64)] | None = None  # what torch.Generator takes
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: Literal[1] | None = 1  # one choice per request
    best_of: Literal[1] | None = None
    echo: Literal[False] | None = False
    logprobs: None = None  # log-probabilities are not returned
    suffix: None = None
    presence_penalty: Literal[0, 0.0] | None = 0.0
    frequency_penalty: Literal[0, 0.0] | None = 0.0
    logit_bias: None = None  # no bias is applied: {} (LangChain's default) is taken as null
    user: str | None = None

    @field_validator("stop")
    @classmethod
    def _stop_not_empty(cls, value: str | list[str] | None) -> str | list[str] | None:
        for s in [] if value is None else [value] if isinstance(value, str) else value:
            if s == "":
                raise ValueError("a stop string must not be empty")
            if (bad := unencodable(s)) is not None:  # a lone surrogate: no text the model writes could match it
                raise ValueError(f"a stop string {bad}")
        return value

    @field_validator("n", "best_of", "echo", "presence_penalty", "frequency_penalty", mode="before")
    @classmethod
    def _literal_of_its_type(cls, value: object, info: ValidationInfo) -> object:
        # a Literal compares with ==, so true would pass as n = 1 and 0 as echo = false: check the JSON type first
        want, types = {"n": ("integer", int), "best_of": ("integer", int), "echo": ("boolean", bool)}.get(
            info.field_name, ("number", int | float))
        if value is not None and (not isinstance(value, types) or isinstance(value, bool) != (types is bool)):
            raise ValueError(f"Input should be a valid {want}")
        return value

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _no_bias(cls, value: object) -> object:
        if isinstance(value, dict) and not value:
            return None  # an empty map biases nothing: what a client sends for "no bias"
        if isinstance(value, dict):
            raise ValueError("token biases are not applied by this server; send {} or null, or leave it out")
        return value

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, value: object) -> str | list[int]:
        if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
            value = value[0]  # a batch of one
        if isinstance(value, str) and value:
            if (bad := unencodable(value)) is not None:  # JSON's \ud800 escapes decode to lone surrogates
                raise ValueError(bad)
            return value
        if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
            bad = [t for t in value if t < 0]  # the model's vocabulary is checked when the request is queued
            if bad:
                raise ValueError(f"token ids {bad[:5]} are negative")
            return value
        raise ValueError("must be one non-empty prompt: a string, a list of one string, or a list of token ids "
                         "(batches of several prompts are not served; send one request each)")

    @field_validator("stream_options")
    @classmethod
    def _stream_options_need_stream(cls, value: StreamOptions | None, info: ValidationInfo) -> StreamOptions | None:
        if value is not None and not info.data.get("stream"):  # stream is validated first: it is declared first
            raise ValueError("is only allowed when stream is true")
        return value

    def stop_strings(self) -> tuple[str, ...]:
        """The stop strings as a tuple (none: ())."""
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


def parse_request(raw: bytes) -> CompletionRequest:
    """The request from a body: ApiError 400 if it is not JSON, 422 (naming each field) if a field is invalid."""
    try:
        doc = json.loads(raw, parse_constant=_not_json)
    except (ValueError, RecursionError) as exc:  # also: invalid UTF-8, a 5000-digit number, nesting past the stack
        reason = str(exc).split("; use sys.set_int_max_str_digits", 1)[0]  # advice for Python callers, not clients
        raise ApiError(400, f"the request body is not valid JSON ({reason})", "invalid_json") from None
    if not isinstance(doc, dict):
        kind = json_type(doc)
        got = kind if kind == "null" else f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"
        raise ApiError(400, f"the request body must be a JSON object, got {got}", "invalid_json")
    try:
        return CompletionRequest.model_validate(doc)
    except ValidationError as exc:
        problems = [f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg'].removeprefix('Value error, ')}"
                    for err in exc.errors()]
        first = exc.errors()[0]["loc"]
        raise ApiError(422, "; ".join(problems), "invalid_value", str(first[0]) if first else None) from None


def _not_json(name: str) -> None:
    # Python's json reads NaN and ±Infinity, JSON has no such numbers: a field's range check would misname them
    raise ValueError(f"{name} is not a JSON number")


def completion(rid: str, model: str, created: int, text: str, finish: str, prompt_tokens: int,
               completion_tokens: int) -> dict:
    """OpenAI's text_completion response."""
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}],
            "usage": usage(prompt_tokens, completion_tokens)}


def chunk(rid: str, model: str, created: int, text: str, finish: str | None, include_usage: bool = False) -> dict:
    """One streamed chunk (same object as the response, text is the delta).

    Under stream_options.include_usage it carries "usage": null, as OpenAI's: only the last chunk counts.
    """
    doc = {"id": rid, "object": "text_completion", "created": created, "model": model,
           "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}]}
    return doc | {"usage": None} if include_usage else doc


def usage_chunk(rid: str, model: str, created: int, prompt_tokens: int, completion_tokens: int) -> dict:
    """The last chunk under stream_options.include_usage: no choices, the usage counts."""
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [],
            "usage": usage(prompt_tokens, completion_tokens)}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    """OpenAI's usage object."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def model_list(names: list[str], created: int | None = None) -> dict:
    """GET /v1/models."""
    created = int(time.time()) if created is None else created
    return {"object": "list", "data": [model_object(n, created) for n in names]}


def model_object(name: str, created: int) -> dict:
    """OpenAI's model object: GET /v1/models/{model}, and each entry of the list."""
    return {"id": name, "object": "model", "created": created, "owned_by": "met"}


def sse(doc: dict | str) -> bytes:
    """One server-sent event: `data: <json>` and a blank line."""
    data = doc if isinstance(doc, str) else json.dumps(doc, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


# Python's type of each JSON value json.loads makes, with JSON's name for it (bool before int: a bool is an int)
_JSON_TYPES = ((type(None), "null"), (bool, "boolean"), (int | float, "number"), (str, "string"), (list, "array"),
               (dict, "object"))


def json_type(value: object) -> str:
    """A parsed JSON value's type in JSON's words (null, not NoneType); "value" for what JSON does not make."""
    return next((name for kind, name in _JSON_TYPES if isinstance(value, kind)), "value")
