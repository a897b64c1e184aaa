"""The model runner: owns the model, the KV cache and the device; prefill, draft (MTP, DFlash, a draft model, an
EAGLE-3 head), verify."""

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from met.engine.accept import greedy_accept, position_noise, seeded_pick, speculative_accept, target_distribution
from met.engine.draft_model import DraftModel
from met.engine.eagle import EagleDrafter
from met.engine.logits import MAX_LOGPROBS, History, TokenLogprob, process, token_logprobs
from met.model.dflash import DflashDrafter
from met.model.eagle3 import Eagle3Head
from met.model.kv_cache import KVCache
from met.model.transformer import CacheContext, Transformer
from met.speculative.catchup import catchup_groups, check_verified


@dataclass(frozen=True, slots=True)
class Sampling:
    """How one sequence picks tokens: temperature 0 is greedy."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    top_k: int = 0  # keep the k likeliest tokens (0: all)
    min_p: float = 0.0  # keep tokens at least min_p x the likeliest one's probability (0: all)
    # logits processors (logits.process), applied in the verify per position as plain decoding applies them
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # 1: none
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token, bias added to its logit)
    min_tokens: int = 0  # eos_ids are banned until this many tokens were output
    eos_ids: frozenset[int] = frozenset()  # the ids min_tokens bans (the request's end-of-sequence tokens)
    # what the runner reports besides the tokens (computed only for a sequence that asks)
    logprobs: int | None = None  # log-probabilities of the output with this many top alternatives; None: none
    prompt_logprobs: bool = False  # the prompt's log-probabilities too (echo), with as many alternatives

    def __post_init__(self) -> None:
        if not 0.0 <= self.temperature <= 100.0:
            raise ValueError(f"temperature must be in [0, 100], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and not -(1 << 63) <= self.seed < 1 << 64:  # what torch.Generator takes
            raise ValueError(f"seed must be a whole number from -2**63 to 2**64 - 1, got {self.seed}")
        if self.top_k < 0 or not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"top_k must be >= 0 and min_p in [0, 1], got {self.top_k} and {self.min_p}")
        if not 0.0 < self.repetition_penalty <= 100.0:
            raise ValueError(f"repetition_penalty must be in (0, 100], got {self.repetition_penalty}")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ValueError(f"logprobs must be in 0..{MAX_LOGPROBS}, got {self.logprobs}")
        if self.prompt_logprobs and self.logprobs is None:
            raise ValueError("prompt_logprobs needs logprobs (how many alternatives to return)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def seeded(self) -> bool:
        """Sampled with a seed: every token is picked with its position's noise (accept.position_noise)."""
        return self.seed is not None and not self.greedy

    @property
    def processed(self) -> bool:
        """Whether a logits processor applies (penalties, bias, min_tokens): the runner then keeps a History."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias or (self.min_tokens and self.eos_ids))

    def distribution(self, logits: torch.Tensor) -> torch.Tensor:
        """Probabilities [..., V] this sampling picks from, of (processed) logits [..., V]."""
        return target_distribution(logits, self.temperature, self.top_p, self.top_k, self.min_p)


def fresh_seed() -> int:
    """A seed for an unseeded sampled request's own generator, from the OS (torch.seed() would reseed torch's
    global generator on every such request)."""
    return secrets.randbits(63)


@dataclass(slots=True)
class Draft:
    """A drafter's proposal for one sequence."""

    tokens: list[int]
    confidences: list[float]  # drafter's top-1 log-probability at each position
    q: torch.Tensor | None = None  # [k, V] drafter distributions when sampling; None: deterministic drafts


@dataclass(frozen=True, slots=True)
class VerifyResult:
    """What one sequence got from a verify step."""

    accepted: int  # drafts accepted (the bonus token not counted)
    tokens: list[int]  # emitted: accepted drafts + the bonus token
    margin: float | None = None  # target top-1 minus top-2 log-prob at the first position (width-1 steps)
    logprobs: tuple[TokenLogprob, ...] | None = None  # each emitted token's, if the sequence asks (Sampling.logprobs)


@dataclass(slots=True)
class _Seq:
    pending: int  # last emitted token, not yet in the KV cache
    sampling: Sampling
    generator: torch.Generator | None  # an unseeded sampled sequence's; None: greedy or seeded (picks by position)
    # the MTP block's input rows (Transformer.mtp_input) of the main hidden rows it has not seen: one [rows, dim] view
    # of a step's head product per step, joined when read (catchup_rows), so a run of steps without an MTP draft
    # appends without copying
    catchup_h: list[torch.Tensor] = field(default_factory=list)
    # the token after each of those rows, one part per step: a greedy verify's a view of its argmax rows (the tokens it
    # emitted, already on the model's device), any other step's its token ids, made a tensor only when a catch-up pass
    # reads them (catchup_tokens), so a step that drafts for no one makes none
    catchup_ids: list[torch.Tensor | list[int]] = field(default_factory=list)
    last_h: torch.Tensor | None = None  # [dim] main hidden that predicted `pending` (kept for a DFlash drafter)
    noise: dict[int, torch.Tensor] = field(default_factory=dict)  # seeded: drafted positions' noise, for the verify
    history: History | None = None  # what the logits processors count; None: the sampling has none
    # prefill's log-probabilities, until the caller takes them (prefill_logprobs): the first token's, the prompt's
    scored: tuple[TokenLogprob, tuple[TokenLogprob, ...]] | None = None

    def catchup_rows(self) -> torch.Tensor:
        """The rows the MTP block has not seen, [rows, dim] (a view when one step left them all)."""
        return self.catchup_h[0] if len(self.catchup_h) == 1 else torch.cat(self.catchup_h)

    def catchup_tokens(self, device: torch.device) -> torch.Tensor:
        """The token after each of those rows, [rows] on device (a view when one greedy verify left them all)."""
        parts = [ids if isinstance(ids, torch.Tensor) else torch.tensor(ids, device=device) for ids in self.catchup_ids]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def catchup_count(self) -> int:
        """How many rows the MTP block has not seen."""
        return sum(len(ids) for ids in self.catchup_ids)


RECURSIVE_DRAFTERS = ("mtp", "draft", "eagle")  # drafters that draft token by token with confidences: MTP, a draft
# model, an EAGLE-3 head
Replan = Callable[[int, list[Draft]], int]  # (drafts made so far per row, every row's drafts) -> depth to draft to


def _top1(logits: torch.Tensor) -> tuple[list, list]:
    """The likeliest token of each row of logits [..., V] and its log-probability.

    One log-softmax kernel and one max: at a 258-token vocabulary 4.3 us a row against 12.4 us for the
    max, logsumexp (some ten kernels, for its infinities) and difference (benchmarks/studies/draft_pass.py).
    """
    top = logits.log_softmax(-1).max(-1)
    return top.indices.tolist(), top.values.tolist()


def _drafting(slots: list[int], depths: list[int], missing: str | None) -> tuple[list[Draft], list[int]]:
    """An empty draft for each slot and the indices of those asked for drafts (depth > 0); RuntimeError(missing)
    when some are and the drafter is not there (missing None: it is)."""
    active = [i for i, d in enumerate(depths) if d > 0]
    if active and missing is not None:
        raise RuntimeError(missing)
    return [Draft([], []) for _ in slots], active


def _truncate(draft: Draft, k: int) -> None:
    """Keep a draft's first k tokens (and their confidences and distributions)."""
    del draft.tokens[k:], draft.confidences[k:]
    if draft.q is not None:
        draft.q = draft.q[:k] if k else None


class ModelRunner:
    """Runs steps for sequences that live in KV-cache slots 0..max_batch-1."""

    def __init__(self, model: Transformer, max_batch: int, max_len: int | None = None, track_mtp: bool = True,
                 dflash: DflashDrafter | None = None, draft_model: Transformer | None = None,
                 eagle: Eagle3Head | None = None):
        """draft_model: a model of this one's tokenizer and vocabulary that drafts for it (draft_small).

        eagle: an EAGLE-3 head trained on this model (draft_eagle); prefill and verify then also hand it
        the hidden states of its layers.
        """
        self.model = model.eval()
        self.dflash = dflash.eval() if dflash is not None else None  # block drafter over this model's hidden states
        model.fuse()
        cfg = model.cfg
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.max_len = min(max_len or cfg.max_seq_len, cfg.max_seq_len)
        self.track_mtp = track_mtp and model.mtp is not None
        n_cached = cfg.n_layers + (1 if model.mtp is not None else 0)
        self.cache = KVCache.allocate(n_cached, max_batch, self.max_len, cfg.n_kv_heads, cfg.head_dim,
                                      self.dtype, self.device)
        self.seqs: dict[int, _Seq] = {}
        self.draft_model = None
        if draft_model is not None:
            if draft_model.cfg.vocab_size != cfg.vocab_size:
                raise ValueError(f"the draft model's vocabulary of {draft_model.cfg.vocab_size} tokens is not this "
                                 f"model's {cfg.vocab_size}")
            self.draft_model = DraftModel(draft_model, max_batch, self.max_len)
        self.eagle = EagleDrafter(eagle, model, max_batch, self.max_len) if eagle is not None else None
        self._taps = self.eagle.taps if self.eagle is not None else ()  # target layers Transformer.hidden hands over

    # --- lifecycle -------------------------------------------------------------------------

    def length(self, slot: int) -> int:
        """Tokens of the slot's sequence in the cache (the pending token not counted)."""
        return self.cache.lengths[slot]

    def room(self, slot: int) -> int:
        """Drafts the slot can still verify: cache room minus the pending token."""
        return self.cache.room(slot) - 1

    def mtp_behind(self, slot: int) -> int:
        """Rows the slot's MTP block has yet to catch up on before its next draft (a prompt, plain steps)."""
        return self.seqs[slot].catchup_count()

    def release(self, slot: int) -> None:
        """Free a slot at once (finished or cancelled sequence)."""
        self.seqs.pop(slot, None)
        self.cache.reset(slot)
        if self.draft_model is not None:
            self.draft_model.release(slot)
        if self.eagle is not None:
            self.eagle.release(slot)

    @torch.inference_mode()
    def move(self, src: int, dst: int) -> None:
        """Move the sequence in slot src, cache entries and state, into the free slot dst (src is freed)."""
        if src not in self.seqs or dst in self.seqs:
            raise ValueError(f"a move needs a busy source and a free destination, got {src} -> {dst}")
        self.cache.move(src, dst)
        self.seqs[dst] = self.seqs.pop(src)
        if self.draft_model is not None:
            self.draft_model.move(src, dst)
        if self.eagle is not None:
            self.eagle.move(src, dst)

    def compact(self, slots: list[int]) -> dict[int, int]:
        """Move the sequences of `slots` that sit at or past len(slots) into the free slots below; {src: dst}.

        A step over slots 0..n-1 reads the KV cache as views; over scattered ones it gathers every
        slot's keys and values in every layer (at width 14 on CPU, 2x the step). One copy of a
        sequence's cache when a slot frees in the middle is far cheaper than a gather at every step.
        """
        n = len(slots)
        if not slots or max(slots) < n:
            return {}
        taken = set(slots)
        moves = dict(zip(sorted(s for s in slots if s >= n), [s for s in range(n) if s not in taken]))
        for src, dst in moves.items():
            self.move(src, dst)
        return moves

    @torch.inference_mode()
    def prefill(self, slots: list[int], prompts: list[list[int]], samplings: list[Sampling]) -> list[int]:
        """Run prompts of different lengths into free slots; returns each one's first generated token."""
        lens = [len(p) for p in prompts]
        for slot, n in zip(slots, lens):
            if n < 1 or n + 1 > self.max_len:
                raise ValueError(f"prompt of {n} tokens does not fit a context of {self.max_len}")
            if slot in self.seqs:
                raise ValueError(f"slot {slot} is busy")
        # Equal prompts (a request's n choices) share one prefill: the first one's row is run, the others'
        # slots get a copy of its cache entries, and each picks its own first token from the same logits.
        row_of: dict[tuple[int, ...], int] = {}
        rows = [row_of.setdefault(tuple(p), len(row_of)) for p in prompts]  # each prompt's row in the forward
        run = [rows.index(r) for r in range(len(row_of))]  # the requests whose rows are run
        T = max(lens)
        tokens = torch.zeros(len(run), T, dtype=torch.long)  # [U, T], right-padded
        for r, i in enumerate(run):
            tokens[r, : lens[i]] = torch.tensor(prompts[i])
        run_slots = [slots[i] for i in run]
        pos = torch.arange(T).expand(len(run), T)
        ctx = CacheContext.build(self.cache, run_slots, pos.to(self.device))
        h_run, taps_run = self._hidden(tokens.to(self.device), ctx)  # [U, T, dim], [U, T, n_taps * dim] | None
        last = h_run[torch.arange(len(run)), torch.tensor([lens[i] for i in run]) - 1]  # [U, dim]
        logits_run = self.model.logits_cached(last)  # [U, V]
        mtp_rows = self.model.mtp_input(h_run) if self.track_mtp else None  # [U, T, dim]: every prompt row's
        for i, (slot, r) in enumerate(zip(slots, rows)):
            if slot != run_slots[r]:
                self.cache.kv[:, slot, :, : lens[i]] = self.cache.kv[:, run_slots[r], :, : lens[i]]
        h, logits = h_run[rows], logits_run[rows]  # [B, T, dim], [B, V]: each request's row
        firsts = []
        for i, (slot, sampling) in enumerate(zip(slots, samplings)):
            # on the model's device: torch refuses a host generator for a GPU's multinomial
            gen = None if sampling.greedy or sampling.seeded else torch.Generator(self.device).manual_seed(fresh_seed())
            history = History(prompts[i], logits.shape[-1], self.device) if sampling.processed else None
            row = process(logits[i : i + 1], sampling, history, [])[0] if history is not None else logits[i]
            first = self._pick(row, sampling, gen, lens[i])
            seq = _Seq(first, sampling, gen, history=history)
            if history is not None:
                history.add([first])
            if sampling.logprobs is not None:
                prompt = self._prompt_logprobs(h[i, : lens[i] - 1], prompts[i], sampling.logprobs) \
                    if sampling.prompt_logprobs else ()
                seq.scored = (token_logprobs(logits[i : i + 1], [first], sampling.logprobs)[0], prompt)
            if self.track_mtp:
                seq.catchup_h = [mtp_rows[rows[i], : lens[i]]]
                seq.catchup_ids = [prompts[i][1:] + [first]]
            if self.dflash is not None:
                seq.last_h = h[i, lens[i] - 1]
            if self.draft_model is not None:
                self.draft_model.start(slot, prompts[i] + [first])
            if self.eagle is not None:
                self.eagle.start(slot, taps_run[rows[i], : lens[i]], prompts[i][1:] + [first])
            self.seqs[slot] = seq
            self.cache.lengths[slot] = lens[i]
            self.cache.mtp_lengths[slot] = 0
            firsts.append(first)
        return firsts

    def _hidden(self, tokens: torch.Tensor, ctx: CacheContext) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The target's hidden states of tokens, and those entering the EAGLE-3 head's layers (None: no head)."""
        if not self._taps:
            return self.model.hidden(tokens, ctx), None
        return self.model.hidden(tokens, ctx, self._taps)

    def _prompt_logprobs(self, h: torch.Tensor, prompt: list[int], top: int) -> tuple[TokenLogprob, ...]:
        """The log-probabilities of prompt[1:] from the hidden rows h [n - 1, dim] before each (echo's scores)."""
        if not len(h):
            return ()
        return tuple(token_logprobs(self.model.logits_cached(h), prompt[1:], top))  # [n - 1, V] for this prompt only

    def prefill_logprobs(self, slot: int) -> tuple[TokenLogprob, tuple[TokenLogprob, ...]] | None:
        """The prefilled slot's first-token and prompt log-probabilities (once; None if its sampling asked none)."""
        seq = self.seqs[slot]
        scored, seq.scored = seq.scored, None
        return scored

    def _pick(self, logits: torch.Tensor, sampling: Sampling, gen: torch.Generator | None, position: int,
              keep: dict[int, torch.Tensor] | None = None) -> int:
        """The token at `position` from its logits [V]: greedy, seeded (by position), or from the generator.

        keep: where a seeded pick leaves its noise (a draft's, which the verify picks with again).
        """
        if sampling.greedy:
            return int(logits.argmax())
        probs = sampling.distribution(logits)
        if sampling.seeded:
            noise = position_noise(sampling.seed, position, probs.shape[-1], probs.device)
            if keep is not None:
                keep[position] = noise
            return seeded_pick(probs, noise)[0]
        return int(torch.multinomial(probs, 1, generator=gen))

    # --- drafting ------------------------------------------------------------------------------

    @torch.inference_mode()
    def draft_mtp(self, slots: list[int], depths: list[int], replan: Replan | None = None) -> list[Draft]:
        """MTP drafts: catch-up passes over the rows the MTP block missed, then one pass per further draft.

        The catch-up passes are grouped by `catchup_groups`. replan(j, drafts), when given, is asked
        after each pass j that is not the deepest with every slot's drafts so far, and returns the depth
        to draft to: each row keeps at most its own depth; a value at or below j stops drafting there
        and drops the drafts past it.
        """
        depths = list(depths)
        drafts, active = _drafting(slots, depths, None if self.track_mtp else
                                   "this runner has no MTP module (or was built with track_mtp=False)")
        if not active:
            return drafts
        act_slots = [slots[i] for i in active]
        seqs = [self.seqs[s] for s in act_slots]
        rows = [s.catchup_count() for s in seqs]
        check_verified(act_slots, rows)
        groups = catchup_groups(rows)
        if len(groups) == 1:
            mh = self._catch_up(act_slots, seqs, rows)  # [B, dim] MTP hidden that predicts draft 1
        else:
            last = [None] * len(active)
            for group in groups:
                part = self._catch_up([act_slots[b] for b in group], [seqs[b] for b in group], [rows[b] for b in group])
                for j, b in enumerate(group):
                    last[b] = part[j]
            mh = torch.stack(last)
        for s, seq in zip(act_slots, seqs):
            seq.catchup_h, seq.catchup_ids = [], []
            self.cache.mtp_lengths[s] = self.cache.lengths[s]
        deepest, passes = max(depths), 1
        fed: torch.Tensor | None = None  # [B', dim] the next pass's input rows (Transformer.mtp_input), from head()

        def head(mh: torch.Tensor) -> torch.Tensor:
            """A pass's logits; but for the deepest pass the same product gives the next pass's input rows."""
            nonlocal fed
            if passes == deepest:
                return self.model.mtp_logits_cached(mh)
            logits, fed = self.model.mtp_logits_cached(mh, mtp_input=True)
            return logits

        def advance(keep: list[int] | None, rows: list[int], tokens: list[int]) -> torch.Tensor:
            nonlocal passes
            x = fed if keep is None else fed[keep]
            starts = [self.cache.lengths[act_slots[r]] + len(drafts[active[r]].tokens) - 1 for r in rows]
            ctx = CacheContext.consecutive(self.cache, [act_slots[r] for r in rows], starts, 1)
            passes += 1
            toks = torch.tensor(tokens, device=self.device)[:, None]
            return head(self.model.mtp_hidden_from(x[:, None], toks, ctx)[:, 0])

        self._recurse(drafts, active, act_slots, seqs, depths, head(mh), advance, replan)
        return drafts

    @torch.inference_mode()
    def draft_small(self, slots: list[int], depths: list[int], replan: Replan | None = None) -> list[Draft]:
        """Drafts of the runner's draft model: its catch-up pass, then one pass per further draft (as draft_mtp)."""
        depths = list(depths)
        drafts, active = _drafting(slots, depths, None if self.draft_model is not None else
                                   "this runner has no draft model (build it with ModelRunner(..., draft_model=model))")
        if not active:
            return drafts
        act_slots = [slots[i] for i in active]
        small = self.draft_model

        def advance(keep: list[int] | None, rows: list[int], tokens: list[int]) -> torch.Tensor:
            return small.step([act_slots[r] for r in rows], tokens)

        logits = small.catch_up(act_slots)
        self._recurse(drafts, active, act_slots, [self.seqs[s] for s in act_slots], depths, logits, advance, replan)
        return drafts

    @torch.inference_mode()
    def draft_eagle(self, slots: list[int], depths: list[int], replan: Replan | None = None) -> list[Draft]:
        """Drafts of the runner's EAGLE-3 head, as target ids: its catch-up pass, then one pass per further draft
        fed its own output (as draft_mtp; a sampled row's q is over the target's vocabulary, 0 off the head's)."""
        depths = list(depths)
        drafts, active = _drafting(slots, depths, None if self.eagle is not None else
                                   "this runner has no EAGLE-3 head (build it with ModelRunner(..., eagle=head))")
        if not active:
            return drafts
        act_slots = [slots[i] for i in active]
        logits, h = self.eagle.catch_up(act_slots)  # [B, V], [B, dim]

        def advance(keep: list[int] | None, rows: list[int], tokens: list[int]) -> torch.Tensor:
            nonlocal h
            if keep is not None:
                h = h[keep]
            logits, h = self.eagle.step([act_slots[r] for r in rows], h, tokens)
            return logits

        self._recurse(drafts, active, act_slots, [self.seqs[s] for s in act_slots], depths, logits, advance, replan)
        return drafts

    def _recurse(self, drafts: list[Draft], active: list[int], act_slots: list[int], seqs: list[_Seq],
                 depths: list[int], logits: torch.Tensor, advance, replan: Replan | None) -> None:
        """A recursive drafter's passes: pick draft j of every row from logits [B', V], replan, feed it back.

        advance(keep, rows, tokens) runs the drafter's next pass over the rows still drafting (keep: their
        indices among the last pass's rows, None if all stayed; rows: their indices among active) fed
        each one's latest draft, and returns that pass's logits.
        """
        idx = list(range(len(active)))  # rows of the last pass still drafting
        for j in range(1, max(depths) + 1):
            tok_list, conf_list = _top1(logits)
            for b, row in enumerate(idx):
                d = drafts[active[row]]
                seq = seqs[row]
                if seq.sampling.greedy:
                    d.tokens.append(tok_list[b])
                elif seq.sampling.seeded:  # the position's noise, as the verify will pick: no q needed
                    d.tokens.append(self._pick(logits[b], seq.sampling, None, self.cache.lengths[act_slots[row]] + j,
                                               seq.noise))
                else:
                    q = target_distribution(logits[b], seq.sampling.temperature, seq.sampling.top_p)
                    d.tokens.append(int(torch.multinomial(q, 1, generator=seq.generator)))
                    d.q = q[None] if d.q is None else torch.cat([d.q, q[None]])
                d.confidences.append(conf_list[b])
            if replan is not None and j < max(depths):
                target = replan(j, drafts)
                if target <= j:
                    for d in drafts:
                        _truncate(d, target)
                    return
                depths = [min(d, target) for d in depths]
            keep = [b for b, row in enumerate(idx) if depths[active[row]] > j]
            if not keep:
                return
            kept = None if len(keep) == len(idx) else keep
            idx = [idx[b] for b in keep]
            logits = advance(kept, idx, [drafts[active[r]].tokens[-1] for r in idx])

    def _catch_up(self, slots: list[int], seqs: list[_Seq], rows: list[int]) -> torch.Tensor:
        """One MTP pass over the main-model rows these sequences' MTP block missed; the last row's hidden of each."""
        if len(slots) == 1:  # nothing to pad: the rows as they are (no zeroed buffers, no gather of the last rows)
            ctx = CacheContext.row(self.cache, slots[0], self.cache.mtp_lengths[slots[0]], rows[0])
            toks = seqs[0].catchup_tokens(self.device)[None]
            mh = self.model.mtp_hidden_from(seqs[0].catchup_rows()[None], toks, ctx, last=rows[0] - 1)
            return mh[:, 0]  # [1, dim]
        R = max(rows)
        H = torch.zeros(len(slots), R, self.model.cfg.dim, dtype=self.dtype, device=self.device)  # [B, R, dim]
        toks = torch.zeros(len(slots), R, dtype=torch.long, device=self.device)  # [B, R]
        for b, seq in enumerate(seqs):
            H[b, : rows[b]] = seq.catchup_rows()
            toks[b, : rows[b]] = seq.catchup_tokens(self.device)
        ctx = CacheContext.consecutive(self.cache, slots, [self.cache.mtp_lengths[s] for s in slots], R)
        mh = self.model.mtp_hidden_from(H, toks, ctx, last=torch.tensor(rows, device=self.device) - 1)
        return mh[:, 0]  # [B, dim]

    @torch.inference_mode()
    def draft_dflash(self, slots: list[int], gammas: list[int]) -> list[Draft]:
        """DFlash drafts: one block-drafter pass for every slot with gamma > 0, the first gamma of its block kept."""
        drafts, active = _drafting(slots, gammas, None if self.dflash is not None else
                                   "this runner has no DFlash drafter (build it with ModelRunner(..., dflash=drafter))")
        if not active:
            return drafts
        if max(gammas) > self.dflash.block:
            raise ValueError(f"gamma {max(gammas)} exceeds the drafter's block of {self.dflash.block}")
        seqs = [self.seqs[slots[i]] for i in active]
        h = torch.stack([s.last_h for s in seqs])  # [B, dim]
        tok = torch.tensor([s.pending for s in seqs], device=self.device)  # [B]
        logits = self.dflash(self.model, h, tok)  # [B, block, V]
        tok_rows, conf_rows = _top1(logits)
        for b, (i, seq) in enumerate(zip(active, seqs)):
            g, d = gammas[i], drafts[i]
            d.confidences = conf_rows[b][:g]
            if seq.sampling.greedy:
                d.tokens = tok_rows[b][:g]
            elif seq.sampling.seeded:  # each position by its noise, as the verify will pick
                first = self.cache.lengths[slots[i]] + 1
                d.tokens = [self._pick(logits[b, j], seq.sampling, None, first + j, seq.noise) for j in range(g)]
            else:  # each position sampled from its own marginal: a valid q for lossless speculative sampling
                d.q = target_distribution(logits[b, :g], seq.sampling.temperature, seq.sampling.top_p)  # [g, V]
                d.tokens = torch.multinomial(d.q, 1, generator=seq.generator)[:, 0].tolist()
        return drafts

    # --- verify --------------------------------------------------------------------------------

    @torch.inference_mode()
    def verify(self, slots: list[int], drafts: list[Draft]) -> list[VerifyResult]:
        """Score [pending, drafts...] of every sequence in one forward; accept, emit, roll back the rest.

        A sequence with no drafts takes a plain decode step. Greedy sequences accept the longest
        prefix equal to the target's argmax; seeded ones the prefix equal to their picks by position (the
        tokens plain decoding picks); other sampled ones use lossless speculative sampling.
        """
        n = len(slots)
        ks = [len(d.tokens) for d in drafts]
        for slot, k in zip(slots, ks):
            if k > self.room(slot):
                raise ValueError(f"slot {slot}: {k} drafts but room for {self.room(slot)}")
        T = max(ks) + 1
        rows = [[self.seqs[s].pending, *d.tokens] + [0] * (T - 1 - len(d.tokens)) for s, d in zip(slots, drafts)]
        tokens = torch.tensor(rows)  # [B, T]: pending token then drafts, right-padded
        base = [self.cache.lengths[s] for s in slots]
        ctx = CacheContext.consecutive(self.cache, slots, base, T)
        h, taps = self._hidden(tokens.to(self.device), ctx)  # [B, T, dim], [B, T, n_taps * dim] | None
        if self.track_mtp:  # the MTP block's input rows come from the head's product
            logits, mtp_rows = self.model.logits_cached(h, mtp_input=True)  # [B, T, V], [B, T, dim]
        else:
            logits = self.model.logits_cached(h)  # [B, T, V]
        argmax = logits.argmax(-1)  # [B, T]
        greedy_rows = argmax.tolist()
        margin = None
        if n == 1:
            top2 = logits[0, 0].topk(2).values.tolist()  # a log-prob difference is the logits' difference
            margin = top2[0] - top2[1]
        results = []
        for i, (slot, d) in enumerate(zip(slots, drafts)):
            seq = self.seqs[slot]
            scores = logits[i, : ks[i] + 1]  # [k + 1, V]: row j picks the token after the pending one and d[:j]
            if seq.history is not None:  # each row processed as plain decoding would, after the drafts before it
                scores = process(scores, seq.sampling, seq.history, d.tokens)
            if seq.sampling.greedy:
                a, nxt = greedy_accept(d.tokens, greedy_rows[i] if seq.history is None else scores.argmax(-1).tolist())
            elif seq.sampling.seeded:  # each row's pick by its position's noise: the tokens plain decoding picks
                p = seq.sampling.distribution(scores)
                rows = [base[i] + 1 + j for j in range(ks[i] + 1)]  # the drafts' positions, then the bonus's
                noise = torch.stack([seq.noise.get(r) if r in seq.noise else
                                     position_noise(seq.sampling.seed, r, p.shape[-1], p.device) for r in rows])
                seq.noise.clear()
                a, nxt = greedy_accept(d.tokens, seeded_pick(p, noise))
            else:
                p = seq.sampling.distribution(scores)
                a, nxt = speculative_accept(d.tokens, d.q, p, seq.generator)
            length = base[i]
            self.cache.lengths[slot] = length + ks[i] + 1
            self.cache.rollback(slot, length + a + 1)  # rejected drafts leave the cache
            emitted = d.tokens[:a] + [nxt]
            if self.track_mtp:
                seq.catchup_h.append(mtp_rows[i, : a + 1])
                # a greedy row emitted the target's argmax tokens (greedy_accept): their ids are a view of them
                seq.catchup_ids.append(argmax[i, : a + 1] if seq.sampling.greedy and seq.history is None else emitted)
            if self.dflash is not None:
                seq.last_h = h[i, a]  # the row whose logits chose nxt
            if self.draft_model is not None:
                self.draft_model.verified(slot, emitted)
            if self.eagle is not None:  # the rows that chose each emitted token, the target's own features
                self.eagle.verified(slot, taps[i, : a + 1], emitted)
            seq.pending = nxt
            if seq.history is not None:
                seq.history.add(emitted)
            # the raw rows of the accepted positions: the same figures plain decoding's forward gives
            lps = tuple(token_logprobs(logits[i, : a + 1], emitted, seq.sampling.logprobs)) \
                if seq.sampling.logprobs is not None else None
            results.append(VerifyResult(a, emitted, margin, lps))
        return results
