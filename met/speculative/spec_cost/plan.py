"""The measured planner: draft depth by expected emitted tokens per joule, with tokens/s as a constraint.

Pure and deterministic: the result depends only on the table, the calibration, the width and
the drafters' confidences; no clock is read. It decides how many drafts are proposed and
verified, never which token is emitted.

Worked example (one sequence, no confidences, every prior 0.5): at k = 2 the expected emitted
tokens are 1 + (0.5 + 0.5 * 0.5) = 1.75; with verify 10 ms + draft 2 ms that is 145.8 tok/s.

What the planner knows of each sequence of the step is one record, PlanSeq: its drafts'
confidences so far, its previous step's first-draft confidence, how far its MTP block is behind,
the tokens it has left and its copy from the history. A sequence it knows nothing of is PlanSeq()
(`unknown(width)` for a whole step).

Planning before a step's first draft: nothing of this step is known yet, so each sequence's
expectation comes from the calibration's carry-over of its previous step's first draft
(`previous`), or from the position priors where it has none.

Catching up: a cell's draft_s is a draft after a drafting step. A sequence whose MTP block is
further behind (a request that never drafted is a whole prompt behind) first catches up on those
rows, at the catchup_s per row of its catch-up pass's width when the table measured it (the runner
groups catch-ups into passes: met.speculative.catchup). That is paid once, for every
later step of the request that drafts, so the planner spreads it over the steps the request has
left at that depth (`remaining` tokens over the tokens a step is expected to emit): a request
near its end does not start drafting for a gain it cannot collect. Worked example: one sequence
256 rows behind at depth 3, catchup_s 20 us: 252 rows past the 4 a depth-3 step leaves, 5.04 ms;
with 128 tokens left at 2.56 tokens per step, 50 steps share it, 0.1008 ms each.

Planning again in the middle of a step: once `drafted` drafts exist, their confidences replace the
guesses and their draft cost is spent whichever depth is chosen now: depth k costs verify(k) +
draft(max(k, drafted)). A choice below `drafted` verifies fewer of the drafts already made; a
choice above it drafts on.

Copying instead of drafting: where the calibration has prompt lookup's rates, a first plan may
also be given each sequence's copy from its history (`copy`: the expected accepted drafts of
its copy at every depth, calibration.copy_accepted_by_depth). A copy costs its verify alone: a
step that copies k deep costs the verify of copies the table measured there (its verify cell,
CostTable.verify_cell), else the cell's verify_s (verify_j), no draft_s, and expects the copies'
accepted drafts. The plan then weighs both: drafting at depths 1..kmax and copying at depths
1..copy_kmax, the plain step (k = 0) once; its choice's `source` says which ("mtp" or "lookup").
Worked example, width 1: plain 2.5 ms; drafting 3 costs verify 4.2 + draft 2.4 ms for 2.7
expected tokens, 413 tok/s; a copy whose bin expects 1.9 accepted drafts at depth 3 costs 4.2 ms
for 2.9 tokens, 690 tok/s: the step copies. A copy has no drafter depth to stop at: it may go as
deep as the table's verify cells price (CostTable.verify_cell; copy_kmax), where a long match's
copy holds: at depth 12 a verify of 6 ms for 8 expected accepted drafts, 1500 tok/s. A copy's step
leaves the drafter's block behind by the tokens it emitted, which the next drafting step catches
up as it does after any step. At widths
above 1 it also weighs a mixed step (estimate_mixed): the sequences whose copy expects at least
what their drafts do copy, the others draft, at the verify of the whole width plus the draft of
those that draft (a cell of their width).
"""

import itertools
import math
from collections.abc import Sequence
from typing import NamedTuple

from met.speculative.catchup import catchup_groups
from met.speculative.spec_capacity import COPY_POOLS
from met.speculative.spec_cost.calibration import AcceptanceCalibration
from met.speculative.spec_cost.table import CostTable


# Records of the planner are tuples (NamedTuple): a plan makes one per depth and the scheduler's
# thread plans several times a step, where a frozen dataclass costs about 1 us more to build.
class DepthEstimate(NamedTuple):
    """What one step at depth k is expected to deliver at a width (tokens count every sequence, bonus included)."""

    k: int
    expected_tokens: float
    wall_s: float
    energy_j: float | None
    tokens_per_s: float
    tokens_per_j: float | None
    source: str = "mtp"  # "mtp": the drafter drafts k; "lookup": each sequence's copy from its history, k deep;
    # "mixed": the sequences `copying` marks copy, the others draft
    copying: tuple[bool, ...] = ()  # "lookup", "mixed": per sequence, whether it copies


class PlanSeq(NamedTuple):
    """One sequence of a step as the planner sees it; every field may be left out (PlanSeq(): the priors alone)."""

    confidences: Sequence[float | None] = ()  # its drafts' top-1 log-probs this step, in chain order (a replan's)
    previous: float | None = None  # its previous step's first-draft top-1 log-prob (None: plain, or none)
    behind: int = 0  # MTP rows its block is behind (0: none to catch up, or a sequence the step will not draft for)
    remaining: int | None = None  # tokens it may still emit (None: unknown, and then no catch-up is priced)
    copy: Sequence[float] | None = None  # a first plan's copy from its history: expected accepted drafts at depths
    # 0, 1, ... (calibration.copy_accepted_by_depth); None: no copy


def unknown(width: int) -> tuple[PlanSeq, ...]:
    """A step of `width` sequences the planner knows nothing of (a table's plan as a banner shows it)."""
    return (PlanSeq(),) * width


class PlanDecision(NamedTuple):
    """The planner's choice of depth k, the figures it was chosen on, and the depth with the most tokens/s."""

    k: int
    expected_tokens: float
    wall_s: float
    energy_j: float | None
    tokens_per_s: float
    tokens_per_j: float | None
    fastest: DepthEstimate
    slack: float
    source: str = "mtp"  # the chosen depth's: "mtp" (drafts), "lookup" (copies) or "mixed" (some of each)
    copying: tuple[bool, ...] = ()  # "lookup", "mixed": per sequence, whether it copies (the others draft)

    @property
    def why(self) -> str:
        """A short reason (written when asked: plans made while drafting are never shown)."""
        best = self.fastest
        what = _named(self.source, self.k, self.copying)
        if self.tokens_per_j is None:
            return f"{what}: the most tokens/s ({self.tokens_per_s:.4g}); no energy source, so tokens/s alone"
        floor = (1.0 - self.slack) * best.tokens_per_s
        return (f"{what}: the most tokens/J ({self.tokens_per_j:.4g}) at >= {floor:.4g} tok/s "
                f"(best {best.tokens_per_s:.4g} at {_named(best.source, best.k, best.copying)}, slack {self.slack:g})")


def _named(source: str, k: int, copying: Sequence[bool]) -> str:
    """A depth as the why names it: k=3, copy k=3, or copy 2 + draft 3 at k=3."""
    if source == "lookup":
        return f"copy k={k}"
    if source == "mixed":
        return f"copy {sum(copying)} + draft {len(copying) - sum(copying)} at k={k}"
    return f"k={k}"


def estimate_depths(table: CostTable, calibration: AcceptanceCalibration, seqs: Sequence[PlanSeq],
                    kmax: int | None = None, drafted: int = 0) -> list[DepthEstimate]:
    """The expected tokens, wall, energy and their rates of each depth 0..=kmax for a step of these sequences.

    (_estimate_depths, which also gives each sequence's expected accepted drafts by depth.)
    """
    return _estimate_depths(table, calibration, seqs, kmax, drafted)[0]


def _estimate_depths(table: CostTable, calibration: AcceptanceCalibration, seqs: Sequence[PlanSeq],
                     kmax: int | None = None, drafted: int = 0) -> tuple[list[DepthEstimate], list[list[float]]]:
    """estimate_depths' estimates, and each sequence's expected accepted drafts at depths 0..=kmax.

    A sequence's `confidences` are its drafts' top-1 log-probs in chain order; drafts past the end
    of them use the calibration's carry-over of `previous`, the top-1 log-prob of its previous
    first draft (None: the position priors).
    `drafted`: drafts this step has already made (their draft cost counts at every depth).
    `behind`, `remaining`: rows a sequence's MTP block is behind and tokens it may still emit;
    when every sequence's remaining is known and the table measured catchup_s, a first plan
    (drafted = 0) prices the catch-up spread over the request's steps left (the module's
    docstring). A sequence 0 rows behind is in no catch-up pass (the runner drafts for none such):
    give 0 for one the step will not draft for (its last token, no KV room), so its catch-up is not
    this step's cost.
    """
    width = len(seqs)
    if not width:
        raise ValueError("a step of no sequences has no depth to plan")
    deepest = table.kmax if kmax is None else min(kmax, table.kmax)
    if deepest < 0:
        raise ValueError(f"kmax {kmax} is negative")
    if isinstance(drafted, bool) or not isinstance(drafted, int) or not 0 <= drafted <= deepest:
        raise ValueError(f"drafted {drafted!r} is not in 0..={deepest}")
    # Each sequence emits its accepted drafts plus the one bonus token; k = 0 emits exactly 1.
    tokens_at = [float(width)] * (deepest + 1)
    per_seq = []  # each sequence's expected accepted drafts at every depth
    for s in seqs:
        per_seq.append(calibration.expected_accepted_by_depth(s.confidences, deepest, s.previous))
        for k, accepted in enumerate(per_seq[-1]):
            tokens_at[k] += accepted
    spent = table.cell(width, drafted)
    # the most rows any sequence is behind, when this plan prices catch-ups (k + 1 rows cost nothing extra)
    priced = drafted == 0 and _knows_remaining(seqs)
    furthest = max(s.behind for s in seqs) if priced else 0
    if furthest > 2:
        behind, remaining = [s.behind for s in seqs], [s.remaining for s in seqs]
        passes = _passes(behind, [b > 0 for b in behind])  # as the runner will run them
    estimates = []
    for k, tokens in enumerate(tokens_at):
        cell = table.cell(width, k)
        drafts = cell if k >= drafted else spent
        wall = cell.verify_s + drafts.draft_s
        if furthest > k + 1 and k and cell.catchup_s:
            wall += _catch_up_share(table, k, passes, behind, remaining, [1.0 + a[k] for a in per_seq])
        energy = None if cell.verify_j is None else cell.verify_j + drafts.draft_j
        estimates.append(DepthEstimate(k, tokens, wall, energy, tokens / wall,
                                       None if energy is None else tokens / energy))
    return estimates, per_seq


def _knows_remaining(seqs: Sequence[PlanSeq]) -> bool:
    """Whether every sequence's tokens left are known: catch-ups are priced only then."""
    return all(s.remaining is not None for s in seqs)


def choose(estimates: Sequence[DepthEstimate], slack: float) -> PlanDecision:
    """The most tokens per joule among depths within `slack` of the best tokens/s (tokens/s alone without joules).

    Comparisons are exact on floats (no tolerance): depths are visited in rising k and a later
    one replaces the choice only when strictly better, so ties go to the smaller depth.
    """
    if not (isinstance(slack, int | float) and math.isfinite(slack) and 0.0 <= slack < 1.0):
        raise ValueError(f"slack {slack!r} is not in [0, 1)")
    fastest = estimates[0]
    for e in estimates[1:]:
        if e.tokens_per_s > fastest.tokens_per_s:
            fastest = e
    chosen = fastest
    if fastest.tokens_per_j is not None:
        floor = (1.0 - slack) * fastest.tokens_per_s
        for e in estimates:  # rising k: the first of equals wins
            if e.tokens_per_s >= floor and (e.tokens_per_j > chosen.tokens_per_j
                                            or (e.tokens_per_j == chosen.tokens_per_j and e.k < chosen.k)):
                chosen = e
    return PlanDecision(*chosen[:6], fastest, slack, chosen.source, chosen.copying)


def copy_depth(table: CostTable, width: int) -> int:
    """The deepest the planner copies at this width: the table's verify depth and the copy pool's, the lesser."""
    return min(table.verify_depth(width), COPY_POOLS.max_drafts(width))


def estimate_copies(table: CostTable, seqs: Sequence[PlanSeq], kmax: int | None = None,
                    fastest_only: bool = False) -> list[DepthEstimate]:
    """The expected tokens, wall, energy and their rates of copying 1..=kmax deep for a step of these sequences.

    A sequence's `copy`: its copy's expected accepted drafts at depths 0, 1, ... (at least kmax + 1
    values; None: it has no copy, and decodes one token in the step). A copy costs the verify
    alone, no drafter pass: its verify cell's verify_s where the table measured one, else the
    cell's (as deep as the table's verify_depth at this width; kmax None: that deep).
    fastest_only: just the depth of the most tokens/s (the shallowest of equals), all a plan by
    tokens/s alone (a table without joules) can choose among copies.
    """
    width = len(seqs)
    deepest = table.verify_depth(width) if kmax is None else min(kmax, table.verify_depth(width))
    copies = [s.copy for s in seqs if s.copy is not None]
    for i, s in enumerate(seqs):
        if s.copy is not None and len(s.copy) <= deepest:
            raise ValueError(f"sequence {i}'s copy holds {len(s.copy)} depths; the plan needs 0..={deepest}")
    # every copy's expected accepted drafts at each depth, summed (the planner's hot loop: one pass)
    accepted = copies[0] if len(copies) == 1 else [sum(c[k] for c in copies) for k in range(deepest + 1)]
    cells = table.verify_row(width)
    depths = range(1, deepest + 1)
    if fastest_only and deepest:
        rates = [(width + accepted[k]) / cells[k].verify_s for k in depths]
        depths = (rates.index(max(rates)) + 1,)
    copying = (True,) * width
    estimates = []
    for k in depths:
        cell = cells[k]
        tokens = width + accepted[k]
        joules = cell.verify_j
        estimates.append(DepthEstimate(k, tokens, cell.verify_s, joules, tokens / cell.verify_s,
                                       None if joules is None else tokens / joules, "lookup", copying))
    return estimates


MIXED_BEHIND = 16  # MTP rows behind past the k + 1 a step leaves, beyond which a mixed step is weighed both ways


def estimate_mixed(table: CostTable, seqs: Sequence[PlanSeq], drafting: Sequence[Sequence[float]],
                   kmax: int | None = None) -> list[DepthEstimate]:
    """Copying where a copy expects at least what drafting does, drafting elsewhere, at each depth 1..=kmax.

    A sequence's `copy`: as estimate_copies; drafting[i]: sequence i's drafts' expected accepted at
    depths 0, 1, ... (calibration.expected_accepted_by_depth). Two steps per depth: one where a
    sequence more than k + 1 + MIXED_BEHIND rows `behind` does not draft (it copies, or decodes one
    token), and one where it does, its catch-up priced. A step costs the verify of cell(width, k),
    the draft of cell(m, k) for the m sequences that draft, and, where every sequence's `remaining`
    is known, their catch-up share (as estimate_depths prices it). A step where every sequence, or
    none, drafts is left out: the drafting and copying estimates price those; so is the second step
    where it equals the first.
    """
    width = len(seqs)
    deepest = table.kmax if kmax is None else min(kmax, table.kmax)
    copies, behind = [s.copy for s in seqs], [s.behind for s in seqs]
    remaining = [s.remaining for s in seqs] if _knows_remaining(seqs) else None
    estimates = []
    for k, far_drafts in itertools.product(range(1, deepest + 1), (False, True)):
        gains, copying, far = [], [], False
        for i, (c, d) in enumerate(zip(copies, drafting, strict=True)):
            copy = c[k] if c is not None else 0.0
            behind_far = behind[i] > k + 1 + MIXED_BEHIND
            copying.append((behind_far and not far_drafts) or copy >= d[k])
            far |= behind_far and not copying[-1]
            gains.append(copy if copying[-1] else d[k])
        m = width - sum(copying)
        if not 0 < m < width or (far_drafts and not far):
            continue
        cell, drafts = table.cell(width, k), table.cell(m, k)
        tokens = width + sum(gains)
        wall = cell.verify_s + drafts.draft_s
        if remaining is not None and drafts.catchup_s:
            caught = [not c and b > 0 for c, b in zip(copying, behind)]
            wall += _catch_up_share(table, k, _passes(behind, caught), behind, remaining, [1.0 + g for g in gains])
        energy = None if cell.verify_j is None else cell.verify_j + drafts.draft_j
        estimates.append(DepthEstimate(k, tokens, wall, energy, tokens / wall,
                                       None if energy is None else tokens / energy, "mixed", tuple(copying)))
    return estimates


def plan_depth(table: CostTable, calibration: AcceptanceCalibration, seqs: Sequence[PlanSeq], slack: float,
               kmax: int | None = None, drafted: int = 0, copy_kmax: int | None = None) -> PlanDecision:
    """The draft depth for a step of these sequences, one PlanSeq each (kmax caps the table's deepest depth).

    drafted > 0: planning again after that many drafts were made (see the module's docstring).
    A sequence's previous first-draft log-prob stands for drafts without confidences; its rows
    behind and tokens left price catch-ups; its copy (a first plan's, estimate_copies) is weighed
    against drafting, copied up to copy_kmax deep (None: kmax, or the table's kmax), past kmax as
    far as the table's verify cells go; a mixed step both drafts and copies, so it stays within both.
    """
    estimates, drafting = _estimate_depths(table, calibration, seqs, kmax, drafted)
    if drafted == 0 and any(s.copy is not None for s in seqs):
        drafts = table.kmax if kmax is None else min(kmax, table.kmax)
        deepest = drafts if copy_kmax is None else copy_kmax
        estimates += estimate_copies(table, seqs, deepest, fastest_only=not table.has_energy)
        if len(seqs) > 1:  # both kinds in one step: as deep as both go
            estimates += estimate_mixed(table, seqs, drafting, min(drafts, deepest))
    return choose(estimates, slack)


def drafting_saving(table: CostTable, calibration: AcceptanceCalibration, width: int, kmax: int) -> float:
    """The share of plain decoding's step time that being able to draft saves per step, at this width.

    The steps after a first draft of some confidence (a carry-over bin, weighted by the first drafts
    the calibration judged in it) draft at their fastest depth where that beats plain decode and
    decode plainly where not: the value of a drafting MTP block, which a sequence that never drafted
    buys by catching it up. By tokens/s; a calibration without carry-over answers with its priors.
    Example: half the steps in a bin where drafting runs 1.25x plain decode, half where it loses:
    0.5 x (1 - 1 / 1.25) = 0.1.
    """
    kmax = min(kmax, table.kmax)  # as estimate_depths caps it
    if kmax < 1:
        return 0.0
    plain = table.cell(width, 0).verify_s
    bins = [(b.outcomes[0], b.upper) for b in calibration.carryover] or [(1, None)]
    total = sum(weight for weight, _ in bins)
    saving = 0.0
    for weight, previous in bins:
        accepted = calibration.expected_accepted_by_depth((), kmax, previous)
        best = min(((c := table.cell(width, k)).verify_s + c.draft_s) / (1.0 + accepted[k])
                   for k in range(1, kmax + 1))  # seconds per sequence-token, at width tokens per step
        saving += weight / total * max(0.0, 1.0 - best / plain)
    return saving


def probe_pays(table: CostTable, calibration: AcceptanceCalibration, width: int, kmax: int,
               behind: Sequence[int], remaining: Sequence[int], saving: float | None = None) -> list[bool]:
    """Per sequence: whether drafting's expected saving over the tokens it has left repays its catch-up.

    The saving: `drafting_saving` of the plain step time those tokens would take (this sequence's
    share of the step: 1 / width). The cost: its share of the catch-up pass the runner would run it
    in, paid at once: the runner catches up only the sequences it drafts for, grouped by
    `catchup_groups`, and a pass of m sequences padded to its longest, L rows, costs the catchup_s of
    width m times L, shared in proportion to their rows. So the answer is consistent: starting from
    every sequence that can draft (rows to catch up on, and a token left after a draft), those that
    do not pay are dropped and the rest priced again in the passes they would then run in, until
    every one left pays for its own pass. Under a table without catch-up costs a sequence pays
    whenever drafting saves anything.
    Example: width 1, plain step 2 ms, saving 0.05, 100 tokens left: 10 ms, against 256 rows at
    20 us: 5.12 ms: it pays. `saving`: drafting_saving's answer for this width and kmax, if known.
    """
    if saving is None:
        saving = drafting_saving(table, calibration, width, kmax)
    if saving <= 0.0:  # drafting never pays here (or there is nothing to draft with: kmax 0)
        return [False] * width
    per_token = saving * table.cell(width, 0).verify_s / width
    pays = [b > 0 and left > 1 for b, left in zip(behind, remaining)]  # one token left: the clamp leaves no draft
    while True:  # each round only drops sequences: at most width + 1 rounds
        cost = [0.0] * width
        for members in _passes(behind, pays):
            for i, paid in _pass_shares(table, 1, len(members), {i: behind[i] for i in members}).items():
                cost[i] = paid
        kept = [ok and per_token * left > paid for ok, left, paid in zip(pays, remaining, cost)]
        if kept == pays:
            return pays
        pays = kept


def _passes(behind: Sequence[int], caught: Sequence[bool]) -> list[list[int]]:
    """Indices of the sequences `caught` up, in the catch-up passes the runner would run them in (catchup_groups)."""
    who = [i for i, c in enumerate(caught) if c]
    return [[who[j] for j in group] for group in catchup_groups([behind[i] for i in who])]


def _catch_up_share(table: CostTable, k: int, passes: Sequence[Sequence[int]], behind: Sequence[int],
                    remaining: Sequence[int], emitted: Sequence[float]) -> float:
    """This step's share of the catch-ups it starts: each sequence's, spread over its steps left at depth k.

    The runner catches up in `passes` (`catchup_groups`); a pass of m sequences whose longest is L
    rows behind costs the catchup_s of width m per row (a cell's catchup_s is per row of every
    sequence), all padded to L. The k + 1 rows a drafting step leaves are in draft_s; the L - (k + 1)
    beyond them are paid by the pass's sequences that are further behind, in proportion to their
    rows past k + 1. Priced by its own pass, a sequence caught up alone pays width 1's cost: on a
    GPU, where a pass of one costs about what a pass of sixteen does, sixteen times its share of a
    full pass.
    """
    share = 0.0
    for members in passes:
        extra = {i: behind[i] - (k + 1) for i in members if behind[i] > k + 1}
        for i, paid in _pass_shares(table, k, len(members), extra).items():
            share += paid / max(1.0, remaining[i] / emitted[i])
    return share


def _pass_shares(table: CostTable, k: int, m: int, rows: dict[int, int]) -> dict[int, float]:
    """Each sequence's share of a catch-up pass of m sequences padded to the most of `rows`: in proportion to its rows.

    The pass costs the catchup_s of cell(m, k) per row of every sequence (none where the table has no
    catch-up cost); rows maps the sequences that pay to the rows they pay for.
    """
    if not rows:
        return {}
    pass_s = (table.cell(m, k).catchup_s or 0.0) * max(rows.values())
    total = sum(rows.values())
    return {i: pass_s * r / total for i, r in rows.items()}
