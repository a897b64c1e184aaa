"""The drafting policies: ladder and rung depths, the gate, the measured planner's use of confidences, clamps."""

from dataclasses import replace
from types import SimpleNamespace

import pytest
from hypothesis import given, settings, strategies as st

from met.engine.policy import PolicyConfig, build_policy
from met.engine.policy_base import Outcome, PlainPolicy, clamp_depths
from met.engine.policy_dflash import DflashPolicy
from met.engine.policy_lookup import LookupPolicy
from met.engine.policy_mtp import (PROBE_AFTER, PROBE_AFTER_MAX, PROBE_BEHIND_MAX, MtpFixedPolicy, MtpLadderPolicy,
                                   MtpPlannedPolicy)
from met.engine.proposer import Proposer
from met.engine.requests import QueueSink, Request, SeqState
from met.engine.runner import Draft
from met.engine.textstream import TextStream
from met.speculative.dflash_rung import DflashRung
from met.speculative.mtp_gate import Mode
from met.speculative.spec_capacity import DEFAULT_POOLS, VerifyPools
from met.speculative.spec_cost import (AcceptanceCalibration, CarryBin, Cell, ConfidenceBin, CostTable, DrafterKey,
                                       PositionPrior, SpecCostState, TableKey, VerifyCell)
from met.speculative.spec_cost.lookup import LOOKUP_MAX_NGRAM, LookupBin
from met.speculative.spec_cost.plan import unknown


def _runner(length: int = 10, max_len: int = 128, behind: int = 1):
    return SimpleNamespace(length=lambda slot: length, max_len=max_len, mtp_behind=lambda slot: behind)


def _seqs(n: int, max_tokens: int = 100, confidences: list[float] | None = None, spec: str = "off") -> list[SeqState]:
    out = []
    for i in range(n):
        req = Request(str(i), (1, 2, 3), max_tokens)
        out.append(SeqState(req, QueueSink(), i, Proposer(spec, req.prompt), TextStream(),
                            confidences=list(confidences or []), drafted_by="mtp" if confidences else ""))
    return out


def test_ladder_depth_by_width():
    # width 1..=8: all four MTP drafts; width 12: one (the ladder; the rung has no evidence yet)
    p = MtpLadderPolicy(4, DEFAULT_POOLS, {})
    assert (p.plan(_runner(), _seqs(1)).depths, p.plan(_runner(), _seqs(1)).why) == ((4,), "ladder")
    assert p.plan(_runner(), _seqs(12)).depths == (1,) * 12


def test_rung_lift_is_clamped_by_default_pools_and_kept_when_lifted():
    # the rung asks for two at width 12; default pools clamp to one, lifted pools keep two
    for pools, expected in ((DEFAULT_POOLS, 1), (VerifyPools(DEFAULT_POOLS.tiers, lift_wide_tier=True), 2)):
        p = MtpLadderPolicy(4, pools, {})
        p.rung.two_drafts = True
        plan = p.plan(_runner(), _seqs(12))
        assert plan.depth == 2 and plan.depths == (expected,) * 12 and plan.why.startswith("rung:two")


def test_fixed_depth_asks_its_depth_every_step_and_the_pools_clamp_it():
    # fixed-3: three drafts at width 2 whatever it observes, one at width 12 (default pools), none past the depth
    p = MtpFixedPolicy(3, 4, DEFAULT_POOLS)
    p.observe(p.plan(_runner(), _seqs(2)), [Outcome(3, 0, 1)] * 2, 0.01)
    plan = p.plan(_runner(), _seqs(2))
    assert (p.name, plan.mode, plan.depth, plan.depths, plan.why) == ("mtp/fixed-3", "mtp", 3, (3, 3), "fixed k=3")
    assert p.plan(_runner(), _seqs(12)).depths == (1,) * 12
    for bad in (0, 5):
        with pytest.raises(ValueError, match="outside the model's MTP depths"):
            MtpFixedPolicy(bad, 4, DEFAULT_POOLS)


def test_gate_plain_mode_plans_no_drafts():
    # when the gate exploits plain decode, the step drafts nothing
    p = MtpLadderPolicy(4, DEFAULT_POOLS, {})
    p.gate.window_mode = Mode.PLAIN
    plan = p.plan(_runner(), _seqs(2))
    assert (plan.mode, plan.depths, plan.why) == ("plain", (0, 0), "gate:plain")


def test_gate_observes_steps_and_switches_to_plain_when_mtp_delivers_less():
    # MTP windows deliver 1 token per 10 ms; plain 1 per 5 ms: after one window of each the gate exploits plain
    p = MtpLadderPolicy(4, DEFAULT_POOLS, {})
    for _ in range(p.gate.params.window_steps):
        p.observe(p.plan(_runner(), _seqs(1)), [Outcome(4, 0, 1)], 0.010)
    for _ in range(p.gate.params.window_steps):
        plan = p.plan(_runner(), _seqs(1))
        assert plan.mode == "plain"
        p.observe(plan, [Outcome(0, 0, 1)], 0.005)
    assert p.gate.exploit is Mode.PLAIN


def test_clamps_kv_room_and_remaining_tokens():
    # 3 positions of KV room left: at most 2 drafts; a request with 2 tokens left drafts at most 1
    depths, why = clamp_depths(4, _runner(length=125), _seqs(1))
    assert (depths, why) == ((2,), "clamp:kv")
    assert clamp_depths(4, _runner(), _seqs(1, max_tokens=2)) == ((1,), "clamp:remaining")


def test_a_step_clamped_several_ways_names_every_clamp():
    # the pool holds 4 at width 1, the KV room 2, the request has 2 tokens left: all three cut (only kv was named)
    assert clamp_depths(6, _runner(length=125), _seqs(1, max_tokens=2)) == (
        (1,), "clamp:pool, clamp:kv, clamp:remaining")
    assert clamp_depths(4, _runner(length=125), _seqs(1, max_tokens=2)) == ((1,), "clamp:kv, clamp:remaining")


@settings(max_examples=300, deadline=None)
@given(depth=st.integers(0, 20), lengths=st.lists(st.integers(0, 130), min_size=1, max_size=20),
       remaining=st.lists(st.integers(0, 30), min_size=20, max_size=20), copy_pools=st.booleans())
def test_rooms_clamp_as_the_rule_reads(depth, lengths, remaining, copy_pools):
    # Rooms.clamp (one pass over rooms read once) against the rule written out: the pool of the width's tier,
    # then each slot's KV room, then its tokens left but one; every clamp that cut named in that order
    from met.engine.policy_base import Rooms
    from met.speculative.spec_capacity import COPY_POOLS, kv_room

    pools, max_len = (COPY_POOLS if copy_pools else DEFAULT_POOLS), 128
    seqs = [SimpleNamespace(slot=i, remaining=r) for i, r in zip(range(len(lengths)), remaining)]
    runner = SimpleNamespace(length=lambda slot: lengths[slot], max_len=max_len)
    pool = min(depth, pools.max_drafts(len(seqs)))
    capped = [min(pool, kv_room(n, max_len)) for n in lengths]
    final = tuple(max(0, min(c, s.remaining - 1)) for c, s in zip(capped, seqs))
    why = ", ".join(r for r, cut in (("clamp:pool", pool < depth), ("clamp:kv", any(c < pool for c in capped)),
                                      ("clamp:remaining", any(f < c for f, c in zip(final, capped)))) if cut)
    assert Rooms.read(runner, seqs).clamp(depth, pools) == clamp_depths(depth, runner, seqs, pools) == (final, why)


@pytest.mark.parametrize("make", [
    lambda: MtpFixedPolicy(2, 4, DEFAULT_POOLS),
    lambda: MtpLadderPolicy(4, DEFAULT_POOLS, {}),
    lambda: LookupPolicy("prompt-lookup", 4, DEFAULT_POOLS),
])
def test_a_step_the_clamps_leave_without_drafts_is_a_plain_step(make):
    # the last token of a request (nothing past it could be emitted) or a full context: no draft is
    # made or verified, so the step is counted, shown and observed (by the MTP gate) as plain decode
    assert make().plan(_runner(), _seqs(2, max_tokens=1)).mode == "plain"
    assert make().plan(_runner(length=127), _seqs(1)).mode == "plain"
    assert make().plan(_runner(), _seqs(2)).mode != "plain"


SURE_NEXT = [CarryBin(-2.0, (0.05,), (200,)), CarryBin(0.0, (0.95,) * 4, (300, 280, 260, 250))]


def _state(energy: bool = False, carryover: list[CarryBin] = SURE_NEXT,
           catchup_s: float | None = None) -> SpecCostState:
    # verify cost grows slowly with k: deep drafts pay only when they are likely accepted
    box, recipe, digests = "box", "r@d", {"decode": "a", "verify": "b", "draft_mtp": "c"}
    source = "none"
    cells = [Cell(n, k, 0.010 + 0.002 * k, 0.0 if k == 0 else 0.001 * k, catchup_s=catchup_s if k else None)
             for n in (1, 8) for k in range(5)]
    table = CostTable(TableKey(box, recipe, source, digests), cells)
    drafter = DrafterKey("mtp", "r", "d")
    bins = [ConfidenceBin(-2.0, 0.05, 500), ConfidenceBin(0.0, 0.95, 500)]
    priors = [PositionPrior(1, 0.5, 500)]
    cal = AcceptanceCalibration(drafter, 0.5, 2000, bins, priors, {}, carryover)
    return SpecCostState(table, cal, 0.1, TableKey(box, recipe, source, digests), drafter)


def test_measured_planner_uses_the_previous_steps_confidences():
    # a sure first draft last step -> deep; an unsure one -> plain decode (k = 0); none -> the position priors
    p = MtpPlannedPolicy(_state(), 4, DEFAULT_POOLS)
    sure = p.plan(_runner(), _seqs(1, confidences=[-0.01] * 4))
    unsure = p.plan(_runner(), _seqs(1, confidences=[-5.0] * 4))
    assert sure.depth == 4 and sure.mode == "mtp" and sure.decision is not None
    assert unsure.depth == 0 and unsure.mode == "plain"
    assert p.plan(_runner(), _seqs(1)).decision.k == _state().plan(unknown(1)).k


def test_measured_planner_reads_the_previous_first_draft_through_the_carryover_not_the_own_confidence_bins():
    # After an unsure first draft the next step's drafts are accepted as often as after a sure one
    # (this carry-over): it drafts, where the own-confidence bins (0.05 below -2) would say plain decode.
    # Only the first draft's confidence is read: the unsure ones after it change nothing.
    flat = [CarryBin(0.0, (0.95,) * 4, (300, 280, 260, 250))]
    p = MtpPlannedPolicy(_state(carryover=flat), 4, DEFAULT_POOLS)
    assert p.plan(_runner(), _seqs(1, confidences=[-5.0] * 4)).depth == 4
    assert p.plan(_runner(), _seqs(1, confidences=[-0.01, -5.0, -5.0])).depth == 4
    # without a carry-over the first plan reads the position priors (0.5 here), whatever the confidences
    bare = MtpPlannedPolicy(_state(carryover=[]), 4, DEFAULT_POOLS)
    priors_only = _state(carryover=[]).plan(unknown(1)).k
    assert {bare.plan(_runner(), _seqs(1, confidences=c)).decision.k for c in ([-5.0], [-0.01], [])} == {priors_only}


def test_measured_planner_prices_the_catch_up_of_a_sequence_far_behind_over_the_tokens_it_has_left():
    # 1 ms per row behind: a sure sequence a 300-row prompt behind with 3 tokens left decodes plainly
    # (the catch-up would buy one or two steps of drafts); caught up, or with 10,000 tokens left, it drafts.
    p = MtpPlannedPolicy(_state(catchup_s=1e-3), 4, DEFAULT_POOLS)
    sure = [-0.01] * 4
    assert p.plan(_runner(behind=300), _seqs(1, max_tokens=3, confidences=sure)).depth == 0
    assert p.plan(_runner(behind=1), _seqs(1, max_tokens=3, confidences=sure)).depth == 4
    assert p.plan(_runner(behind=300), _seqs(1, max_tokens=10_000, confidences=sure)).depth == 4


class _ScriptedDrafter:
    """A runner stand-in: MTP drafts whose confidences follow a script, asking replan as ModelRunner does."""

    def __init__(self, confidences: list[float]):
        self.confidences = confidences
        self.asked: list[int] = []

    def length(self, slot: int) -> int:
        return 10

    def mtp_behind(self, slot: int) -> int:
        return 1

    max_len = 128

    def draft_mtp(self, slots, depths, replan=None):
        drafts = [Draft([], []) for _ in slots]
        for j in range(1, max(depths) + 1):
            for d in drafts:
                d.tokens.append(7)
                d.confidences.append(self.confidences[j - 1])
            if replan is not None and j < max(depths):
                self.asked.append(target := replan(j, drafts))
                if target <= j:
                    return [Draft(d.tokens[:target], d.confidences[:target]) for d in drafts]
        return drafts


def test_measured_planner_plans_again_with_each_drafts_confidence():
    # a sure first draft: draft on (k = 2: 2.425 expected tokens / 16 ms beats k = 1: 1.95 / 13 ms);
    # an unsure second: drop it (k = 1: 1.95 / 14 ms, the second draft's 2 ms spent, beats 1.9975 / 16 ms).
    # No carry-over: positions not drafted yet take the prior 0.5.
    p = MtpPlannedPolicy(_state(carryover=[]), 4, DEFAULT_POOLS)
    runner = _ScriptedDrafter([-0.01, -5.0, -0.01, -0.01])
    seqs = _seqs(1, confidences=[-0.01] * 4)
    plan = p.plan(runner, seqs)
    assert plan.depths == (4,)
    drafts = p.draft(runner, seqs, plan)
    assert runner.asked == [2, 1] and [d.confidences for d in drafts] == [[-0.01]]


def test_measured_planner_replans_keep_the_carryover_for_positions_not_drafted_yet():
    # The same drafts after a sure previous first draft, whose carry-over says 0.95 at positions 1..4:
    # after the sure first draft, k = 4 (1 + 0.95 + 0.95^2 + 0.95^3 + 0.95^4 = 4.52 tokens / 22 ms) beats
    # k = 2 (2.8525 / 16 ms); the unsure second still drops (k = 1: 1.95 / 14 ms beats 1.9975 / 16 ms).
    p = MtpPlannedPolicy(_state(), 4, DEFAULT_POOLS)
    runner = _ScriptedDrafter([-0.01, -5.0, -0.01, -0.01])
    seqs = _seqs(1, confidences=[-0.01] * 4)
    p.draft(runner, seqs, p.plan(runner, seqs))
    assert runner.asked == [4, 1]


def test_measured_planner_probes_after_a_run_of_plain_steps():
    # unsure confidences keep the planner plain; after PROBE_AFTER plain steps in a row one step drafts
    # anyway, its replan keeps at least one draft however unsure it is, and the run of plain steps restarts
    p = MtpPlannedPolicy(_state(), 4, DEFAULT_POOLS)
    unsure = _seqs(1, confidences=[-5.0] * 4)
    plans = [p.plan(_runner(), unsure) for _ in range(PROBE_AFTER + 1)]
    assert [pl.mode for pl in plans] == ["plain"] * PROBE_AFTER + ["mtp"]
    probe = plans[-1]
    assert probe.depths == (4,) and probe.depth == 1 and probe.why.startswith(f"probe after {PROBE_AFTER} plain steps")
    runner = _ScriptedDrafter([-5.0] * 4)
    drafts = p.draft(runner, unsure, probe)
    assert runner.asked == [1] and [len(d.tokens) for d in drafts] == [1]  # the plan alone would verify none
    assert p.plan(_runner(), unsure).mode == "plain" and p.plain_steps == 1


def test_measured_planner_backs_off_probes_that_find_nothing_and_resets_when_it_drafts():
    # each probe whose drafts leave the next plan plain doubles the run before the next probe, up to
    # PROBE_AFTER_MAX; a step the plan drafts on its own sets it back
    p = MtpPlannedPolicy(_state(), 4, DEFAULT_POOLS)
    unsure, sure = _seqs(1, confidences=[-5.0] * 4), _seqs(1, confidences=[-0.01] * 4)
    modes = "".join("d" if p.plan(_runner(), unsure).mode == "mtp" else "." for _ in range(600))
    runs = [len(r) for r in modes.split("d")[:-1]]
    assert runs[:5] == [PROBE_AFTER, 2 * PROBE_AFTER, 4 * PROBE_AFTER, PROBE_AFTER_MAX, PROBE_AFTER_MAX]
    assert p.plan(_runner(), sure).mode == "mtp" and p.probe_after == PROBE_AFTER
    plans = [p.plan(_runner(), unsure) for _ in range(PROBE_AFTER + 1)]
    assert [pl.mode for pl in plans] == ["plain"] * PROBE_AFTER + ["mtp"]


def test_measured_planner_probes_a_sequence_a_prompt_behind_only_where_its_catch_up_pays():
    # _state's calibration: 60% of steps follow a sure first draft (0.95 at every position), where depth 4
    # costs 22 ms / 4.52 tokens, 0.514 below plain's 10 ms a token; the rest never gain: a saving of
    # 0.6 x 0.514 = 0.308 of the step time, 0.308 s over 100 tokens left. A prompt 256 rows behind costs
    # 0.512 s to catch up at 2 ms a row (no probe), 0.256 s at 1 ms (a probe)
    behind = {0: PROBE_AFTER + 1, 1: PROBE_BEHIND_MAX, 2: 256}
    runner = SimpleNamespace(length=lambda slot: 10, max_len=128, mtp_behind=behind.get)
    unsure = _seqs(3, confidences=[-5.0] * 4)
    p = MtpPlannedPolicy(_state(catchup_s=2e-3), 4, DEFAULT_POOLS)
    plans = [p.plan(runner, unsure) for _ in range(PROBE_AFTER + 1)]
    assert plans[-1].mode == "mtp" and plans[-1].depths == (4, 4, 0)  # drafted before: probed whatever the cost
    alone = _seqs(1, confidences=[-5.0] * 4)
    p = MtpPlannedPolicy(_state(catchup_s=2e-3), 4, DEFAULT_POOLS)
    assert all(p.plan(_runner(behind=256), alone).mode == "plain" for _ in range(3 * PROBE_AFTER))
    assert not p.probing and p.plain_steps == 3 * PROBE_AFTER
    p = MtpPlannedPolicy(_state(catchup_s=1e-3), 4, DEFAULT_POOLS)
    plans = [p.plan(_runner(behind=256), alone) for _ in range(PROBE_AFTER + 1)]
    assert [pl.mode for pl in plans] == ["plain"] * PROBE_AFTER + ["mtp"] and plans[-1].depths == (4,)
    # no carry-over: the priors' one answer, 0.5 a position: depth 1 saves 1 - 13 / 15 = 0.133 of the step,
    # 0.133 s over 100 tokens, short of the 0.256 s catch-up: no probe
    p = MtpPlannedPolicy(_state(carryover=[], catchup_s=1e-3), 4, DEFAULT_POOLS)
    assert all(p.plan(_runner(behind=256), alone).mode == "plain" for _ in range(3 * PROBE_AFTER))


def test_measured_planner_kmax_respects_the_wide_tier_pool():
    # width 12 has a one-draft pool: the planner chooses among k <= 1
    p = MtpPlannedPolicy(_state(), 4, DEFAULT_POOLS)
    assert p.plan(_runner(), _seqs(12, confidences=[-0.01] * 4)).depth <= 1


def test_build_policy_by_flags():
    # off, mtp static, mtp measured, lookup; measured with a host drafter is refused
    assert isinstance(build_policy(PolicyConfig("off"), 4), PlainPolicy)
    assert isinstance(build_policy(PolicyConfig("mtp"), 4), MtpLadderPolicy)
    assert isinstance(build_policy(PolicyConfig("mtp"), 4, _state()), MtpPlannedPolicy)
    assert isinstance(build_policy(PolicyConfig("prompt-lookup"), 4), LookupPolicy)
    try:
        build_policy(PolicyConfig("ngram"), 4, _state())
    except ValueError as exc:
        assert "measured" in str(exc)
    else:
        raise AssertionError("measured + ngram was accepted")


class _Block:
    block = 16

    def __call__(self, runner, slots, depths):
        return [Draft([7] * d, [0.0] * d) for d in depths]


def test_dflash_rung_gamma_is_clamped_and_observed():
    # a single stream asks for the rung's gamma (16 at the top level); given the MTP pools, the pool clamps it to 4
    p = DflashPolicy(_Block(), DEFAULT_POOLS)
    plan = p.plan(_runner(), _seqs(1))
    assert plan.depth == 16 and plan.depths == (4,) and plan.why == "dflash:single, clamp:pool"
    assert [len(d.tokens) for d in p.draft(_runner(), _seqs(1), plan)] == [4]
    p.observe(plan, [Outcome(4, 0, 1)], 0.01)  # first draft rejected: the single-stream rate falls
    assert p.rung.p1 == 0.0 and p.rung.gamma_for(1) < 16


def _dflash_runner(asked: list[list[int]]):
    """A fake runner whose DFlash drafter records the depths each draft asks for."""
    def draft_dflash(slots, depths):
        asked.append(list(depths))
        return [Draft([7] * d, [0.0] * d) for d in depths]
    return SimpleNamespace(length=lambda slot: 10, max_len=128, draft_dflash=draft_dflash)


def test_dflash_from_the_flags_gets_the_rungs_gamma_to_its_drafter():
    # --spec dflash with a 16-token block: a single stream accepting everything drafts 16 (the MTP pools cut it to 4)
    p, asked = build_policy(PolicyConfig("dflash"), 4, dflash_block=16), []
    runner = _dflash_runner(asked)
    for _ in range(3):
        plan = p.plan(runner, _seqs(1))
        p.draft(runner, _seqs(1), plan)
        p.observe(plan, [Outcome(plan.depths[0], plan.depths[0], plan.depths[0] + 1)], 0.01)
    assert (plan.depth, plan.depths, plan.why) == (16, (16,), "dflash:single") and asked[-1] == [16]
    # and every concurrency tier its own gamma: 8 at width 2, 6 at 3, 4 at 8, 2 at 12, 1 at 20
    for width, gamma in ((2, 8), (3, 6), (8, 4), (12, 2), (20, 1)):
        plan = p.plan(runner, _seqs(width))
        assert plan.depths == (gamma,) * width and plan.why == "dflash:tier", (width, plan)


def test_dflash_single_stream_levels_each_reach_the_drafter():
    # the rung's single-stream levels 8, 12 and 16 are drafted as chosen under the pools it sizes
    for level, gamma in enumerate((8, 12, 16)):
        plan = DflashPolicy(_Block(), rung=DflashRung(level=level)).plan(_runner(), _seqs(1))
        assert (plan.depth, plan.depths, plan.why) == (gamma, (gamma,), "dflash:single")


def test_dflash_block_clamp_is_named_in_why():
    # a 4-token drafter proposes at most 4: the rung's 16 is reported, 4 drafted, and why says the block cut it
    p = build_policy(PolicyConfig("dflash"), 4, dflash_block=4)
    plan = p.plan(_runner(), _seqs(1))
    assert (plan.depth, plan.depths, plan.why) == (16, (4,), "dflash:single, clamp:block")
    plan = p.plan(_runner(), _seqs(12))  # the tier's 2 fits the block: no clamp
    assert (plan.depth, plan.depths, plan.why) == (2, (2,) * 12, "dflash:tier")
    plan = p.plan(_runner(length=125), _seqs(1))  # KV room 2 as well: both clamps named
    assert (plan.depths, plan.why) == ((2,), "dflash:single, clamp:block, clamp:kv")


def test_dflash_refuses_the_mtp_lift():
    # --lift-wide-tier lifts MTP pools; DFlash sizes its own, so the pair is refused, not silently ignored
    lifted = PolicyConfig("dflash", pools=VerifyPools(DEFAULT_POOLS.tiers, lift_wide_tier=True))
    with pytest.raises(ValueError, match="sizes its verify pools from the DFlash rung"):
        build_policy(lifted, 4, dflash_block=16)


def _copying_state(rate: float, carryover: list[CarryBin] | None = None) -> SpecCostState:
    """_state with prompt lookup's bins: every copy's draft accepted at `rate`."""
    state = _state(carryover=carryover or [])
    lookup = [LookupBin(1, LOOKUP_MAX_NGRAM, (rate,) * 4, (500, 400, 300, 200))]
    cal = replace(state.calibration, lookup=lookup)
    return SpecCostState(state.table, cal, state.slack, state.serve_key, state.serve_drafter)


def _copying_seqs(n: int) -> list[SeqState]:
    out = []
    for i in range(n):
        req = Request(str(i), (5, 6, 7, 8, 9, 5, 6), 100)  # the suffix (5, 6) recurs: its copy is 7 8 9 5 6
        out.append(SeqState(req, QueueSink(), i, Proposer("mtp", req.prompt, copy_ngram=LOOKUP_MAX_NGRAM),
                            TextStream(), confidences=[-0.01] * 4, drafted_by="mtp"))
    return out


def test_measured_planner_copies_from_the_history_when_the_calibration_says_copies_hold():
    p = MtpPlannedPolicy(_copying_state(0.99), 4, DEFAULT_POOLS)
    assert p.copies.copy_ngram == LOOKUP_MAX_NGRAM
    seqs = _copying_seqs(2)
    plan = p.plan(_runner(), seqs)
    assert plan.mode == "lookup" and plan.decision.source == "lookup" and plan.depths == (4, 4)
    assert plan.why.startswith("copy k=4")
    drafts = p.draft(_runner(), seqs, plan)
    assert [d.tokens for d in drafts] == [[7, 8, 9, 5]] * 2 and all(d.confidences == [] for d in drafts)
    # copies that rarely hold lose to the MTP drafts the confident previous step promises
    q = MtpPlannedPolicy(_copying_state(0.05), 4, DEFAULT_POOLS)
    assert q.plan(_runner(), _copying_seqs(2)).mode == "mtp"
    # a calibration without lookup bins never weighs copies, and asks the scheduler for no index
    bare = MtpPlannedPolicy(_state(), 4, DEFAULT_POOLS)
    assert bare.copies.copy_ngram == 0 and bare.plan(_runner(), _copying_seqs(2)).mode == "mtp"


def test_measured_planner_copies_from_other_requests_where_their_match_is_longer_and_their_bins_say_it_holds():
    state = _copying_state(0.3)  # the history's own copies rarely hold
    shared_bins = [LookupBin(2, LOOKUP_MAX_NGRAM, (0.99,) * 4, (500, 400, 300, 200))]
    p = MtpPlannedPolicy(SpecCostState(state.table, replace(state.calibration, shared_lookup=shared_bins),
                                       state.slack, state.serve_key, state.serve_drafter), 4, DEFAULT_POOLS)
    assert p.copies.shared_ngram == LOOKUP_MAX_NGRAM  # the scheduler indexes finished requests up to 12 tokens
    asked = []

    def cache(history, k, longer_than):  # another request held 9 5 6 then 1 2 3 4: the match (9, 5, 6) is 3 long
        asked.append(longer_than)
        return (3, [1, 2, 3, 4][:k]) if longer_than < 3 else (0, [])

    seqs = _copying_seqs(1)
    seqs[0].proposer = Proposer("mtp", (5, 6, 7, 8, 9, 5, 6), copy_ngram=LOOKUP_MAX_NGRAM, shared=cache)
    plan = p.plan(_runner(), seqs)
    assert asked == [2]  # the history's own match (5, 6) is 2 long: only a longer one from the cache is weighed
    assert plan.mode == "lookup" and plan.depths == (4,) and plan.shared == 1
    assert plan.why.startswith("copy k=4") and plan.why.endswith(", 1 from other requests")
    assert p.draft(_runner(), seqs, plan)[0].tokens == [1, 2, 3, 4]
    # without shared bins the planner never asks the cache, and copies its own (weak) copy or drafts
    assert MtpPlannedPolicy(state, 4, DEFAULT_POOLS).copies.shared_ngram == 0


def _deep_copying_state(rate: float) -> SpecCostState:
    """_copying_state(rate) whose table also prices verifies past kmax 4: to 8 at width 1, to 6 at width 8."""
    state = _copying_state(rate)
    deeper = [VerifyCell(n, k, 0.010 + 0.002 * k) for n, deepest in ((1, 8), (8, 6)) for k in range(5, deepest + 1)]
    table = CostTable(state.table.key, state.table.cells, {}, deeper)
    lookup = [LookupBin(1, LOOKUP_MAX_NGRAM, (rate,) * 12, (500,) * 12)]
    cal = replace(state.calibration, lookup=lookup)
    return SpecCostState(table, cal, state.slack, state.serve_key, state.serve_drafter)


def test_measured_planner_copies_past_the_mtp_depth_as_deep_as_the_table_prices_verifies():
    p = MtpPlannedPolicy(_deep_copying_state(0.99), 4, DEFAULT_POOLS)
    assert (p.kmax(1), p.copy_kmax(1), p.copy_kmax(2), p.copy_kmax(8), p.copy_kmax(12)) == (4, 8, 6, 4, 2)
    seqs = _copying_seqs(1)
    plan = p.plan(_runner(), seqs)
    assert plan.mode == "lookup" and plan.depths == (8,) and plan.why.startswith("copy k=8")
    assert p.draft(_runner(), seqs, plan)[0].tokens == [7, 8, 9, 5, 6, 7, 8, 9]  # the loop, as deep as the plan
    assert p.plan(_runner(), _copying_seqs(2)).depths == (6, 6)  # between widths 1 and 8: the lesser verify depth
    assert p.plan(_runner(length=120), _copying_seqs(1)).depths == (7,)  # the KV room still clamps a copy
    # a copy that rarely holds is not verified deep: each further draft costs a verify position
    unsure = MtpPlannedPolicy(_deep_copying_state(0.6), 4, DEFAULT_POOLS)
    assert unsure.plan(_runner(), _copying_seqs(1)).depths[0] < 8


def test_measured_planner_copies_a_loop_as_a_loop_and_no_deeper_than_the_clamps():
    p = MtpPlannedPolicy(_copying_state(0.99), 4, DEFAULT_POOLS)
    seqs = _copying_seqs(1)
    seqs[0].proposer = Proposer("mtp", (5, 6, 5), copy_ngram=LOOKUP_MAX_NGRAM)  # (5,) recurs: 6 5, then 6 5 again
    plan = p.plan(_runner(), seqs)
    assert plan.mode == "lookup" and plan.depths == (4,)
    assert p.draft(_runner(), seqs, plan)[0].tokens == [6, 5, 6, 5]
    assert p.plan(_runner(), _copying_seqs(12)).depths == (2,) * 12  # the copy pool at widths 9..=16: two
    short = _copying_seqs(1)
    short[0].request = Request("0", (5, 6, 7, 8, 9, 5, 6), 3)  # two tokens left after the pending one
    assert p.plan(_runner(), short).depths == (2,)


def test_measured_planner_mixes_copies_and_mtp_drafts_in_one_step():
    # sequence 0's history recurs (a sure copy), sequence 1's does not but its last first draft was sure,
    # so its next drafts are likely accepted (the carry-over): the step copies for 0 and drafts for 1
    p = MtpPlannedPolicy(_copying_state(0.99, SURE_NEXT), 4, DEFAULT_POOLS)
    seqs = _copying_seqs(2)
    seqs[1].proposer = Proposer("mtp", (1, 2, 3), copy_ngram=LOOKUP_MAX_NGRAM)
    asked = []

    def draft_mtp(slots, depths, replan=None):
        asked.append(list(depths))
        return [Draft([40 + j for j in range(d)], [-0.1] * d) for d in depths]

    runner = SimpleNamespace(length=lambda slot: 10, max_len=128, mtp_behind=lambda slot: 1, draft_mtp=draft_mtp)
    plan = p.plan(runner, seqs)
    assert plan.decision.source == "mixed" and plan.decision.copying == (True, False) and plan.mode == "mtp"
    assert plan.why.startswith("copy 1 + draft 1 at k=")
    drafts = p.draft(runner, seqs, plan)
    k = plan.decision.k
    assert asked == [[0, k]]  # the drafter drafts for sequence 1 alone
    assert drafts[0].tokens == [7, 8, 9, 5][:k] and drafts[0].confidences == []
    assert drafts[1].tokens == [40 + j for j in range(k)] and drafts[1].confidences == [-0.1] * k
