"""The measured planner across drafters: the best drafter's plan each step, and text as plain decoding's."""

import random
from collections import Counter
from types import SimpleNamespace

import pytest

from met.engine.policy_base import PlainPolicy
from met.engine.policy_choice import DrafterChoicePolicy, _best
from met.engine.policy_mtp import MtpPlannedPolicy
from met.engine.proposer import Proposer
from met.engine.requests import Failed, Finished, QueueSink, Request, SeqState
from met.engine.runner import Draft, ModelRunner
from met.engine.scheduler import Scheduler
from met.engine.textstream import TextStream
from met.speculative.spec_capacity import DEFAULT_POOLS
from met.speculative.spec_cost import (AcceptanceCalibration, CarryBin, Cell, ConfidenceBin, CostTable, DrafterKey,
                                       PositionPrior, SpecCostState, TableKey)
from met.speculative.spec_cost.plan import PlanSeq, unknown
from eagle3_helpers import random_head
from random_models import micro_model


def fake_runner(asked: list, behind: int = 1):
    """A runner whose drafters are `behind` rows behind, recording (drafter, depths) of each draft asked of it."""
    def drafting(kind):
        def draft(slots, depths, replan=None):
            asked.append((kind, list(depths)))
            return [Draft([40 + j for j in range(d)], [-0.1] * d) for d in depths]
        return draft

    rows = SimpleNamespace(behind_rows=lambda slot: behind)
    return SimpleNamespace(length=lambda slot: 10, max_len=128, mtp_behind=lambda slot: behind, draft_model=rows,
                           eagle=rows, draft_mtp=drafting("mtp"), draft_small=drafting("draft"),
                           draft_eagle=drafting("eagle"))


def _state(kind: str, draft_per_k: float, accept: float = 0.9, after_sure: float | None = None) -> SpecCostState:
    """A planner state whose draft passes cost draft_per_k each and whose drafts are accepted at `accept` (after a
    sure first draft the step before: at after_sure, default `accept`)."""
    mode = {"mtp": "draft_mtp", "draft": "draft_model", "eagle": "draft_eagle"}[kind]
    key = TableKey("box", "r@d", "none", {"decode": "a", "verify": "b", mode: kind})
    cells = [Cell(n, k, 0.010 + 0.002 * k, draft_per_k * k) for n in (1, 8) for k in range(5)]
    drafter = DrafterKey(kind, kind, "d")
    bins = [ConfidenceBin(-2.0, accept / 4, 500), ConfidenceBin(0.0, accept, 500)]
    carry = [CarryBin(-2.0, (0.05,), (200,)), CarryBin(0.0, (after_sure or accept,) * 4, (300, 280, 260, 250))]
    cal = AcceptanceCalibration(drafter, accept, 2000, bins, [PositionPrior(1, accept, 500)], {}, carry)
    return SpecCostState(CostTable(key, cells), cal, 0.1, key, drafter)


def _seqs(n: int, drafted_by: str = "", confidences=()) -> list[SeqState]:
    out = []
    for i in range(n):
        req = Request(str(i), (1, 2, 3), 100)
        out.append(SeqState(req, QueueSink(), i, Proposer("off", req.prompt), TextStream(),
                            confidences=list(confidences), drafted_by=drafted_by))
    return out


def _choice(mtp: SpecCostState, draft: SpecCostState) -> DrafterChoicePolicy:
    return DrafterChoicePolicy([MtpPlannedPolicy(mtp, 4, DEFAULT_POOLS, "mtp"),
                                MtpPlannedPolicy(draft, 4, DEFAULT_POOLS, "draft")])


def test_the_cheaper_drafter_of_equal_acceptance_is_chosen_and_drafts():
    asked = []
    runner = fake_runner(asked)
    p = _choice(_state("mtp", 0.004), _state("draft", 0.001))
    plan = p.plan(runner, _seqs(1))
    assert plan.mode == "draft" and plan.why.startswith("draft: ") and plan.depth > 0
    p.draft(runner, _seqs(1), plan)
    assert asked and asked[-1][0] == "draft"
    # the other way round: MTP is the cheaper
    p = _choice(_state("mtp", 0.001), _state("draft", 0.004))
    assert p.plan(runner, _seqs(1)).mode == "mtp"


def test_the_likelier_accepted_drafter_of_equal_cost_is_chosen_and_a_tie_stays_with_the_first():
    runner = fake_runner([])
    assert _choice(_state("mtp", 0.002, 0.5), _state("draft", 0.002, 0.95)).plan(runner, _seqs(1)).mode == "draft"
    assert _choice(_state("mtp", 0.002, 0.95), _state("draft", 0.002, 0.5)).plan(runner, _seqs(1)).mode == "mtp"
    assert _choice(_state("mtp", 0.002), _state("draft", 0.002)).plan(runner, _seqs(1)).mode == "mtp"


def test_a_planner_reads_only_its_own_drafters_confidences():
    # a sure first draft by the draft model says nothing to the MTP planner: it plans from its priors
    runner = fake_runner([])
    mtp = MtpPlannedPolicy(_state("mtp", 0.002, 0.5, after_sure=0.95), 4, DEFAULT_POOLS, "mtp")
    by_draft = mtp.plan(runner, _seqs(1, "draft", [-0.01] * 4))
    none = mtp.plan(runner, _seqs(1))
    by_mtp = mtp.plan(runner, _seqs(1, "mtp", [-0.01] * 4))
    assert by_draft.decision == none.decision != by_mtp.decision


def test_a_choice_needs_two_different_drafters():
    with pytest.raises(ValueError, match="two drafters or more"):
        DrafterChoicePolicy([MtpPlannedPolicy(_state("mtp", 0.002), 4, DEFAULT_POOLS, "mtp")] * 2)


def _drive(runner: ModelRunner, policy, prompts: list[tuple[int, ...]]) -> list[str]:
    """Every prompt through the scheduler under policy: each one's text."""
    sched = Scheduler(runner, policy, "micro@t")
    sinks = [QueueSink() for _ in prompts]
    for i, (p, sink) in enumerate(zip(prompts, sinks)):
        sched.submit(Request(str(i), p, 40, ignore_eos=True), sink)
    for _ in range(2000):
        if all(any(isinstance(e, Finished | Failed) for e in list(sink.queue.queue)) for sink in sinks):
            break
        sched.tick()
    return [sink.collect(timeout=1)[0] for sink in sinks]


def _in_turn(choice: DrafterChoicePolicy) -> Counter:
    """Make the choice run each drafter's plan in turn (with equal tables it would always run the first drafter's);
    returns the count of the steps' modes as they run."""
    turns, modes = iter(range(10_000)), Counter()

    def in_turn(runner, seqs):
        choice._chosen = choice.planners[next(turns) % len(choice.planners)]
        plan = choice._chosen.plan(runner, seqs)
        modes[plan.mode] += 1
        return plan

    choice.plan = in_turn
    return modes


def test_text_is_plain_decodings_whichever_drafter_each_step_takes():
    # MTP and the draft model drafting in turn, each catching up on the rows of the other's steps
    model = micro_model(0)
    prompts = [(5, 6, 7, 8), (40, 41, 42, 43, 44, 45)]
    plain = _drive(ModelRunner(model, 2), PlainPolicy(), prompts)
    runner = ModelRunner(model, 2, draft_model=micro_model(1))
    choice = _choice(_state("mtp", 0.002, 0.9), _state("draft", 0.002, 0.9))
    modes = _in_turn(choice)
    assert _drive(runner, choice, prompts) == plain
    assert modes["mtp"] > 0 and modes["draft"] > 0


def test_three_drafters_take_turns_and_text_stays_plain_decodings():
    # MTP, the draft model and an EAGLE-3 head in one runner (as --spec mtp+draft+eagle holds them), each step's
    # drafter in turn, each catching up on the rows of the others' steps
    model = micro_model(0)
    prompts = [(5, 6, 7, 8), (40, 41, 42, 43, 44, 45)]
    plain = _drive(ModelRunner(model, 2), PlainPolicy(), prompts)
    runner = ModelRunner(model, 2, draft_model=micro_model(1), eagle=random_head(model.cfg, layers=(0, 1, 1)))
    choice = DrafterChoicePolicy([MtpPlannedPolicy(_state(kind, 0.002, 0.9), 4, DEFAULT_POOLS, kind)
                                  for kind in ("mtp", "draft", "eagle")])
    assert choice.name == "mtp+draft+eagle/measured"
    modes = _in_turn(choice)
    assert _drive(runner, choice, prompts) == plain
    assert modes["mtp"] > 0 and modes["draft"] > 0 and modes["eagle"] > 0


def _asked(planner: MtpPlannedPolicy) -> list:
    """Count the planner's plans: the list gets one entry per plan asked of it."""
    calls, plan = [], planner.plan

    def counted(runner, seqs, weigh_copies=True):
        calls.append(weigh_copies)
        return plan(runner, seqs, weigh_copies)

    planner.plan = counted
    return calls


def test_a_drafter_dearer_and_less_accepted_is_not_asked_to_plan_until_it_has_confidences():
    runner = fake_runner([])
    choice = _choice(_state("mtp", 0.001, 0.9), _state("draft", 0.004, 0.5))
    asked = _asked(choice.planners[1])
    for seqs in (_seqs(1), _seqs(1, "mtp", [-0.01] * 4), _seqs(8)):
        assert choice.plan(runner, seqs).mode == "mtp"
    assert asked == []
    # its own confidences are what its priors do not bound: then it plans
    choice.plan(runner, _seqs(1, "draft", [-0.01] * 4))
    assert asked == [False]  # and weighs no copies: the first planner's calibration has them


@pytest.mark.parametrize("seed", range(40))
def test_a_choice_that_skips_planners_chooses_as_one_that_asks_them_all(seed):
    # the skip is exact: the drafter and the plan of a choice asking every planner, over random tables and steps
    rng = random.Random(seed)
    kinds = ("mtp", "draft", "eagle")
    states = {k: _state(k, rng.uniform(0.0002, 0.006), rng.uniform(0.2, 0.98), rng.choice([None, 0.3, 0.97]))
              for k in kinds}
    width = rng.choice([1, 2, 5, 8])
    by = rng.choice(["", *kinds])
    seqs = _seqs(width, by, [rng.uniform(-3.0, 0.0) for _ in range(4)] if by else ())
    runner = fake_runner([], rng.choice([0, 1, 60]))
    choice = DrafterChoicePolicy([MtpPlannedPolicy(states[k], 4, DEFAULT_POOLS, k) for k in kinds])
    every = [MtpPlannedPolicy(states[k], 4, DEFAULT_POOLS, k).plan(runner, seqs) for k in kinds]
    expected = every[_best([p.decision for p in every], True)]
    got = choice.plan(runner, seqs)
    assert (got.mode, got.depths, got.decision) == (expected.mode, expected.depths, expected.decision)


@pytest.mark.parametrize("seed", range(30))
def test_the_prior_rate_bounds_every_first_plan_without_confidences(seed):
    rng = random.Random(seed)
    state = _state("draft", rng.uniform(0.0002, 0.006), rng.uniform(0.2, 0.98))
    width, kmax = rng.choice([1, 3, 8, 12]), rng.randint(0, 4)
    facts = [PlanSeq((), None, rng.choice([0, 1, 5, 300]), rng.choice([None, 2, 40, 400])) for _ in range(width)]
    assert state.plan(facts, kmax).tokens_per_s <= state.prior_rate(width, kmax)
    assert state.plan(unknown(width), kmax).tokens_per_s == state.prior_rate(width, kmax)  # and is reached
