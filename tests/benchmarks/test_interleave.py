"""benchmarks/interleave.py: engines run prompt by prompt in turn, a rate per repeat, totals over all."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))

from interleave import interleaved  # noqa: E402


def test_engines_take_turns_per_prompt_and_each_repeat_gets_a_rate():
    # a: 2 tokens in 1 s per prompt; b: 1 token in 0.5 s; two prompts, three repeats
    calls = []

    def engine(name, out, seconds):
        return lambda p: calls.append((name, p[0])) or (out, seconds)

    got = interleaved({"a": engine("a", [7, 8], 1.0), "b": engine("b", [9], 0.5)}, [[1], [2]], 3)
    assert calls[:4] == [("a", 1), ("b", 1), ("a", 2), ("b", 2)] and len(calls) == 12
    assert got.rates == {"a": [2.0] * 3, "b": [2.0] * 3}
    assert got.texts == {"a": [[7, 8], [7, 8]], "b": [[9], [9]]}
    assert got.seconds == {"a": 6.0, "b": 3.0} and got.tokens == {"a": 12, "b": 6}
