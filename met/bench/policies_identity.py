"""Greedy identity across `met bench policies`' runs: every request's output against the reference run's.

Speculation decides how many drafts are verified, never which token is emitted, and batching
must not change a greedy token either; so every run's output of a prompt must equal the first
run's (the first policy at the first concurrency). Token ids are compared where the run saw them,
else the text.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from met.bench.policies import Output, Run


@dataclass(frozen=True, slots=True)
class Mismatch:
    """A request whose output differs from the reference run's (or that failed): where, and how."""

    policy: str
    concurrency: int
    repeat: int
    prompt: int
    detail: str

    def message(self) -> str:
        """One line naming the policy, concurrency, repeat and prompt."""
        return (f"policy {self.policy} at concurrency {self.concurrency} (repeat {self.repeat + 1}), "
                f"prompt {self.prompt}: {self.detail}")


def mismatches(runs: Sequence[Run]) -> list[Mismatch]:
    """Every output unlike the first run's output of the same prompt (greedy must not depend on policy or width)."""
    if not runs:
        return []
    ref = runs[0]
    out = []
    for run in runs:
        for i, (got, want) in enumerate(zip(run.outputs, ref.outputs)):
            detail = _difference(got, want, ref)
            if detail:
                out.append(Mismatch(run.policy, run.concurrency, run.repeat, i, detail))
    return out


def _difference(got: Output, want: Output, ref: Run) -> str:
    """Why got is not want ('' when equal): a failure, or the first token or character that differs."""
    if got.failure is not None:
        return f"the request failed: {got.failure}"
    where = f"{ref.policy} at concurrency {ref.concurrency}"
    if got.tokens is not None and want.tokens is not None and got.tokens != want.tokens:
        at = next((j for j, (a, b) in enumerate(zip(got.tokens, want.tokens)) if a != b),
                  min(len(got.tokens), len(want.tokens)))
        a = got.tokens[at] if at < len(got.tokens) else "(end)"
        b = want.tokens[at] if at < len(want.tokens) else "(end)"
        return f"token {at} is {a} where {where} gave {b} ({len(got.tokens)} vs {len(want.tokens)} tokens)"
    if got.text != want.text:
        at = next((j for j, (a, b) in enumerate(zip(got.text, want.text)) if a != b),
                  min(len(got.text), len(want.text)))
        return f"text differs from {where}'s at character {at}: {got.text[at:at + 20]!r} vs {want.text[at:at + 20]!r}"
    return ""
