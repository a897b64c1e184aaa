"""The model runner: speculation never changes greedy output; batching and rollback are invisible."""

import random

import pytest
import torch

from met.engine.generate import generate
from met.engine.runner import Draft, ModelRunner, Sampling
from met.speculative.catchup import CATCHUP_SHARED_ROWS, catchup_groups


def _prompts(seed: int, lengths=(5, 17, 9, 30)) -> list[list[int]]:
    rng = random.Random(seed)
    # small alphabet so n-gram proposers find matches
    return [[rng.randrange(8) for _ in range(n)] for n in lengths]


@pytest.mark.parametrize("spec", ["mtp", "ngram", "prompt-lookup"])
@pytest.mark.parametrize("depth", [1, 3, 4])
def test_speculation_is_token_identical_to_plain_greedy(model, spec, depth):
    # every drafting mode, every depth: the same tokens as plain greedy decoding
    prompts = _prompts(depth)
    plain = generate(ModelRunner(model, 4), prompts, 48, "off", stop_at_eos=False)
    spec_out = generate(ModelRunner(model, 4), prompts, 48, spec, depth, stop_at_eos=False)
    assert [o.tokens for o in spec_out] == [o.tokens for o in plain]
    assert sum(o.proposed for o in spec_out) > 0


@pytest.mark.parametrize("spec", ["off", "mtp", "prompt-lookup"])
def test_generate_moves_sequences_down_as_others_finish_and_stays_exact(model, spec):
    # a 40-token context ends each prompt at its own step; the survivors move into slots 0..n-1 and
    # every output still equals the prompt's solo run
    prompts = _prompts(5)
    steps, moves = [], []
    runner = ModelRunner(model, 4, max_len=40)
    verify, move = runner.verify, runner.move
    runner.verify = lambda slots, drafts: steps.append(list(slots)) or verify(slots, drafts)
    runner.move = lambda src, dst: moves.append((src, dst)) or move(src, dst)
    together = generate(runner, prompts, 60, spec, 3, stop_at_eos=False)
    alone = [generate(ModelRunner(model, 1, max_len=40), [p], 60, spec, 3, stop_at_eos=False)[0] for p in prompts]
    assert [o.tokens for o in together] == [o.tokens for o in alone]
    assert moves and all(s == list(range(len(s))) for s in steps)


def _run_with_drafts(model, prompt, n_tokens, draft_fn):
    runner = ModelRunner(model, 1)
    out = runner.prefill([0], [prompt], [Sampling()])
    while len(out) < n_tokens:
        drafts = draft_fn(len(out), min(4, runner.room(0)))
        out += runner.verify([0], [Draft(drafts, [0.0] * len(drafts))])[0].tokens
    return out[:n_tokens]


def test_adversarial_drafts_never_change_greedy_output(model):
    # drafts copied from the true continuation, then corrupted at a random place or wholly random
    prompt = _prompts(1)[1]
    truth = generate(ModelRunner(model, 1), [prompt], 60, "off", stop_at_eos=False)[0].tokens
    rng = random.Random(7)

    def drafts(done, k):
        d = truth[done : done + k]
        if rng.random() < 0.5 and d:
            d[rng.randrange(len(d))] = rng.randrange(258)
        return d if rng.random() < 0.8 else [rng.randrange(258) for _ in range(k)]

    assert _run_with_drafts(model, prompt, 60, drafts) == truth


def test_replan_stops_extends_and_drops_drafts_and_greedy_output_stays_plain(model):
    # the same prefix of the drafts a full-depth draft makes, wherever replan stops; exact output throughout
    prompts = _prompts(4)[:2]

    def runner():
        r = ModelRunner(model, 2)
        r.prefill([0, 1], prompts, [Sampling()] * 2)
        return r

    full = runner().draft_mtp([0, 1], [4, 3])
    asked = []

    def to(target):
        return lambda j, drafts: asked.append((j, [len(d.tokens) for d in drafts])) or target

    for target, want in [(9, [4, 3]), (2, [2, 2]), (1, [1, 1]), (0, [0, 0])]:
        asked.clear()
        got = runner().draft_mtp([0, 1], [4, 3], to(target))
        assert [len(d.tokens) for d in got] == want
        assert [d.tokens for d in got] == [f.tokens[:n] for f, n in zip(full, want)]
        assert [len(d.confidences) for d in got] == want
        # asked after each pass that was not the deepest, every row's drafts so far
        assert asked == [(1, [1, 1]), (2, [2, 2]), (3, [3, 3])][: 1 if target <= 2 else 3]
    rng = random.Random(3)
    plain = generate(ModelRunner(model, 2), prompts, 40, "off", stop_at_eos=False)
    r, out = runner(), [[], []]
    while min(map(len, out)) < 40:
        drafts = r.draft_mtp([0, 1], [4, 4], lambda j, drafts: rng.randrange(5))
        for o, v in zip(out, r.verify([0, 1], drafts)):
            o += v.tokens
    assert [o[:39] for o in out] == [p.tokens[1:40] for p in plain]


def test_batched_verify_equals_each_alone(model):
    # ragged batch: different prompt lengths and different draft counts per sequence
    prompts = _prompts(3)
    drafts = [[1, 2, 3], [], [4], [5, 6, 7, 0]]
    batch = ModelRunner(model, 4)
    batch.prefill(list(range(4)), prompts, [Sampling()] * 4)
    together = batch.verify(list(range(4)), [Draft(d, [0.0] * len(d)) for d in drafts])
    for i, (p, d) in enumerate(zip(prompts, drafts)):
        alone = ModelRunner(model, 1)
        alone.prefill([0], [p], [Sampling()])
        assert alone.verify([0], [Draft(d, [0.0] * len(d))])[0].tokens == together[i].tokens


def test_rollback_leaves_cache_as_if_rejected_tokens_never_ran(model):
    # verify 4 wrong drafts, then compare the valid cache prefix with a run that never saw them
    prompt = _prompts(4)[3]
    a = ModelRunner(model, 1)
    a.prefill([0], [prompt], [Sampling()])
    res = a.verify([0], [Draft([257, 257, 257, 257], [0.0] * 4)])[0]
    assert res.accepted == 0 and a.length(0) == len(prompt) + 1
    b = ModelRunner(model, 1)
    b.prefill([0], [prompt], [Sampling()])
    b.verify([0], [Draft([], [])])
    n = a.length(0)
    assert b.length(0) == n
    assert torch.allclose(a.cache.k[:-1, 0, :, :n], b.cache.k[:-1, 0, :, :n], atol=1e-12)
    assert torch.allclose(a.cache.v[:-1, 0, :, :n], b.cache.v[:-1, 0, :, :n], atol=1e-12)
    # and everything after is the same as well
    assert generate_after(a) == generate_after(b)


def generate_after(runner: ModelRunner, steps: int = 10) -> list[int]:
    out = []
    for _ in range(steps):
        out += runner.verify([0], [Draft([], [])])[0].tokens
    return out


def test_released_slot_is_reused_cleanly(model):
    # a slot freed mid-sequence serves a new prompt exactly like a fresh runner
    p1, p2 = _prompts(5)[:2]
    r = ModelRunner(model, 1)
    r.prefill([0], [p1], [Sampling()])
    generate_after(r, 5)
    r.release(0)
    first = r.prefill([0], [p2], [Sampling()])
    fresh = ModelRunner(model, 1)
    assert first == fresh.prefill([0], [p2], [Sampling()])
    assert generate_after(r) == generate_after(fresh)


def _mtp_steps(runner: ModelRunner, slots: list[int], steps: int) -> list[list[int]]:
    out = [[] for _ in slots]
    for _ in range(steps):
        for o, r in zip(out, runner.verify(slots, runner.draft_mtp(slots, [3] * len(slots)))):
            o += r.tokens
    return out


def test_a_moved_sequence_goes_on_as_if_it_never_moved(model):
    # slots 0 and 3 draft and verify; 3 moves into 1 mid-sequence; both continue exactly as unmoved
    p1, p2 = _prompts(6)[:2]
    moved, still = ModelRunner(model, 4), ModelRunner(model, 4)
    for r in (moved, still):
        r.prefill([0, 3], [p1, p2], [Sampling()] * 2)
    assert _mtp_steps(moved, [0, 3], 4) == _mtp_steps(still, [0, 3], 4)
    moved.move(3, 1)
    assert moved.length(3) == 0 and 3 not in moved.seqs and moved.length(1) == still.length(3)
    assert _mtp_steps(moved, [0, 1], 6) == _mtp_steps(still, [0, 3], 6)
    with pytest.raises(ValueError, match="free destination"):
        moved.move(0, 1)
    assert moved.compact([0, 1]) == {}  # already 0..n-1: nothing moves
    with pytest.raises(ValueError, match="busy source"):
        moved.move(3, 2)


def test_compact_moves_the_sequences_past_n_into_the_free_slots_below(model):
    r = ModelRunner(model, 6)
    r.prefill([0, 3, 5], _prompts(7)[:3], [Sampling()] * 3)
    assert r.compact([0, 3, 5]) == {3: 1, 5: 2} and sorted(r.seqs) == [0, 1, 2]


def test_sampling_with_speculation_is_seeded_and_runs(model):
    # temperature > 0 with MTP drafts: same seed, same text; another seed, another text
    prompts = _prompts(6)[:2]
    def run(seed):
        return [o.tokens for o in generate(ModelRunner(model, 2), prompts, 40, "mtp", 3,
                                           Sampling(temperature=1.0, seed=seed), stop_at_eos=False)]
    assert run(1) == run(1)
    assert run(1) != run(2)


def test_an_unseeded_sampled_request_leaves_torchs_global_generator_alone(model):
    # its own generator is seeded from the OS; torch.seed() reseeded the global one on every such request
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    generate(ModelRunner(model, 2), _prompts(6)[:2], 8, "mtp", 2, Sampling(temperature=1.0), stop_at_eos=False)
    assert torch.equal(torch.rand(3), expected)


def test_prefill_rejects_prompts_that_do_not_fit(model):
    # a prompt longer than the context is refused with the sizes named
    with pytest.raises(ValueError, match="does not fit"):
        ModelRunner(model, 1, max_len=16).prefill([0], [[1] * 16], [Sampling()])


def test_sampling_refuses_a_seed_torch_cannot_take():
    # a seed outside what torch.Generator takes is refused when the request is made, not in the batch's prefill
    assert Sampling(1.0, seed=(1 << 64) - 1).seed == (1 << 64) - 1 and Sampling(1.0, seed=-(1 << 63)).seed < 0
    for seed in (1 << 64, -(1 << 63) - 1, 10**30):
        with pytest.raises(ValueError, match="seed must be a whole number from -2\\*\\*63 to 2\\*\\*64 - 1"):
            Sampling(1.0, seed=seed)


def test_mtp_catch_up_beside_a_deep_sequence_drafts_as_each_alone(model):
    # a sequence 100 tokens deep drafts in the same step as a newly admitted 100-token prompt: the MTP
    # catch-up pads every row to the longest, so the deep row's padding runs past the end of the context
    # (an IndexError in the rope lookup, which failed the whole step); each row drafts as it would alone
    rng = random.Random(9)
    deep, new = [[rng.randrange(256) for _ in range(100)] for _ in range(2)]

    def deep_runner(max_batch: int) -> ModelRunner:
        r = ModelRunner(model, max_batch)
        r.prefill([0], [deep], [Sampling()])
        r.verify([0], r.draft_mtp([0], [2]))
        return r

    batch = deep_runner(2)
    batch.prefill([1], [new], [Sampling()])
    together = batch.draft_mtp([0, 1], [2, 2])
    alone_new = ModelRunner(model, 1)
    alone_new.prefill([0], [new], [Sampling()])
    for got, want in zip(together, [deep_runner(1).draft_mtp([0], [2])[0], alone_new.draft_mtp([0], [2])[0]]):
        assert got.tokens == want.tokens and got.confidences == pytest.approx(want.confidences, abs=1e-9)


def test_catch_up_groups_short_rows_together_and_long_ones_by_size_class():
    # a just-prefilled prompt's catch-up is not padded onto the others' few rows
    assert catchup_groups([3, 100, 1, 40]) == [[0, 2], [3], [1]]
    assert catchup_groups([2, 2]) == [[0, 1]]
    assert catchup_groups([CATCHUP_SHARED_ROWS + 1]) == [[0]]
    # a run of plain steps leaves every sequence the same long catch-up: one pass, not one each
    assert catchup_groups([17] * 16) == [list(range(16))]
    # prompts admitted together share a pass when no row would be padded past twice its length
    assert catchup_groups([256, 200, 129, 128, 5]) == [[4], [3], [0, 1, 2]]


@pytest.mark.parametrize("rows", [[1], [16, 17], [3, 100, 1, 40, 64, 65], [17] * 16, [300, 2, 150, 151, 33]])
def test_catch_up_groups_cover_every_row_once_padding_long_ones_at_most_twice(rows):
    groups = catchup_groups(rows)
    assert sorted(b for g in groups for b in g) == list(range(len(rows)))
    for g in groups:
        longest = max(rows[b] for b in g)
        assert all(rows[b] <= CATCHUP_SHARED_ROWS for b in g) or all(2 * rows[b] >= longest for b in g)


def test_mtp_drafts_keep_their_rows_when_a_prompt_catches_up_in_between(model):
    # slots 0 and 2 are mid-generation, slot 1 was just prefilled: three catch-up shapes, two passes;
    # every row's drafts are the ones it makes alone
    rng = random.Random(11)
    prompts = [[rng.randrange(256) for _ in range(n)] for n in (30, 60, 45)]

    def warmed(slot_prompts: list[list[int]]) -> ModelRunner:
        r = ModelRunner(model, len(slot_prompts))
        slots = list(range(len(slot_prompts)))
        r.prefill(slots, slot_prompts, [Sampling()] * len(slots))
        r.verify(slots, r.draft_mtp(slots, [3] * len(slots)))
        return r

    batch = ModelRunner(model, 3)
    batch.prefill([0, 2], [prompts[0], prompts[2]], [Sampling()] * 2)
    batch.verify([0, 2], batch.draft_mtp([0, 2], [3, 3]))
    batch.prefill([1], [prompts[1]], [Sampling()])
    together = batch.draft_mtp([0, 1, 2], [3, 3, 3])
    fresh = ModelRunner(model, 1)
    fresh.prefill([0], [prompts[1]], [Sampling()])
    alone = [warmed([prompts[0]]).draft_mtp([0], [3])[0], fresh.draft_mtp([0], [3])[0],
             warmed([prompts[2]]).draft_mtp([0], [3])[0]]
    for got, want in zip(together, alone):
        assert got.tokens == want.tokens and got.confidences == pytest.approx(want.confidences, abs=1e-9)


def test_drafting_twice_without_a_verify_says_so(model):
    # the first draft's catch-up takes the rows the second would start from: a clear error, not torch's
    # "stack expects a non-empty TensorList"
    runner = ModelRunner(model, 2)
    runner.prefill([0, 1], [[97, 98, 99], [100, 101]], [Sampling()] * 2)
    drafts = runner.draft_mtp([0, 1], [2, 2])
    with pytest.raises(RuntimeError, match="slot 0 was drafted for and not verified since"):
        runner.draft_mtp([0, 1], [2, 2])
    runner.verify([0, 1], drafts)
    assert [len(d.tokens) for d in runner.draft_mtp([0, 1], [2, 2])] == [2, 2]


def test_equal_prompts_share_one_prefill_and_decode_as_if_alone(model):
    # [p, q, p] runs two rows, not three; the copy's cache entries and its greedy decode equal p's alone
    p, q = _prompts(11, (12, 7))
    runner = ModelRunner(model, 3)
    widths, hidden = [], runner.model.hidden
    runner.model.hidden = lambda tokens, ctx: widths.append(tokens.shape[0]) or hidden(tokens, ctx)
    firsts = runner.prefill([0, 1, 2], [p, q, p], [Sampling()] * 3)
    runner.model.hidden = hidden
    assert widths == [2] and firsts[0] == firsts[2]
    assert torch.equal(runner.cache.kv[:, 2, :, : len(p)], runner.cache.kv[:, 0, :, : len(p)])
    alone = generate(ModelRunner(model, 1), [p], 24, "mtp", 2, stop_at_eos=False)[0].tokens
    together = generate(ModelRunner(model, 3), [p, q, p], 24, "mtp", 2, stop_at_eos=False)
    assert together[0].tokens == together[2].tokens == alone
