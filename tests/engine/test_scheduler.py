"""Continuous batching: every policy gives plain greedy's text, slots are freed at once, failures stay local."""

import random
from types import SimpleNamespace

import pytest

from met.engine.generate import generate
from met.engine.policy import PolicyConfig, build_policy
from met.engine.policy_base import PlainPolicy
from met.engine.requests import Failed, Finished, QueueSink, Request
from met.engine.runner import ModelRunner, Sampling, VerifyResult
from met.engine.scheduler import Draining, Scheduler
from met.model.dflash import DflashConfig, DflashDrafter
from met.model.tokenizer import EOS, decode, encode



def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(97, 105) for _ in range(rng.randrange(2, 40))] for _ in range(n)]


def _solo(model, prompt: list[int], max_tokens: int) -> str:
    return decode(generate(ModelRunner(model, 1), [prompt], max_tokens, "off")[0].tokens)


def _drive(scheduler: Scheduler, requests: list[Request]) -> list[tuple[str, Finished | Failed]]:
    """Submit every request and tick on this thread until all have finished."""
    sinks = []
    for r in requests:
        sinks.append(QueueSink())
        scheduler.submit(r, sinks[-1])
    for _ in range(10_000):
        if all(not s.queue.empty() and _ended(s) for s in sinks):
            break
        scheduler.tick()
    return [s.collect(timeout=1) for s in sinks]


def _ended(sink: QueueSink) -> bool:
    return any(isinstance(e, Finished | Failed) for e in list(sink.queue.queue))


@pytest.mark.parametrize("spec", ["off", "mtp", "ngram", "prompt-lookup"])
def test_every_policy_gives_plain_greedy_text(model, spec):
    # 12 requests of different lengths and limits through 4 slots: each text equals its solo plain greedy run
    prompts = _prompts(12)
    limits = [5 + 7 * i % 40 for i in range(12)]
    runner = ModelRunner(model, 4)
    sched = Scheduler(runner, build_policy(PolicyConfig(spec), model.cfg.mtp_depth), "micro@t")
    widths = _record_step_slots(runner)
    out = _drive(sched, [Request(str(i), tuple(p), m) for i, (p, m) in enumerate(zip(prompts, limits))])
    assert [text for text, _ in out] == [_solo(model, p, m) for p, m in zip(prompts, limits)]
    # sequences finish out of order and the queue runs dry, yet every step runs over slots 0..n-1
    assert set(widths) >= {1, 2, 3, 4} and all(s == list(range(n)) for n, runs in widths.items() for s in runs)
    assert all(isinstance(e, Finished) and e.completion_tokens <= m for (_, e), m in zip(out, limits))
    assert sched.free_slots and len(sched.free_slots) == 4 and not sched.running
    if spec != "off":
        assert sched.stats.proposed > 0


def _record_step_slots(runner: ModelRunner) -> dict[int, list[list[int]]]:
    """Wrap runner.verify to note each step's slots, by width."""
    seen: dict[int, list[list[int]]] = {}
    verify = runner.verify

    def noted(slots, drafts):
        seen.setdefault(len(slots), []).append(list(slots))
        return verify(slots, drafts)

    runner.verify = noted
    return seen


def test_dflash_from_the_serve_flags_gives_plain_greedy_text(model):
    # --spec dflash: the runner's block drafter under the DFlash rung, 12 requests through 4 slots, exact text
    drafter = DflashDrafter(DflashConfig.for_target(model.cfg, block=4, ffn_dim=64)).double()
    policy = build_policy(PolicyConfig("dflash"), model.cfg.mtp_depth, dflash_block=drafter.block)
    sched = Scheduler(ModelRunner(model, 4, dflash=drafter), policy, "micro@t")
    prompts = _prompts(12, seed=2)
    out = _drive(sched, [Request(str(i), tuple(p), 20) for i, p in enumerate(prompts)])
    assert [text for text, _ in out] == [_solo(model, p, 20) for p in prompts]
    assert sched.policy.name == "dflash" and sched.stats.proposed > 0
    with pytest.raises(ValueError, match="needs a DFlash drafter"):
        build_policy(PolicyConfig("dflash"), model.cfg.mtp_depth)


def test_wide_batches_use_the_wide_tier_and_stay_exact(model):
    # 16 at once: widths 9..=16 take the one-draft tier, and every text is still its solo text
    prompts = _prompts(16, seed=1)
    sched = Scheduler(ModelRunner(model, 16), build_policy(PolicyConfig("mtp"), model.cfg.mtp_depth), "micro@t")
    out = _drive(sched, [Request(str(i), tuple(p), 24) for i, p in enumerate(prompts)])
    assert [text for text, _ in out] == [_solo(model, p, 24) for p in prompts]


def test_cancel_frees_the_slot_at_the_next_tick(model):
    # a cancelled running request leaves at once; a cancelled queued one never takes a slot
    sched = Scheduler(ModelRunner(model, 1), PlainPolicy(), "micro@t")
    a, b = QueueSink(), QueueSink()
    sched.submit(Request("a", (97, 98), 100), a)
    sched.submit(Request("b", (97, 98), 100), b)
    sched.tick()
    assert [s.request.id for s in sched.running] == ["a"] and sched.free_slots == []
    sched.cancel("a")
    sched.cancel("b")
    sched.tick()
    assert sched.running == [] and sched.free_slots == [0] and not sched.waiting
    assert a.collect()[1].reason == "cancelled" and b.collect()[1].reason == "cancelled"
    assert dict(sched.cell.latest().finished) == {"cancelled": 2}


class ScriptedRunner:
    """A runner stand-in that emits a fixed script per prompt, several tokens per step."""

    def __init__(self, scripts: dict[tuple[int, ...], list[int]], per_step: int = 3, max_len: int = 64):
        self.scripts, self.per_step, self.max_len = scripts, per_step, max_len
        self.cache = SimpleNamespace(max_batch=2)
        self.pos: dict[int, tuple[list[int], int]] = {}

    def prefill(self, slots, prompts, samplings):
        for s, p in zip(slots, prompts):
            self.pos[s] = (self.scripts[tuple(p)], 1)
        return [self.scripts[tuple(p)][0] for p in prompts]

    def verify(self, slots, drafts):
        out = []
        for s in slots:
            script, i = self.pos[s]
            out.append(VerifyResult(0, script[i : i + self.per_step]))
            self.pos[s] = (script, i + self.per_step)
        return out

    def length(self, slot):
        return 1

    def room(self, slot):
        return 10

    def release(self, slot):
        self.pos.pop(slot, None)


def test_eos_stop_strings_and_max_tokens():
    # EOS ends with "stop" and is not counted; a stop string cuts the text; max_tokens trims a multi-token step
    script = encode("hello") + [EOS] + encode("junk")
    story = encode("one. two. three.")
    runner = ScriptedRunner({(1,): script, (2,): story, (3,): story})
    sched = Scheduler(runner, PlainPolicy(), "t@t")
    out = _drive(sched, [Request("eos", (1,), 50), Request("stop", (2,), 50, stop=(" two",)),
                         Request("len", (3,), 7)])
    assert out[0][0] == "hello" and (out[0][1].reason, out[0][1].completion_tokens) == ("stop", 5)
    assert out[1][0] == "one." and out[1][1].reason == "stop"
    assert out[2][0] == "one. tw" and (out[2][1].reason, out[2][1].completion_tokens) == ("length", 7)


def test_a_stop_string_the_last_flush_completes_ends_with_stop():
    # max_tokens cuts "€" after two of its bytes; the flush makes them U+FFFD and completes the stop string
    # "b\ufffd": the text is cut before it and the reason is "stop", as when any other token completes one
    script = encode("ab") + list("€".encode())[:2] + encode("cd")
    runner = ScriptedRunner({(1,): script, (2,): script})
    sched = Scheduler(runner, PlainPolicy(), "t@t")
    out = _drive(sched, [Request("cut", (1,), 4, stop=("b\ufffd",)), Request("plain", (2,), 4)])
    assert (out[0][0], out[0][1].reason) == ("a", "stop")
    assert (out[1][0], out[1][1].reason) == ("ab\ufffd", "length")


class _Boom(PlainPolicy):
    def __init__(self):
        self.fail = True

    def draft(self, runner, seqs, plan):
        if self.fail:
            self.fail = False
            raise RuntimeError("kaboom")
        return super().draft(runner, seqs, plan)


def test_a_failing_step_fails_its_sequences_and_serving_goes_on(model):
    # the step raises once: its sequence gets Failed and its slot back; the next request is served normally
    sched = Scheduler(ModelRunner(model, 2), _Boom(), "micro@t")
    first = _drive(sched, [Request("a", (97, 98, 99), 10)])
    assert isinstance(first[0][1], Failed) and "kaboom" in first[0][1].message
    assert sorted(sched.free_slots) == [0, 1] and sched.cell.latest().failed_ticks == 1
    second = _drive(sched, [Request("b", (97, 98, 99), 10)])
    assert second[0][0] == _solo(model, [97, 98, 99], 10)


def test_prompt_longer_than_the_context_is_failed_not_run(model):
    # the scheduler's own guard: the request fails, nothing is prefilled
    sched = Scheduler(ModelRunner(model, 1), PlainPolicy(), "micro@t")
    out = _drive(sched, [Request("x", tuple([97] * 200), 4)])
    assert isinstance(out[0][1], Failed) and "context" in out[0][1].message and sched.free_slots == [0]


def test_stop_drains_then_refuses(model):
    # on its thread: stop() finishes what was queued, then new requests raise Draining
    sched = Scheduler(ModelRunner(model, 2), PlainPolicy(), "micro@t")
    sched.start()
    sinks = [QueueSink() for _ in range(5)]
    for i, s in enumerate(sinks):
        sched.submit(Request(str(i), (97 + i, 98), 20), s)
    assert sched.stop(timeout=30)
    assert all(s.collect(timeout=1)[1].reason == "length" for s in sinks)
    with pytest.raises(Draining):
        sched.submit(Request("late", (97,), 2), QueueSink())


def test_sampling_is_served_and_seeded(model):
    # temperature > 0: max_tokens tokens, and the same seed gives the same text (plain decode)
    sched = Scheduler(ModelRunner(model, 2), PlainPolicy(), "micro@t")
    req = [Request(str(i), (97, 98), 16, Sampling(0.8, 0.9, seed=5)) for i in range(2)]
    out = _drive(sched, req)
    assert out[0][0] == out[1][0] and out[0][1].completion_tokens == 16


@pytest.mark.parametrize("spec", ["mtp", "ngram", "prompt-lookup"])
def test_a_seeded_request_is_served_the_text_it_gets_alone_without_speculation(model, spec):
    # 12 sampled requests, each its own seed, through 4 slots under a drafting policy (widths 1..4, the
    # shared lookup cache between them): each gets the text it gets alone with speculation off
    prompts = _prompts(12, seed=3)
    sampling = [Sampling(0.8, 0.95, seed=100 + i) for i in range(12)]
    sched = Scheduler(ModelRunner(model, 4), build_policy(PolicyConfig(spec), model.cfg.mtp_depth), "micro@t")
    out = _drive(sched, [Request(str(i), tuple(p), 24, s) for i, (p, s) in enumerate(zip(prompts, sampling))])
    alone = [decode(generate(ModelRunner(model, 1), [p], 24, "off", sampling=s)[0].tokens)
             for p, s in zip(prompts, sampling)]
    assert [text for text, _ in out] == alone and sched.stats.proposed > 0


@pytest.mark.parametrize("spec", ["off", "mtp"])
def test_a_tiny_temperature_is_served_beside_a_greedy_request(model, spec):
    # "temperature": 5e-324 failed the prefill (1e-308 a later step) and every request in it with a 500
    prompts = _prompts(2)
    sched = Scheduler(ModelRunner(model, 2), build_policy(PolicyConfig(spec), model.cfg.mtp_depth), "micro@t")
    tiny = [Request(f"t{t}", tuple(prompts[0]), 12, Sampling(t, 1.0, seed=1)) for t in (5e-324, 1e-308)]
    out = _drive(sched, [*tiny, Request("greedy", tuple(prompts[1]), 12)])
    assert all(isinstance(end, Finished) for _, end in out)
    # at a temperature this small sampling is greedy
    assert [text for text, _ in out] == [_solo(model, prompts[0], 12)] * 2 + [_solo(model, prompts[1], 12)]


def test_lookup_min_ngram_holds_for_own_and_shared_copies_and_keeps_greedy_text(model):
    # --lookup-min-ngram 3: fewer, surer drafts; the text is plain greedy's, and copies from other
    # requests (the shared cache, at least 2 by default) need 3 matching tokens too
    prompts = _prompts(6, seed=3)
    config = PolicyConfig("prompt-lookup", lookup_min_ngram=3)
    sched = Scheduler(ModelRunner(model, 2), build_policy(config, model.cfg.mtp_depth), "micro@t")
    assert sched.shared.params.min_ngram == 3
    out = _drive(sched, [Request(str(i), tuple(p), 24) for i, p in enumerate(prompts)])
    assert [text for text, _ in out] == [_solo(model, p, 24) for p in prompts]
    with pytest.raises(ValueError, match="lookup min n-gram must be in 1..=4, got 5"):
        PolicyConfig("prompt-lookup", lookup_min_ngram=5)


def test_shared_lookup_is_scoped_by_tenant(model):
    # alice's finished request is copied from by alice's next sequence, never by bob's
    sched = Scheduler(ModelRunner(model, 2), build_policy(PolicyConfig("prompt-lookup"), 4), "micro@t")
    sched.shared.add_request(sched.scope(Request("old", (1,), 1, tenant="alice")), [5, 6, 7, 8, 9])
    history = [1, 2, 5, 6]  # no match in its own history, but (5, 6) occurred in alice's request
    alice = sched._proposer(Request("a", tuple(history), 4, tenant="alice"))
    bob = sched._proposer(Request("b", tuple(history), 4, tenant="bob"))
    assert alice.host_draft(3).tokens == [7, 8, 9]
    assert bob.host_draft(3).tokens == []


def test_a_planner_with_shared_bins_copies_from_the_tenants_finished_requests(model):
    from met.engine.policy_mtp import MtpPlannedPolicy
    from met.speculative.spec_capacity import DEFAULT_POOLS
    from met.speculative.spec_cost import (AcceptanceCalibration, Cell, CostTable, DrafterKey, LookupBin,
                                           PositionPrior, SpecCostState, TableKey)

    key = TableKey("box", "r@d", "none", {"decode": "a", "verify": "b", "draft_mtp": "c"})
    cells = [Cell(n, k, 0.01 * (1 + 0.1 * k), 0.0002 * k * n) for n in (1, 2) for k in range(3)]
    drafter = DrafterKey("mtp", "r", "d")
    bins = [LookupBin(2, 12, (0.9, 0.9), (1000, 900))]
    cal = AcceptanceCalibration(drafter, 0.6, 1000, (), [PositionPrior(1, 0.6, 1000)],
                                lookup=[LookupBin(1, 12, (0.9, 0.9), (1000, 900))], shared_lookup=bins)
    policy = MtpPlannedPolicy(SpecCostState(CostTable(key, cells), cal, 0.1, key, drafter), model.cfg.mtp_depth,
                              DEFAULT_POOLS)
    sched = Scheduler(ModelRunner(model, 2), policy, "micro@t")
    assert (sched.shared.params.min_ngram, sched.shared.params.max_ngram) == (2, 12)
    prompts = _prompts(4, seed=9)
    out = _drive(sched, [Request(str(i), tuple(p), 20, tenant="alice") for i, p in enumerate(prompts)])
    assert [text for text, _ in out] == [_solo(model, p, 20) for p in prompts]  # greedy text, whatever was copied
    assert sched.shared.scope_requests(sched.scope(Request("x", (1,), 1, tenant="alice"))) == 4  # finished: held
    held = [*prompts[0], *encode(out[0][0])]
    alice = sched._proposer(Request("a", (200, 201, *held[:6]), 4, tenant="alice"))
    bob = sched._proposer(Request("b", (200, 201, *held[:6]), 4, tenant="bob"))
    assert alice.shared_copy(3, 0) == (6, held[6:9])  # six tokens of alice's first request, then what followed
    assert bob.shared_copy(3, 0) == (0, [])


def test_energy_counts_each_step_as_it_ran_not_as_first_planned(model):
    # A metered table where plain decode is cheapest: the planner plans k = 0 on every step, and every
    # PROBE_AFTER plain steps a probe drafts anyway. The counter prices each step at its width and the
    # deepest drafts it verified (a probe at its drafts, not at the plan's k = 0).
    from met.engine.policy_mtp import MtpPlannedPolicy
    from met.speculative.spec_capacity import DEFAULT_POOLS
    from met.speculative.spec_cost import (AcceptanceCalibration, Cell, ConfidenceBin, CostTable, DrafterKey,
                                           PositionPrior, SpecCostState, TableKey)

    key = TableKey("box", "r@d", "nvml", {"decode": "a", "verify": "b", "draft_mtp": "c"})
    cells = [Cell(n, k, 0.01 * (1 + k), 0.01 * k, 1.0 + k, 0.5 * k) for n in (1, 4) for k in range(3)]
    drafter = DrafterKey("mtp", "r", "d")
    cal = AcceptanceCalibration(drafter, 0.1, 1000, [ConfidenceBin(0.0, 0.1, 1000)], [PositionPrior(1, 0.1, 1000)])
    state = SpecCostState(CostTable(key, cells), cal, 0.1, key, drafter)
    ran = []  # (width, deepest drafts verified, the first plan's k) per step

    class Seen(MtpPlannedPolicy):
        def observe(self, plan, outcomes, seconds):
            ran.append((len(outcomes), max(o.proposed for o in outcomes), plan.decision.k))

    sched = Scheduler(ModelRunner(model, 4), Seen(state, model.cfg.mtp_depth, DEFAULT_POOLS), "micro@t")
    _drive(sched, [Request(str(i), tuple(p), 40) for i, p in enumerate(_prompts(4))])
    assert any(k > 0 and planned == 0 for _, k, planned in ran)  # probes ran
    # verify_j 1 + k and draft_j 0.5 k at every width
    assert sched.stats.energy_j == pytest.approx(sum(1.0 + 1.5 * k for _, k, _ in ran))


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(0.8, 0.95, seed=7)], ids=["greedy", "seeded"])
def test_the_measured_planner_copying_from_histories_serves_the_text_plain_decoding_gives(model, sampling):
    # A metered table where a copy's verify is cheap and a calibration that trusts copies: the planner
    # copies wherever a history recurs (steps of mode "lookup"), drafts elsewhere, and mixes the two in
    # one step; every text is the one plain decoding gives alone, and the energy counter prices a copy
    # at its verify alone and a step's drafts at the width that drafted.
    from met.engine.policy_mtp import MtpPlannedPolicy
    from met.speculative.spec_capacity import DEFAULT_POOLS
    from met.speculative.spec_cost import (AcceptanceCalibration, Cell, CostTable, DrafterKey, LookupBin,
                                           PositionPrior, SpecCostState, TableKey)

    key = TableKey("box", "r@d", "nvml", {"decode": "a", "verify": "b", "draft_mtp": "c"})
    cells = [Cell(n, k, 0.01 * (1 + 0.1 * k), 0.0002 * k * n, 1.0 + k, 0.5 * k * n) for n in (1, 4) for k in range(3)]
    drafter = DrafterKey("mtp", "r", "d")
    cal = AcceptanceCalibration(drafter, 0.6, 1000, (), [PositionPrior(1, 0.6, 1000)],
                                lookup=[LookupBin(1, 12, (0.9, 0.9), (1000, 900))])
    state = SpecCostState(CostTable(key, cells), cal, 0.1, key, drafter)
    ran, sources = [], []  # (mode, deepest drafts verified) per step; what each step's plan chose

    class Seen(MtpPlannedPolicy):
        def observe(self, plan, outcomes, seconds):
            copying = plan.decision.copying or (plan.decision.source == "lookup",) * len(outcomes)
            drafted = sum(bool(d) and not c for d, c in zip(plan.depths, copying))  # sequences the drafter drafted for
            ran.append((plan.mode, max(o.proposed for o in outcomes), drafted))
            sources.append(plan.decision.source)

    prompts = _prompts(8, seed=5)
    sched = Scheduler(ModelRunner(model, 4), Seen(state, model.cfg.mtp_depth, DEFAULT_POOLS), "micro@t")
    out = _drive(sched, [Request(str(i), tuple(p), 30, sampling) for i, p in enumerate(prompts)])
    alone = [decode(generate(ModelRunner(model, 1), [p], 30, "off", sampling=sampling)[0].tokens) for p in prompts]
    assert [text for text, _ in out] == alone
    assert {"mtp", "mixed"} <= set(sources)  # sampled text recurs less: its steps never all copied
    assert not sampling.greedy or any(mode == "lookup" and k > 0 for mode, k, _ in ran)
    drafts = sum(0.5 * k * m for mode, k, m in ran if mode == "mtp")  # draft_j 0.5 k per sequence drafted for
    assert sched.stats.energy_j == pytest.approx(sum(1.0 + k for _, k, _ in ran) + drafts)


@pytest.mark.parametrize("spec", ["prompt-lookup", "mtp"])
def test_emitted_tokens_are_the_tokens_clients_get(model, spec):
    # a verify step can return tokens past a stop string; the counter (emitted_tokens,
    # met_emitted_tokens_total, tokens/s) counted them though no client got them
    prompts = _prompts(8, seed=0)
    texts = [_solo(model, p, 40) for p in prompts]
    stops = [(t[20:22],) if len(t) > 24 else () for t in texts]  # a stop inside a text it ends early
    sched = Scheduler(ModelRunner(model, 4), build_policy(PolicyConfig(spec), model.cfg.mtp_depth), "micro@t")
    out = _drive(sched, [Request(str(i), tuple(p), 40, stop=s) for i, (p, s) in enumerate(zip(prompts, stops))])
    assert any(end.reason == "stop" for _, end in out) and sched.stats.accepted > 0
    assert sched.stats.streamed == sum(end.completion_tokens for _, end in out)


def test_queued_counts_requests_not_the_inboxs_cancels_and_wake_ups(model):
    # the snapshot's queued added the inbox's size, cancels and wake-ups included
    sched = Scheduler(ModelRunner(model, 1), PlainPolicy(), "micro@t")
    sched.submit(Request("a", (97, 98), 4), QueueSink())
    for _ in range(3):
        sched.cancel("gone")
    sched._publish(None)
    assert sched.cell.latest().queued == 1
    sched.tick()  # "a" is admitted, the cancels are taken
    sched.submit(Request("b", (97, 98), 4), QueueSink())
    sched._publish(None)
    assert sched.cell.latest().queued == 1


class _Wrapped:
    """A policy around another, as a recorder or a timer is: it passes on exactly what Policy declares."""

    def __init__(self, policy) -> None:
        from met.engine.policy_base import Policy

        self.policy = policy
        for member in Policy.__annotations__:  # the interface's settings: name, and what it copies from
            setattr(self, member, getattr(policy, member))

    def plan(self, runner, seqs):
        return self.policy.plan(runner, seqs)

    def draft(self, runner, seqs, plan):
        return self.policy.draft(runner, seqs, plan)

    def observe(self, plan, outcomes, seconds):
        self.policy.observe(plan, outcomes, seconds)


def test_a_wrapped_policy_copies_as_the_policy_it_wraps(model):
    # the scheduler read min_ngram, copy_ngram and shared_ngram off the policy with getattr: a wrapper that
    # passed on what Policy declared lost them, and the planner it wrapped never saw a copy
    from met.engine.policy_mtp import MtpPlannedPolicy
    from met.speculative.spec_capacity import DEFAULT_POOLS
    from met.speculative.spec_cost import (AcceptanceCalibration, Cell, CostTable, DrafterKey, LookupBin,
                                           PositionPrior, SpecCostState, TableKey)

    key = TableKey("box", "r@d", "none", {"decode": "a", "verify": "b", "draft_mtp": "c"})
    cells = [Cell(n, k, 0.01 * (1 + 0.1 * k), 0.0002 * k * n) for n in (1, 2) for k in range(3)]
    drafter = DrafterKey("mtp", "r", "d")
    cal = AcceptanceCalibration(drafter, 0.6, 1000, (), [PositionPrior(1, 0.6, 1000)],
                                lookup=[LookupBin(1, 12, (0.9, 0.9), (1000, 900))],
                                shared_lookup=[LookupBin(2, 12, (0.9, 0.9), (1000, 900))])
    planner = MtpPlannedPolicy(SpecCostState(CostTable(key, cells), cal, 0.1, key, drafter), model.cfg.mtp_depth,
                               DEFAULT_POOLS)
    lookup = build_policy(PolicyConfig("prompt-lookup", lookup_min_ngram=3), model.cfg.mtp_depth)
    for policy in (planner, _Wrapped(planner)):
        sched = Scheduler(ModelRunner(model, 2), policy, "micro@t")
        assert (sched.shared.params.min_ngram, sched.shared.params.max_ngram) == (2, 12)  # other requests' copies
        own = sched._proposer(Request("a", (5, 6, 7, 5, 6), 4))
        assert own.matched_copy(2) == (2, [7, 5])  # "5 6" recurs: the history is indexed for copies
    for policy in (lookup, _Wrapped(lookup)):
        sched = Scheduler(ModelRunner(model, 2), policy, "micro@t")
        assert sched._proposer(Request("a", (5, 6, 7, 5, 6), 4)).host_draft(2).tokens == []  # 2 < min n-gram 3
        assert sched._proposer(Request("a", (5, 6, 7, 5, 6, 7), 4)).host_draft(2).tokens == [5, 6]
