"""Greedy identity across `met bench policies`' runs: every request's output against the reference run's.

Speculation decides how many drafts are verified, never which token is emitted, and batching
must not change a greedy token either; so every run's output of a prompt must equal the first
run's (the first policy at the first concurrency) that did not fail it. A failed request is named
as a failure, never used as the reference: its partial output would make every run that finished
it read as differing. Token ids are compared where the run saw them, else the text.
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
    failed: bool = False  # the request failed (detail says how); False: its output differs from the reference

    def message(self) -> str:
        """One line naming the policy, concurrency, repeat and prompt."""
        return (f"policy {self.policy} at concurrency {self.concurrency} (repeat {self.repeat + 1}), "
                f"prompt {self.prompt}: {self.detail}")


def mismatches(runs: Sequence[Run]) -> list[Mismatch]:
    """Every failed request, and every output unlike the first run's that finished the same prompt.

    Greedy must not depend on policy or width.
    """
    refs: dict[int, tuple[Output, Run]] = {}  # prompt -> the first output of it that did not fail, and its run
    for run in runs:
        for i, got in enumerate(run.outputs):
            if got.failure is None:
                refs.setdefault(i, (got, run))
    out = []
    for run in runs:
        for i, got in enumerate(run.outputs):
            if got.failure is not None:
                out.append(Mismatch(run.policy, run.concurrency, run.repeat, i,
                                    f"the request failed: {got.failure}", failed=True))
            elif (detail := _difference(got, *refs[i])):
                out.append(Mismatch(run.policy, run.concurrency, run.repeat, i, detail))
    return out


def _difference(got: Output, want: Output, ref: Run) -> str:
    """Why got is not want ('' when equal): the first token or character that differs."""
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
