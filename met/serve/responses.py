"""OpenAI's response shapes: completions and chat completions, their stream chunks, usage, log-probabilities, models.

Log-probabilities come as the engine's TokenLogprob records; here they become OpenAI's two
shapes. Completions: parallel lists `tokens`, `token_logprobs`, `top_logprobs` (a map token text
-> log-prob holding the top alternatives and the token itself, as vLLM's) and `text_offset` (each
token's first character in the choice's text); under echo the prompt's tokens come first, the very
first with null figures (nothing predicts it). Chat: `content`, a list of {token, logprob, bytes,
top_logprobs}. A token's text is its decoded text; a byte token that is not a whole character is
written `bytes:\\xNN`, as OpenAI writes such tokens.
"""

import json
import time
from collections.abc import Sequence

from met.engine.logits import TokenLogprob
from met.model.tokenizer import Tokenizer


def token_text(tokenizer: Tokenizer, token: int) -> str:
    """A token's text in log-probabilities (bytes:\\xNN for a byte that is not a character by itself)."""
    text = tokenizer.decode([token])
    if "\ufffd" in text and tokenizer.name == "byte" and token < 256:
        return f"bytes:\\x{token:02x}"
    return text


def token_bytes(tokenizer: Tokenizer, token: int) -> list[int]:
    """A token's UTF-8 bytes (chat log-probabilities' `bytes`)."""
    if tokenizer.name == "byte":
        return [token] if token < 256 else []
    return list(tokenizer.decode([token]).encode("utf-8"))


def completion_logprobs(tokenizer: Tokenizer, entries: Sequence[TokenLogprob | int], top: int,
                        texts: Sequence[str] | None = None) -> dict:
    """OpenAI's completions logprobs object; an int entry is a token without figures (echo's first).

    texts: each token's text as the choice's text holds it (for text_offset); default: token_text.
    """
    out: dict = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    offset = 0
    for i, e in enumerate(entries):
        token = e if isinstance(e, int) else e.token
        out["tokens"].append(token_text(tokenizer, token))
        out["text_offset"].append(offset)
        offset += len(texts[i]) if texts is not None else len(tokenizer.decode([token]))
        if isinstance(e, int):
            out["token_logprobs"].append(None)
            out["top_logprobs"].append(None)
            continue
        out["token_logprobs"].append(e.logprob)
        alts = {token_text(tokenizer, t): lp for t, lp in e.top[:top]}
        alts.setdefault(token_text(tokenizer, e.token), e.logprob)  # the token itself, as vLLM's
        out["top_logprobs"].append(alts)
    return out


def chat_logprobs(tokenizer: Tokenizer, entries: Sequence[TokenLogprob], top: int) -> dict:
    """OpenAI's chat logprobs object: {"content": [{token, logprob, bytes, top_logprobs}, ...]}."""
    def one(token: int, logprob: float) -> dict:
        return {"token": token_text(tokenizer, token), "logprob": logprob, "bytes": token_bytes(tokenizer, token)}

    return {"content": [one(e.token, e.logprob) | {"top_logprobs": [one(t, lp) for t, lp in e.top[:top]]}
                        for e in entries]}


def usage(prompt_tokens: int, completion_tokens: int, drafts: tuple[int, int] | None = None) -> dict:
    """OpenAI's usage object; drafts (verified, accepted) adds the request's speculation counts."""
    doc = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
           "total_tokens": prompt_tokens + completion_tokens}
    if drafts is not None:
        # drafts verified for the request and how many of them were accepted (the bonus tokens not counted)
        doc["speculation"] = {"draft_tokens": drafts[0], "accepted_tokens": drafts[1]}
    return doc


def completion(rid: str, model: str, created: int, choices: list[dict], use: dict) -> dict:
    """OpenAI's text_completion response."""
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": choices,
            "usage": use}


def completion_choice(index: int, text: str, finish: str | None, logprobs: dict | None = None) -> dict:
    """One choice of a completion (or, its text a delta, of a chunk)."""
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}


def chat(rid: str, model: str, created: int, choices: list[dict], use: dict) -> dict:
    """OpenAI's chat.completion response."""
    return {"id": rid, "object": "chat.completion", "created": created, "model": model, "choices": choices,
            "usage": use}


def chat_choice(index: int, text: str, finish: str, logprobs: dict | None = None) -> dict:
    """One choice of a chat completion."""
    return {"index": index, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
            "finish_reason": finish}


def chat_delta(index: int, delta: dict, finish: str | None = None, logprobs: dict | None = None) -> dict:
    """One choice of a chat chunk: delta is {"role": "assistant"} first, then {"content": text}."""
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}


def chunk(kind: str, rid: str, model: str, created: int, choices: list[dict], use: dict | None = None,
          usage_key: bool = False) -> dict:
    """A stream chunk; kind "text_completion" or "chat.completion.chunk".

    usage_key: the chunk carries "usage" (null until the last, under include_usage; the running counts
    under continuous_usage_stats).
    """
    doc = {"id": rid, "object": kind, "created": created, "model": model, "choices": choices}
    return doc | {"usage": use} if usage_key or use is not None else doc


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
