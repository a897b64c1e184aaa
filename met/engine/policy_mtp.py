"""MTP drafting policies: the static one (gate, ladder, adaptive rung), the measured planner's, and a fixed depth.

Static (`--spec mtp`): the MTP gate chooses MTP verify or plain decode by the throughput each
mode delivered; in MTP mode the depth is the ladder's, lifted by the adaptive rung at widths
9..=16 (which the default verify pools clamp back to one draft unless --lift-wide-tier).

Measured (`--spec mtp --spec-cost-model measured`): SpecCostState.plan chooses k, the most
expected tokens per joule within the slack of the best tokens/s (tokens/s alone without joules);
k = 0 is a plain decode step, so the gate is not used. Whether to draft at all is decided before
any draft of the step exists, so that first plan reads the calibration's carry-over: the next
step's acceptance by the top-1 log-prob of each sequence's previous first draft, fitted on
consecutive steps (a draft's own confidence says less about the next step's drafts: after a first
draft under log-prob -1, the next step's first draft was accepted 0.65 of the time where the
own-confidence bins say 0.32-0.44; benchmarks/studies/confidence_carryover.py). New sequences, and
sequences whose last step was plain, use the position priors. Once it drafts, the planner plans
again after every MTP pass with the confidences of the drafts just made, their cost already spent
(the carry-over still stands for the positions not drafted yet): it drafts deeper while the next
draft is expected to pay for itself and stops, or drops drafts, when not. kmax is the least of the
table's, the model's MTP depth and the width tier's verify pool. The first plan also prices what
drafting first costs a sequence whose MTP block is far behind (a request that never drafted is a
whole prompt behind): the table's catch-up cost per row, spread over the steps the request has
left (met.speculative.spec_cost.plan).
Copies: where the calibration has prompt lookup's rates (met.speculative.spec_cost.lookup), each
sequence's history is indexed (suffixes up to LOOKUP_MAX_NGRAM tokens) and the first plan also
weighs verifying each sequence's copy of what followed its history's longest recurring suffix,
priced at the verify alone (plan.estimate_copies), and, at widths above 1, a mixed step: copies
for the sequences whose copy expects at least what drafting does, MTP drafts for the others
(plan.estimate_mixed; its step's mode is "mtp", its why "copy c + draft d at k=..."). When copying
wins, the step verifies the copies, as deep as the plan chose (a sequence without a copy decodes
one token, in a mixed step one that drafts drafts without replans), and a copy leaves no
confidences: the next plan reads the priors for it, as after a plain step. Copies come from the
sequence's own history, and, where the calibration has bins for them (`shared_lookup`), from the
tenant's shared lookup cache of finished requests: a sequence weighs the shared copy instead of its
own only where the shared match is the longer (its own text wins a tie), priced by those bins. A
copy has no drafter depth: it goes as deep as the table prices verifies (its verify cells,
CostTable.verify_depth) and the copy pools hold (spec_capacity.COPY_POOLS: 16 at
width 1), where the MTP drafts stop at kmax; a mixed step drafts, so it stays within kmax.
A plain step leaves no confidences, so the next plan reads the priors; where the priors favour
plain decode the planner would never draft again, however predictable the text became. So after
PROBE_AFTER plain steps in a row, a step drafts anyway and verifies at least one draft (its
replans still choose how many more): the drafts' confidences are what the next plan reads. A probe
is dear: its MTP pass first catches up on every row of the plain steps before it (at width 16 after
16 plain steps, 3.2x a draft after a drafting step: benchmarks/studies/mtp_catchup.py). So a probe the next
plan does not follow with drafts of its own doubles the run of plain steps before the next probe,
up to PROBE_AFTER_MAX; a step that drafts by plan sets it back to PROBE_AFTER. A sequence whose MTP
block is more than PROBE_AFTER_MAX + 1 rows behind (one that never drafted, whose catch-up is its
whole prompt: width 16, 200-token prompts, 66 ms, ten plain steps; benchmarks/studies/mtp_catchup.py) is
probed only where that pays (plan.probe_pays): drafting in the steps whose carry-over favours it,
at the share of step time the calibration's carry-over bins say that saves, over the tokens the
sequence has left, must save more than its catch-up costs. Without that, a request whose first
plan chose plain decode (the priors, the calibration's average, a little short) never drafted,
however predictable its text.

Fixed depth (`met bench policies`' baselines): the same k every step, no gate; the capacity clamp
still applies, so the default pools verify one draft at widths 9..=16 whatever k is.

Each policy drafts with the MTP module by default, or with the runner's draft model in its place
(drafter "draft", `--spec draft`), or its EAGLE-3 head (drafter "eagle", `--spec eagle`): each
drafts token by token with top-1 log-probabilities as confidences, so the gate, the ladder and the
planner (with the drafter's own table and calibration) apply to any of them unchanged.
"""

from collections.abc import Mapping, Sequence
from dataclasses import replace

from met.engine.policy_base import (NO_COPIES, CopySettings, Outcome, Rooms, StepPlan, clamp_depths, drafting,
                                   joined)
from met.engine.requests import SeqState
from met.engine.runner import Draft, ModelRunner, Replan
from met.speculative.adaptive_rung import AdaptiveRung
from met.speculative.ladder import mtp_ladder_drafts
from met.speculative.mtp_gate import MtpGate, Mode
from met.speculative.spec_capacity import COPY_POOLS, VerifyPools, planned_kmax
from met.speculative.spec_cost import SpecCostState
from met.speculative.spec_cost.lookup import LOOKUP_MAX_NGRAM
from met.speculative.spec_cost.plan import PlanSeq, copy_depth


_DRAFT_METHODS = {"mtp": "draft_mtp", "draft": "draft_small", "eagle": "draft_eagle"}  # drafter -> ModelRunner method


def _draft(runner: ModelRunner, seqs: Sequence[SeqState], plan: StepPlan, drafter: str,
           replan: Replan | None = None) -> list[Draft]:
    if not any(plan.depths):
        return [Draft([], []) for _ in seqs]
    run = getattr(runner, _DRAFT_METHODS[drafter])
    return run([s.slot for s in seqs], list(plan.depths), replan)


def _behind(runner: ModelRunner, drafter: str, slot: int) -> int:
    """Rows the drafter runs for the slot before its first draft (its catch-up)."""
    if drafter == "mtp":
        return runner.mtp_behind(slot)
    return (runner.draft_model if drafter == "draft" else runner.eagle).behind_rows(slot)


class MtpLadderPolicy:
    """--spec mtp, static cost model: gate -> ladder + adaptive rung -> clamp."""

    copies = NO_COPIES

    def __init__(self, num_drafts: int, pools: VerifyPools, environ: Mapping[str, str], drafter: str = "mtp"):
        self.name = self.drafter = drafter  # "mtp", or "draft" / "eagle": the runner's draft model or EAGLE-3 head
        self.num_drafts = num_drafts  # the drafter's deepest draft (the model's MTP depth)
        self.pools = pools
        self.env = dict(environ)
        self.gate = MtpGate()
        self.rung = AdaptiveRung.from_env(self.env)

    def plan(self, runner: ModelRunner, seqs: Sequence[SeqState]) -> StepPlan:
        width = len(seqs)
        if self.gate.mode() is Mode.PLAIN:
            return StepPlan("plain", 0, (0,) * width, "gate:plain")
        depth = self.rung.drafts_for(width, self.num_drafts, self.env)
        why = "rung:two" if depth > mtp_ladder_drafts(width, self.num_drafts) else "ladder"
        depths, clamp = clamp_depths(depth, runner, seqs, self.pools)
        return StepPlan(drafting(self.drafter, depths), depth, depths, joined(why, clamp))

    def draft(self, runner: ModelRunner, seqs: Sequence[SeqState], plan: StepPlan) -> list[Draft]:
        return _draft(runner, seqs, plan, self.drafter)

    def observe(self, plan: StepPlan, outcomes: Sequence[Outcome], seconds: float) -> None:
        mode = Mode.PLAIN if plan.mode == "plain" else Mode.MTP
        if seconds > 0:
            self.gate.observe(mode, sum(o.emitted for o in outcomes), seconds)
        used = max(plan.depths, default=0)
        full = [o for o in outcomes if o.proposed == used]  # sequences the KV room did not cut short
        if used > 0 and full:
            self.rung.observe(len(outcomes), used, len(full), sum(o.accepted for o in full),
                              sum(o.accepted > 0 for o in full))


PROBE_AFTER = 16  # plain steps in a row after which the measured planner's next step drafts anyway
PROBE_AFTER_MAX = 128  # the longest run of plain steps between probes, after probes that found nothing
PROBE_BEHIND_MAX = PROBE_AFTER_MAX + 1  # a probe drafts for a sequence at most this many MTP rows behind


class MtpPlannedPolicy:
    """--spec mtp --spec-cost-model measured: the planner's k -> clamp (with probes after runs of plain steps)."""

    def __init__(self, state: SpecCostState, num_drafts: int, pools: VerifyPools, drafter: str = "mtp"):
        self.drafter = drafter  # "mtp", "draft" or "eagle": whose table and calibration, whose drafts
        self.name = f"{drafter}/measured"
        self.state = state
        self.num_drafts = num_drafts
        self.pools = pools
        self.plain_steps = 0  # plain steps in a row
        self.probe_after = PROBE_AFTER  # plain steps in a row before the next probe
        self.probing = False  # the step being planned drafts to refresh the confidences
        copying = bool(state.calibration.lookup)  # the scheduler indexes histories where the calibration prices copies
        # and other requests' tokens, in the shared lookup cache, where it prices copies from there
        shared = copying and bool(state.calibration.shared_lookup)
        self.copies = CopySettings(copy_ngram=LOOKUP_MAX_NGRAM if copying else 0,
                                   shared_ngram=LOOKUP_MAX_NGRAM if shared else 0)
        self._copies: list[list[int]] = []  # the copies the last plan weighed, one per sequence
        self._shared: list[bool] = []  # whether each of them came from the shared lookup cache
        self._kmax: dict[int, int] = {}  # by width: kmax and copy_kmax, asked every plan, fixed for the serve
        self._copy_kmax: dict[int, int] = {}

    def kmax(self, width: int) -> int:
        """The deepest a step of this width plans: the table's, the model's MTP depth and the verify pool, the least."""
        if (known := self._kmax.get(width)) is None:
            known = self._kmax[width] = planned_kmax(width, self.state.table.kmax, self.num_drafts, self.pools)
        return known

    def copy_kmax(self, width: int) -> int:
        """The deepest a step of this width copies (plan.copy_depth: the table's verify depth and the copy pool)."""
        if (known := self._copy_kmax.get(width)) is None:
            known = self._copy_kmax[width] = copy_depth(self.state.table, width)
        return known

    def unconfident(self, seqs: Sequence[SeqState]) -> bool:
        """Whether no sequence has a previous first draft of this drafter: a first plan then reads the priors alone."""
        return all(p is None for p in _previous_firsts(seqs, self.drafter))

    def prior_rate(self, width: int) -> float:
        """The most tokens/s a first plan of drafts can expect at this width when unconfident (SpecCostState.prior_rate)."""
        return self.state.prior_rate(width, self.kmax(width))

    def plan(self, runner: ModelRunner, seqs: Sequence[SeqState], weigh_copies: bool = True) -> StepPlan:
        """The step's plan (weigh_copies False: drafts and plain decode alone, as where another planner weighs the copies)."""
        width = len(seqs)
        kmax = self.kmax(width)
        rooms = Rooms.read(runner, seqs)  # the plan's three clamps (its depth, its copies', the chosen) read them
        room, room_clamp = rooms.clamp(kmax, self.pools)
        # a sequence the clamps leave no draft (its last token, no KV room) is not caught up: 0 rows to price
        behind = [_behind(runner, self.drafter, s.slot) if r else 0 for s, r in zip(seqs, room)]
        copies, copy_kmax = None, 0
        if weigh_copies and self.copies.copy_ngram and kmax:
            copy_kmax = self.copy_kmax(width)
            copy_room = rooms.clamp(copy_kmax, COPY_POOLS)[0] if copy_kmax > kmax else room
            copies = self._weigh_copies(seqs, copy_room, copy_kmax)
        weighed = copies if copies is not None else (None,) * width
        facts = [PlanSeq((), first, b, s.remaining, c)
                 for s, first, b, c in zip(seqs, _previous_firsts(seqs, self.drafter), behind, weighed)]
        decision = self.state.plan(facts, kmax, copy_kmax=copy_kmax)
        if decision.source in ("lookup", "mixed"):
            copying = decision.copying
            pools = COPY_POOLS if decision.source == "lookup" else self.pools  # a mixed step drafts: within kmax
            depths, clamp = rooms.clamp(decision.k, pools)
            depths = tuple(min(d, len(c)) if copies else d for d, c, copies in zip(depths, self._copies, copying))
            self.plain_steps = 0 if any(depths) else self.plain_steps + 1
            self.probing = False
            mode = "lookup" if all(c or not d for c, d in zip(copying, depths)) else self.drafter
            shared = sum(bool(c and d and s) for c, d, s in zip(copying, depths, self._shared))
            why = f"{decision.why}, {shared} from other requests" if shared else decision.why
            return StepPlan(drafting(mode, depths), decision.k, depths, joined(why, clamp), decision,
                            self.state.table, shared)
        if decision.k:
            self.probe_after = PROBE_AFTER
        elif self.probing:  # the last step probed and its drafts did not convince the plan
            self.probe_after = min(2 * self.probe_after, PROBE_AFTER_MAX)
        self.probing = decision.k == 0 and kmax > 0 and self.plain_steps >= self.probe_after
        # A drafting step may go as deep as kmax: the plans made while drafting decide where it stops.
        depths, clamp = (room, room_clamp) if decision.k or self.probing else ((0,) * width, "")
        if self.probing:  # a sequence far behind only where drafting could repay its catch-up
            pays = self.state.probe_pays(width, kmax, behind, [s.remaining for s in seqs])
            depths = tuple(d if b <= PROBE_BEHIND_MAX or ok else 0 for d, b, ok in zip(depths, behind, pays))
            self.probing = any(depths)
        why = decision.why if not self.probing else f"probe after {self.plain_steps} plain steps ({decision.why})"
        self.plain_steps = 0 if any(depths) else self.plain_steps + 1
        depth = max(decision.k, int(self.probing))
        return StepPlan(drafting(self.drafter, depths), depth, depths, joined(why, clamp), decision,
                        self.state.table)

    def _weigh_copies(self, seqs: Sequence[SeqState], room: Sequence[int], kmax: int) -> list[Sequence[float] | None]:
        """Each sequence's copy, as deep as its room (kept for draft), and its expected accepted drafts at
        depths 0..=kmax; None for a sequence with no copy or no room for a draft.

        The copy is the history's own, or the shared cache's where that match is longer (with shared bins).
        """
        calibration = self.state.calibration
        self._copies, self._shared, weighed = [], [], []
        for s, r in zip(seqs, room):
            n, copy = s.proposer.matched_copy(r) if r else (0, [])
            shared_n, shared = s.proposer.shared_copy(r, n) if r and self.copies.shared_ngram else (0, [])
            if shared:
                n, copy = shared_n, shared
            self._copies.append(copy)
            self._shared.append(bool(shared))
            weighed.append(calibration.copy_accepted_by_depth(n, len(copy), kmax, bool(shared)) if copy else None)
        return weighed

    def draft(self, runner: ModelRunner, seqs: Sequence[SeqState], plan: StepPlan) -> list[Draft]:
        source = plan.decision.source if plan.decision is not None else "mtp"
        if source in ("lookup", "mixed"):  # the copies the plan weighed, as deep as it chose; no confidences
            copying = plan.decision.copying
            drafted = [0 if c else k for c, k in zip(copying, plan.depths)]
            drafts = _draft(runner, seqs, replace(plan, depths=tuple(drafted)), self.drafter)  # the others' drafts
            return [Draft(copy[:k], []) if c else d for c, copy, k, d in zip(copying, self._copies, plan.depths, drafts)]
        deepest, floor = max(plan.depths, default=0), int(self.probing)
        previous = _previous_firsts(seqs, self.drafter)

        def replan(drafted: int, drafts: list[Draft]) -> int:
            facts = [PlanSeq(d.confidences, first) for d, first in zip(drafts, previous, strict=True)]
            return max(floor, self.state.plan(facts, deepest, drafted).k)

        return _draft(runner, seqs, plan, self.drafter, replan)

    def observe(self, plan: StepPlan, outcomes: Sequence[Outcome], seconds: float) -> None:
        pass  # the planner is pure: the table and calibration are fixed for the life of the serve


def _previous_firsts(seqs: Sequence[SeqState], drafter: str) -> list[float | None]:
    """Each sequence's previous step's first-draft confidence (None: that step was plain, had none, or another drafter
    drafted it, whose confidences this drafter's calibration does not read)."""
    return [s.confidences[0] if s.confidences and s.drafted_by == drafter else None for s in seqs]


class MtpFixedPolicy:
    """MTP at one depth every step -> clamp: the choice a user makes without a cost model."""

    def __init__(self, depth: int, num_drafts: int, pools: VerifyPools, drafter: str = "mtp"):
        if not 1 <= depth <= num_drafts:
            what = "the model's MTP depths" if drafter == "mtp" else "the drafter's depths"
            raise ValueError(f"fixed depth {depth} is outside {what} 1..={num_drafts}")
        self.drafter = drafter  # "mtp", "draft" (the runner's draft model) or "eagle" (its EAGLE-3 head)
        self.name = f"{drafter}/fixed-{depth}"
        self.copies = NO_COPIES
        self.depth = depth
        self.pools = pools

    def plan(self, runner: ModelRunner, seqs: Sequence[SeqState]) -> StepPlan:
        depths, clamp = clamp_depths(self.depth, runner, seqs, self.pools)
        return StepPlan(drafting(self.drafter, depths), self.depth, depths, joined(f"fixed k={self.depth}", clamp))

    def draft(self, runner: ModelRunner, seqs: Sequence[SeqState], plan: StepPlan) -> list[Draft]:
        return _draft(runner, seqs, plan, self.drafter)

    def observe(self, plan: StepPlan, outcomes: Sequence[Outcome], seconds: float) -> None:
        pass  # fixed: nothing to learn
