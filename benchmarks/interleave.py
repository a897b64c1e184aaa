"""Engines timed side by side: every engine on prompt 1, then on prompt 2, ..., repeated.

Interleaving per prompt lets the box's drift over a repeat fall on every engine alike; a repeat's
rate is its tokens over its seconds. The peer comparisons (peer_transformers, peer_llamacpp) share it.
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

Engine = Callable[[list[int]], tuple[list[int], float]]  # prompt -> (new tokens, seconds)


@dataclass(frozen=True, slots=True)
class Interleaved:
    """Each engine's rate per repeat, its outputs of the last repeat, and its totals over every repeat."""

    rates: dict[str, list[float]]  # tokens/s of each repeat
    texts: dict[str, list[list[int]]]  # the last repeat's new tokens, prompt by prompt
    seconds: dict[str, float]  # over every repeat
    tokens: dict[str, int]  # over every repeat


def interleaved(engines: Mapping[str, Engine], prompts: Sequence[list[int]], repeats: int) -> Interleaved:
    """Run every engine on every prompt, interleaved per prompt, `repeats` times."""
    rates: dict[str, list[float]] = {name: [] for name in engines}
    seconds_of, tokens_of = dict.fromkeys(engines, 0.0), dict.fromkeys(engines, 0)
    texts: dict[str, list[list[int]]] = {}
    for _ in range(repeats):
        tokens, seconds = dict.fromkeys(engines, 0), dict.fromkeys(engines, 0.0)
        texts = {name: [] for name in engines}
        for p in prompts:
            for name, run in engines.items():
                toks, s = run(p)
                tokens[name] += len(toks)
                seconds[name] += s
                texts[name].append(toks)
        for name in engines:
            rates[name].append(tokens[name] / seconds[name])
            seconds_of[name] += seconds[name]
            tokens_of[name] += tokens[name]
    return Interleaved(rates, texts, seconds_of, tokens_of)
