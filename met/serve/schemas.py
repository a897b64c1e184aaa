"""The request bodies met serves (validated with pydantic) and how a body is parsed into one.

Fields OpenAI and vLLM define are typed strictly, as OpenAI's API types them ("5" is not a
max_tokens, nor true a stream; an int is still a float): a wrong type or range is a 400
invalid_request_error naming the field. A field met does not know, or knows and does not
implement (`IGNORED`), is accepted and left out: the response names it in the
x-met-ignored-fields header and the server's log, as vLLM does, instead of failing a client that
sends it by default.
"""

import json
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from met.engine.prompts import unencodable
from met.serve.errors import ApiError

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions
MAX_CHOICES = 16  # n and best_of: each choice takes a KV slot of its own
MAX_PROMPTS = 64  # prompts in one completions request
# known fields met accepts and does not apply (they change nothing met can do, or nothing it returns)
IGNORED = ("user", "skip_special_tokens", "spaces_between_special_tokens", "truncate_prompt_tokens", "priority",
           "tool_choice", "parallel_tool_calls", "response_format", "service_tier", "store", "metadata",
           "prompt_logprobs", "return_tokens_as_token_ids", "continue_final_message", "documents",
           "request_id", "cache_salt", "kv_transfer_params", "vllm_xargs", "detokenize", "length_penalty",
           "use_beam_search", "guided_json", "guided_regex", "guided_choice", "structured_outputs", "modalities",
           "audio", "prediction", "reasoning_effort", "web_search_options", "verbosity", "safety_identifier",
           "prompt_cache_key", "functions", "function_call")

Float = Annotated[float, Field(allow_inf_nan=False)]
TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]


class StreamOptions(BaseModel):
    """stream_options: include_usage adds a last chunk with the usage; continuous_usage_stats puts it on every chunk."""

    model_config = ConfigDict(extra="ignore", strict=True)
    include_usage: bool = False
    continuous_usage_stats: bool = False


class Sampled(BaseModel):
    """The fields completions and chat share: sampling, stopping, streaming and the vLLM extensions."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str
    temperature: Annotated[Float, Field(ge=0.0, le=2.0)] | None = Field(
        1.0, description="Sampling temperature; 1.0 when not sent (OpenAI's default); 0 for greedy text.")
    top_p: Annotated[Float, Field(gt=0.0, le=1.0)] | None = 1.0
    n: Annotated[int, Field(ge=1, le=MAX_CHOICES)] | None = 1
    stop: str | Annotated[list[str], Field(max_length=4)] | None = None
    seed: Annotated[int, Field(ge=-(1 << 63), lt=1 << 64)] | None = None  # what torch.Generator takes
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    presence_penalty: Annotated[Float, Field(ge=-2.0, le=2.0)] | None = 0.0
    frequency_penalty: Annotated[Float, Field(ge=-2.0, le=2.0)] | None = 0.0
    logit_bias: dict[str, Annotated[Float, Field(ge=-100.0, le=100.0)]] | None = None
    # vLLM's extensions (extra_body)
    top_k: Annotated[int, Field(ge=-1)] | None = None  # -1 or 0: no top-k
    min_p: Annotated[Float, Field(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[Float, Field(ge=0.01, le=100.0)] | None = None  # past these, logits overflow
    min_tokens: Annotated[int, Field(ge=0)] | None = None
    ignore_eos: bool | None = False
    include_stop_str_in_output: bool | None = False
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = None

    @field_validator("stop")
    @classmethod
    def _stop_not_empty(cls, value: str | list[str] | None) -> str | list[str] | None:
        for s in [] if value is None else [value] if isinstance(value, str) else value:
            if s == "":
                raise ValueError("a stop string must not be empty")
            if (bad := unencodable(s)) is not None:  # a lone surrogate: no text the model writes could match it
                raise ValueError(f"a stop string {bad}")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _bias_keys_are_ids(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key in value or {}:
            if not key.isdigit() or not key.isascii():
                raise ValueError(f"keys are token ids as strings, got {key!r}")
        return value

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

    def ignored(self) -> list[str]:
        """The fields sent that met does not apply: unknown ones and IGNORED ones that are set."""
        extra = sorted(self.model_extra or {})
        return [f for f in extra if f not in IGNORED or (self.model_extra or {}).get(f) is not None]


class CompletionRequest(Sampled):
    """POST /v1/completions."""

    prompt: str | list[str] | TokenIds | list[TokenIds]  # one or several prompts: text or token ids
    max_tokens: Annotated[int, Field(ge=0)] | None = DEFAULT_MAX_TOKENS  # None: up to the context; 0 only with echo
    best_of: Annotated[int, Field(ge=1, le=MAX_CHOICES)] | None = None
    echo: bool | None = False
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None  # top alternatives per token, as OpenAI's (0..5)
    suffix: str | None = None
    add_special_tokens: bool | None = True  # vLLM's: the tokenizer's special tokens (BOS) added to a text prompt

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompts(cls, value: object) -> object:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not value:
            raise ValueError("must be a non-empty prompt: a string, a list of strings, a list of token ids or a list "
                             "of lists of token ids")
        if all(isinstance(t, int) and not isinstance(t, bool) for t in value):
            value = [value]
        if len(value) > MAX_PROMPTS:
            raise ValueError(f"at most {MAX_PROMPTS} prompts in one request, got {len(value)}")
        for p in value:
            if isinstance(p, str):
                if not p:
                    raise ValueError("a prompt must not be empty")
                if (bad := unencodable(p)) is not None:  # JSON's \ud800 escapes decode to lone surrogates
                    raise ValueError(bad)
            elif isinstance(p, list):
                if not p or not all(isinstance(t, int) and not isinstance(t, bool) for t in p):
                    raise ValueError("a token-id prompt must be a non-empty list of integers")
                if bad := [t for t in p if t < 0]:  # the model's vocabulary is checked when the request is queued
                    raise ValueError(f"token ids {bad[:5]} are negative")
            else:
                raise ValueError("each prompt must be a string or a list of token ids")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "CompletionRequest":
        if self.suffix:
            raise ApiError(400, "suffix (insertion) is not served: the model completes text at its end only",
                           "unsupported_value", "suffix")
        if self.max_tokens == 0 and not self.echo:
            raise ApiError(400, "max_tokens = 0 generates nothing; it is only useful with echo = true (to score the "
                           "prompt)", "invalid_value", "max_tokens")
        if self.best_of is not None and self.best_of < (self.n or 1):
            raise ApiError(400, f"best_of ({self.best_of}) must be at least n ({self.n})", "invalid_value", "best_of")
        if self.best_of is not None and self.best_of > 1 and self.stream:
            raise ApiError(400, "best_of > 1 cannot be streamed (the best are known only at the end)",
                           "invalid_value", "best_of")
        return self

    def prompts(self) -> list[str | list[int]]:
        """The prompts, each a text or token ids (the validator made a list of them)."""
        return list(self.prompt)  # type: ignore[arg-type]


class ContentPart(BaseModel):
    """A part of a message's content: only text parts are served."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: str
    text: str | None = None


class Message(BaseModel):
    """A chat message; fields besides role and content (name, tool_calls, ...) reach the template as sent."""

    model_config = ConfigDict(extra="allow", strict=True)
    role: str
    content: str | list[ContentPart] | None = None

    def for_template(self) -> dict:
        """The message as the template sees it: text parts joined by newlines, as vLLM joins them."""
        doc = self.model_dump(exclude_none=False)
        if isinstance(self.content, list):
            for part in self.content:
                if part.type != "text" or part.text is None:
                    raise ApiError(400, f"a {part.type!r} content part is not served: this model reads text only",
                                   "unsupported_value", "messages")
            doc["content"] = "\n".join(p.text or "" for p in self.content)
        return doc


class ChatRequest(Sampled):
    """POST /v1/chat/completions."""

    messages: Annotated[list[Message], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None  # None: up to the context
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None  # OpenAI's newer name; wins when both are sent
    logprobs: bool | None = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    tools: list[dict] | None = None  # handed to the template (met parses no tool calls out of the text)
    add_generation_prompt: bool | None = True
    chat_template_kwargs: dict | None = None

    @model_validator(mode="after")
    def _consistent(self) -> "ChatRequest":
        if self.top_logprobs and not self.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs = true", "invalid_value", "top_logprobs")
        return self

    def limit(self) -> int | None:
        """The most tokens to generate (None: up to the context)."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class TokenizeRequest(BaseModel):
    """POST /tokenize (vLLM's): a text prompt, or chat messages rendered by the template."""

    model_config = ConfigDict(extra="allow", strict=True)
    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None
    add_special_tokens: bool | None = True
    add_generation_prompt: bool | None = True
    return_token_strs: bool | None = False

    @model_validator(mode="after")
    def _one_input(self) -> "TokenizeRequest":
        if (self.prompt is None) == (self.messages is None):
            raise ApiError(400, "send a prompt or messages (one of them)", "invalid_value", "prompt")
        return self


class DetokenizeRequest(BaseModel):
    """POST /detokenize (vLLM's)."""

    model_config = ConfigDict(extra="allow", strict=True)
    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0)]]


def parse(raw: bytes, model: type[BaseModel]) -> BaseModel:
    """The request from a body: ApiError 400 if it is not a JSON object or a field is invalid (naming the field)."""
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
        return model.model_validate(doc)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        problems = [f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg'].removeprefix('Value error, ')}"
                    for err in errors]
        first = errors[0]["loc"]
        raise ApiError(400, "; ".join(_unique(problems)), "invalid_value", str(first[0]) if first else None) from None


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _not_json(name: str) -> None:
    # Python's json reads NaN and ±Infinity, JSON has no such numbers: a field's range check would misname them
    raise ValueError(f"{name} is not a JSON number")


# Python's type of each JSON value json.loads makes, with JSON's name for it (bool before int: a bool is an int)
_JSON_TYPES = ((type(None), "null"), (bool, "boolean"), (int | float, "number"), (str, "string"), (list, "array"),
               (dict, "object"))


def json_type(value: object) -> str:
    """A parsed JSON value's type in JSON's words (null, not NoneType); "value" for what JSON does not make."""
    return next((name for kind, name in _JSON_TYPES if isinstance(value, kind)), "value")
