"""What a verify does to the target's logits besides picking: the logits processors and the log-probabilities.

Processors (penalties, token biases, the min_tokens ban on end-of-sequence ids) read a sequence's
history. A verify scores [pending, d1, ..., dk] in one forward; row j must see the history as
plain decoding would when it picks that token: the tokens emitted so far and the drafts d1..dj.
So `process` builds each row's counts as the history's plus the drafts before it, and the
accepted tokens, the bonus included, are then exactly those plain decoding with the same
processors emits (greedy), or distributed as it would be (sampled): speculation stays lossless.

Log-probabilities are the target's own next-token distribution, log_softmax of the raw logits
(before temperature and processors, as vLLM reports them by default): a client scoring text
(lm-eval's loglikelihood) gets the model's figures whatever sampling the request asked for.
Both are computed only for the sequences that ask, so a plain request pays nothing.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch

MAX_LOGPROBS = 20  # most top alternatives a position returns (OpenAI's chat limit; completions take 5)


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A token the sequence holds, its log-probability under the target, and the most likely alternatives."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token, log-prob) of the n likeliest tokens, likeliest first


class History:
    """A sequence's tokens as the processors count them: tokens seen (prompt + output) and output counts."""

    __slots__ = ("seen", "counts", "out")

    def __init__(self, prompt: Sequence[int], vocab: int, device: torch.device) -> None:
        self.seen = torch.zeros(vocab, dtype=torch.bool, device=device)  # [V] in the prompt or the output
        self.seen[torch.tensor(list(prompt), dtype=torch.long, device=device)] = True
        self.counts = torch.zeros(vocab, dtype=torch.float64, device=device)  # [V] times each token was output
        self.out = 0  # output tokens so far

    def add(self, tokens: Sequence[int]) -> None:
        """Count tokens the sequence emitted (its pending token included)."""
        for t in tokens:
            self.counts[t] += 1
            self.seen[t] = True
        self.out += len(tokens)


def process(logits: torch.Tensor, sampling, history: History, drafts: Sequence[int]) -> torch.Tensor:
    """Processed logits [T, V] (float64) of rows logits [T, V], row j after the history and drafts[:j].

    sampling: the sequence's Sampling (its penalties, logit_bias, min_tokens, eos_ids). Order as
    vLLM's: min_tokens ban, logit bias, then the penalties.
    Repetition penalty (HF's): a seen token's positive logit is divided by it, a negative one
    multiplied. Frequency: minus f x the token's output count. Presence: minus p if it was output.
    """
    x = logits.double().clone()  # [T, V]
    T, V = x.shape
    counts = history.counts.expand(T, V).clone()  # [T, V] output counts each row sees
    seen = history.seen.expand(T, V).clone()  # [T, V]
    for j, t in enumerate(drafts[: T - 1]):
        counts[j + 1 :, t] += 1
        seen[j + 1 :, t] = True
    if sampling.min_tokens and sampling.eos_ids:
        banned = torch.tensor(sorted(sampling.eos_ids), dtype=torch.long, device=x.device)
        for j in range(T):
            if history.out + j < sampling.min_tokens:  # the row picks output token number out + j
                x[j, banned] = float("-inf")
    for token, bias in sampling.logit_bias:
        x[:, token] += bias
    if sampling.repetition_penalty != 1.0:
        r = sampling.repetition_penalty
        x = torch.where(seen, torch.where(x > 0, x / r, x * r), x)
    if sampling.frequency_penalty:
        x = x - sampling.frequency_penalty * counts
    if sampling.presence_penalty:
        x = x - sampling.presence_penalty * (counts > 0).double()
    return x


def token_logprobs(logits: torch.Tensor, tokens: Sequence[int], top: int) -> list[TokenLogprob]:
    """Each token's log-probability under its row of logits [T, V] (row j scores tokens[j]) and the top ones."""
    logp = torch.log_softmax(logits.double(), -1)  # [T, V]
    rows = torch.arange(len(tokens), device=logp.device)
    chosen = logp[rows, torch.tensor(list(tokens), dtype=torch.long, device=logp.device)].tolist()
    if top:
        values, indices = logp.topk(min(top, logp.shape[-1]), -1)
        alts = [tuple(zip(i, v)) for i, v in zip(indices.tolist(), values.tolist())]
    else:
        alts = [()] * len(tokens)
    return [TokenLogprob(t, lp, a) for t, lp, a in zip(tokens, chosen, alts)]
