"""Differential fuzz of the model runner: random schedules against the plain, uncached forward pass.

A hypothesis state machine runs prefill (ragged, into any free slots), MTP, DFlash and draft-model
drafts (with replans that stop, drop or cap), verify with drafts that are partly right, partly wrong (greedy and
sampled rows), moves, compaction and releases on several slots at once, in contexts short enough that
sequences reach their end. After every operation each live sequence's cache, catch-up state and
hidden state must be what the uncached model computes on its history (prompt + emitted), and the
draft model's cache what it computes on the history's first tokens, the rest waiting; every verify
and draft must score exactly what the uncached model scores on the same tokens.
MET_FUZZ_EXAMPLES=500 runs a long fuzz.
"""

import os

import torch
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from random_models import micro_model

from met.engine.accept import greedy_accept
from met.engine.runner import Draft, ModelRunner, Sampling
from met.model.config import ModelConfig
from met.model.dflash import DflashConfig, DflashDrafter
from met.model.transformer import Transformer, rope_pair_order
from met.speculative.catchup import catchup_groups

ATOL = 1e-9  # float64: the cached and uncached paths differ by rounding only



def _qwen_like() -> Transformer:
    """A micro model with Qwen2's layout: q, k, v and o biases, tied embeddings, heads wider than dim / n_heads."""
    torch.manual_seed(2)
    cfg = ModelConfig.from_name("micro").with_(n_heads=2, n_kv_heads=2, head_size=20, attention_bias=True,
                                                  output_bias=True, tie_word_embeddings=True)
    m = Transformer(cfg)
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return m.double().eval()


MODELS = [micro_model(0), _qwen_like()]
torch.manual_seed(1)
DRAFTER = DflashDrafter(DflashConfig.for_target(MODELS[0].cfg, block=4, ffn_dim=32)).double().eval()
V = MODELS[0].cfg.vocab_size
SMALL = micro_model(3)  # a draft model of the same vocabulary for either model
MODEL = MODELS[0]  # the model of the machine now running (they run one at a time)
captured: list[torch.Tensor] = []  # every output of the runner's logits_cached, in order


def _spy(hidden: torch.Tensor, mtp_input: bool = False):
    out = Transformer.logits_cached(MODEL, hidden, mtp_input)
    captured.append((out[0] if mtp_input else out).clone())
    return out


@torch.no_grad()
def ref_hidden(history: list[int]) -> torch.Tensor:
    """Uncached last-layer hidden states [T, dim] of history."""
    return MODEL.hidden(torch.tensor([history]))[0]


@torch.no_grad()
def ref_logits(tokens: list[int]) -> torch.Tensor:
    """Uncached next-token logits [T, V] after each prefix of tokens."""
    return MODEL(torch.tensor([tokens]))[0]


@torch.no_grad()
def ref_main_kv(history: list[int], model: Transformer | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Uncached keys and values of each main layer of model (default MODEL), [Hkv, T, D] each (the cache's layout)."""
    model = model or MODEL
    x = model.model.embed_tokens(torch.tensor([history]))
    cos, sin = model._rope(model._positions(torch.tensor([history]), None))
    out = []
    for layer in model.model.layers:
        x, (k, v) = layer(x, cos, sin)
        out.append((k[0].transpose(0, 1), v[0].transpose(0, 1)))
    return out


@torch.no_grad()
def ref_mtp(h: torch.Tensor, next_tokens: list[int]):
    """Uncached MTP pass over rows (h[i], next_tokens[i]): (MTP hidden [T, dim], keys, values [Hkv, T, D])."""
    m, (k, v) = MODEL.mtp_hidden(h[None], torch.tensor([next_tokens]))
    return m[0], k[0].transpose(0, 1), v[0].transpose(0, 1)


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a, b, atol=ATOL, rtol=0)


def paired(k: torch.Tensor) -> torch.Tensor:
    """Reference keys [..., head_dim] in the order the cached path stores them (RoPE pairs side by side)."""
    return k[..., rope_pair_order(k.shape[-1])]


class RunnerMachine(RuleBasedStateMachine):
    """Slots of one runner, each with the history its sequence must have (prompt + emitted, last = pending)."""

    @initialize(model=st.sampled_from([0, 0, 1]), max_batch=st.integers(1, 5),
                max_len=st.sampled_from([6, 12, 24, 40, 60, 60, 128]), dflash=st.booleans(),
                track_mtp=st.sampled_from([True, True, True, False]), draft=st.booleans())
    def start(self, model, max_batch, max_len, dflash, track_mtp, draft):
        global MODEL
        MODEL = MODELS[model]
        event(f"model {model}")
        MODEL.logits_cached = _spy
        self.runner = ModelRunner(MODEL, max_batch, max_len=max_len, track_mtp=track_mtp,
                                  dflash=DRAFTER if dflash else None, draft_model=SMALL if draft else None)
        self.max_len = max_len
        self.history: dict[int, list[int]] = {}

    def teardown(self):
        MODEL.__dict__.pop("logits_cached", None)
        captured.clear()

    # helpers

    def free(self) -> list[int]:
        return [s for s in range(self.runner.cache.max_batch) if s not in self.history]

    def steppable(self) -> list[int]:
        return [s for s in self.history if self.runner.room(s) >= 0]

    def truth(self, slot: int, k: int) -> list[int]:
        """The next k tokens of plain greedy decoding after the slot's history."""
        h = list(self.history[slot])
        for _ in range(k):
            h.append(int(ref_logits(h)[-1].argmax()))
        return h[len(self.history[slot]):]

    def sampling(self, slot: int) -> Sampling:
        return self.runner.seqs[slot].sampling

    # operations

    @rule(data=st.data())
    def operate(self, data):
        """One operation among those the runner's state allows (a step most often)."""
        ops = ([self.prefill] if self.free() else []) + ([self.step] * 3 if self.steppable() else [])
        if self.history:
            ops += [self.release] + ([self.move] if self.free() else []) + [self.compact]
        op = data.draw(st.sampled_from(ops), "op")
        event(op.__name__)
        op(data)

    def prefill(self, data):
        free = self.free()
        slots = data.draw(st.lists(st.sampled_from(free), min_size=1, max_size=len(free), unique=True), "slots")
        # short prompts beside long ones: catch-up passes of every size class
        lens = [data.draw(st.integers(1, min(4, self.max_len - 1)) | st.integers(1, self.max_len - 1), "prompt length")
                for _ in slots]
        prompts = [data.draw(st.lists(st.integers(0, V - 1), min_size=n, max_size=n), "prompt") for n in lens]
        samplings = [data.draw(st.sampled_from([Sampling(), Sampling(), Sampling(1.0, seed=7)]), "sampling")
                     for _ in slots]
        captured.clear()
        firsts = self.runner.prefill(slots, prompts, samplings)
        (logits,) = captured  # one row per distinct prompt: equal prompts share one prefill
        rows = {}
        for i, (slot, p, s) in enumerate(zip(slots, prompts, samplings)):
            want = ref_logits(p)[-1]
            assert close(logits[rows.setdefault(tuple(p), len(rows))], want), f"prefill logits of slot {slot}"
            if s.greedy:
                assert firsts[i] == int(want.argmax())
            self.history[slot] = p + [firsts[i]]

    def step(self, data):
        live = self.steppable()
        slots = data.draw(st.permutations(live).flatmap(lambda p: st.integers(1, len(p)).map(lambda n: p[:n])),
                          "slots")
        drafter = data.draw(st.sampled_from(["mtp", "dflash", "draft", "host"]), "drafter")
        if drafter == "mtp" and not self.runner.track_mtp or drafter == "dflash" and self.runner.dflash is None \
                or drafter == "draft" and self.runner.draft_model is None:
            drafter = "host"
        cap = 4 if drafter == "dflash" else 5
        depths = [data.draw(st.integers(0, min(cap, self.runner.room(s))), "depth") for s in slots]
        room = min(self.runner.room(s) for s in slots)
        event(f"{drafter} step")
        event(f"step width {len(slots)}, least room {room if room < 4 else '4+'}")
        in_a_row = slots == list(range(slots[0], slots[0] + len(slots)))  # the cache reads views, else a gather
        event("step on " + ("slots from 0" if in_a_row and slots[0] == 0 else
                            "slots in a row" if in_a_row else "scattered slots"))
        if drafter == "mtp":
            drafts = self.draft_mtp(slots, depths, data)
        elif drafter == "dflash":
            drafts = self.draft_dflash(slots, depths)
        elif drafter == "draft":
            drafts = self.draft_small(slots, depths)
        else:
            drafts = [Draft([], []) for _ in slots]
        for i, (slot, k) in enumerate(zip(slots, depths)):
            d = drafts[i]
            if drafter == "host" or self.sampling(slot).greedy and d.tokens and data.draw(st.booleans(), "edit"):
                how = data.draw(st.sampled_from(["truth", "corrupt", "random"]), "how")
                k = len(d.tokens) if drafter != "host" else k
                tokens = self.truth(slot, k)
                if how == "corrupt" and k:
                    tokens[data.draw(st.integers(0, k - 1), "at")] = data.draw(st.integers(0, V - 1), "tok")
                elif how == "random":
                    tokens = [data.draw(st.integers(0, V - 1), "tok") for _ in range(k)]
                drafts[i] = Draft(tokens, [0.0] * k)  # host drafts: deterministic, q None
        self.verify(slots, drafts)

    def draft_mtp(self, slots, depths, data) -> list[Draft]:
        asked = []
        replan = None
        if data.draw(st.booleans(), "replan"):
            def replan(j, drafts):
                target = data.draw(st.integers(0, 6), "target")
                asked.append((j, [len(d.tokens) for d in drafts], target))
                return target
        behind = [self.runner.mtp_behind(s) for s, d in zip(slots, depths) if d]
        event(f"MTP catch-up passes: {len(catchup_groups(behind))}")
        drafts = self.runner.draft_mtp(slots, depths, replan)
        # the lengths the replans asked for: each row keeps at most its own depth and every later cap
        want, cur = [0] * len(slots), list(depths)
        for j in range(1, max(depths, default=0) + 1):
            want = [min(d, j) for d in cur]
            if not asked or asked[0][0] != j:
                continue
            _, seen, target = asked.pop(0)
            assert seen == want, "replan sees every row's drafts so far"
            event(f"replan {'stops' if target <= j else 'caps'}")
            if target <= j:
                want = [min(w, target) for w in want]
                break
            cur = [min(d, target) for d in cur]
        assert not asked, "replan asked only after passes that are not the deepest"
        assert [len(d.tokens) for d in drafts] == want
        for slot, d in zip(slots, drafts):
            self.check_mtp_draft(slot, d)
        return drafts

    def check_mtp_draft(self, slot: int, d: Draft) -> None:
        """The draft's confidences (and greedy tokens) are the uncached MTP module's on the slot's history."""
        hist = self.history[slot]
        h = ref_hidden(hist)[:-1]  # rows 0..L-1: row i predicted hist[i + 1]
        rows, nxt = h, hist[1:]
        assert len(d.confidences) == len(d.tokens)
        for j, tok in enumerate(d.tokens):
            m, _, _ = ref_mtp(rows, nxt)
            with torch.no_grad():
                logp = torch.log_softmax(MODEL.mtp_logits(m[-1]), -1)
            assert abs(float(logp.max()) - d.confidences[j]) < 1e-7, f"slot {slot}: draft {j + 1}'s confidence"
            if self.sampling(slot).greedy:
                assert tok == int(logp.argmax()), f"slot {slot}: draft {j + 1}"
            rows, nxt = torch.cat([rows, m[-1:]]), nxt + [tok]  # recursive: the MTP hidden feeds the next pass

    def draft_dflash(self, slots, gammas) -> list[Draft]:
        drafts = self.runner.draft_dflash(slots, gammas)
        for slot, g, d in zip(slots, gammas, drafts):
            assert len(d.tokens) == g
            if not g:
                continue
            hist = self.history[slot]
            with torch.no_grad():
                logits = DRAFTER(MODEL, ref_hidden(hist)[-2][None], torch.tensor([hist[-1]]))[0, :g]
            top = torch.log_softmax(logits, -1).max(-1)
            assert torch.allclose(torch.tensor(d.confidences, dtype=torch.float64), top.values, atol=1e-7)
            if self.sampling(slot).greedy:
                assert d.tokens == top.indices.tolist()
        return drafts

    def draft_small(self, slots, depths) -> list[Draft]:
        """The draft model's drafts: its confidences (and greedy tokens) are its own uncached ones on the history."""
        drafts = self.runner.draft_small(slots, depths)
        for slot, k, d in zip(slots, depths, drafts):
            assert len(d.tokens) == len(d.confidences) == k
            seq = list(self.history[slot])
            for j, tok in enumerate(d.tokens):
                with torch.no_grad():
                    logp = torch.log_softmax(SMALL(torch.tensor([seq]))[0, -1], -1)
                assert abs(float(logp.max()) - d.confidences[j]) < 1e-7, f"slot {slot}: draft {j + 1}'s confidence"
                if self.sampling(slot).greedy:
                    assert tok == int(logp.argmax()), f"slot {slot}: draft {j + 1}"
                seq.append(tok)
        return drafts

    def verify(self, slots, drafts) -> None:
        captured.clear()
        results = self.runner.verify(slots, drafts)
        (logits,) = captured  # [B, T, V]
        for i, (slot, d, r) in enumerate(zip(slots, drafts, results)):
            k = len(d.tokens)
            row = self.history[slot] + d.tokens
            want = ref_logits(row)[-(k + 1):]
            assert close(logits[i, : k + 1], want), f"verify logits of slot {slot} ({k} drafts)"
            if self.sampling(slot).greedy:
                a, nxt = greedy_accept(d.tokens, want.argmax(-1).tolist())
                assert (r.accepted, r.tokens) == (a, d.tokens[:a] + [nxt])
            assert r.tokens[:-1] == d.tokens[: r.accepted]
            if len(slots) == 1:  # the B1 gauge: top-1 minus top-2 at the first position
                top2 = want[0].topk(2).values
                assert abs(r.margin - float(top2[0] - top2[1])) < 1e-7
            self.history[slot] += r.tokens

    def release(self, data):
        slot = data.draw(st.sampled_from(sorted(self.history)), "slot")
        self.runner.release(slot)
        del self.history[slot]

    def move(self, data):
        src = data.draw(st.sampled_from(sorted(self.history)), "src")
        dst = data.draw(st.sampled_from(self.free()), "dst")
        self.runner.move(src, dst)
        self.history[dst] = self.history.pop(src)

    def compact(self, data):
        slots = data.draw(st.permutations(sorted(self.history)), "order")
        moves = self.runner.compact(slots)
        for src, dst in moves.items():
            assert dst < len(slots) <= src
            self.history[dst] = self.history.pop(src)
        assert all(s < len(slots) for s in self.history)

    # invariants

    @invariant()
    def state_is_the_uncached_models(self):
        if not hasattr(self, "runner"):
            return
        r = self.runner
        assert sorted(r.seqs) == sorted(self.history)
        for slot, hist in self.history.items():
            L = len(hist) - 1  # the pending token is not cached
            seq = r.seqs[slot]
            assert r.length(slot) == L and seq.pending == hist[-1]
            assert r.room(slot) == self.max_len - L - 1
            h = ref_hidden(hist[:-1]) if L else None
            for layer, (k, v) in enumerate(ref_main_kv(hist[:-1])):
                assert close(r.cache.k[layer, slot, :, :L], paired(k)), f"slot {slot}: layer {layer}'s keys"
                assert close(r.cache.v[layer, slot, :, :L], v), f"slot {slot}: layer {layer}'s values"
            if r.dflash is not None:
                assert close(seq.last_h, h[-1]), f"slot {slot}: the hidden state a DFlash draft reads"
            if r.draft_model is not None:  # its cache: the history's first n tokens; the rest wait, pending last
                small = r.draft_model
                n = small.cache.lengths[slot]
                assert small.behind[slot] == hist[n:] and small.fed[slot] == [], f"slot {slot}: the draft model's"
                for layer, (k, v) in enumerate(ref_main_kv(hist[:n], SMALL) if n else ()):
                    assert close(small.cache.k[layer, slot, :, :n], paired(k)), f"slot {slot}: draft layer {layer}'s keys"
                    assert close(small.cache.v[layer, slot, :, :n], v), f"slot {slot}: draft layer {layer}'s values"
            if not r.track_mtp:
                continue
            m = r.cache.mtp_lengths[slot]
            assert m + r.mtp_behind(slot) == L, f"slot {slot}: MTP rows cached + behind != {L}"
            assert (seq.catchup_tokens(r.device).tolist() if seq.catchup_ids else []) == hist[m + 1 : L + 1]
            behind = seq.catchup_rows() if seq.catchup_h else h[m:m]
            assert close(behind, MODEL.mtp_input(h[m:L])), f"slot {slot}: catch-up rows"
            if m:
                _, k, v = ref_mtp(h[:m], hist[1 : m + 1])
                layer = MODEL.cfg.n_layers
                assert close(r.cache.k[layer, slot, :, :m], paired(k)), f"slot {slot}: the MTP block's keys"
                assert close(r.cache.v[layer, slot, :, :m], v), f"slot {slot}: the MTP block's values"


EXAMPLES = int(os.environ.get("MET_FUZZ_EXAMPLES", "30"))
RunnerMachine.TestCase.settings = settings(max_examples=EXAMPLES, stateful_step_count=25, deadline=None,
                                           suppress_health_check=list(HealthCheck))
test_runner_matches_the_uncached_model = RunnerMachine.TestCase
