"""Continuous batching: requests arrive on a queue; each tick admits, plans, drafts, verifies and streams out.

A tick reads as schedule -> run -> postprocess:
  schedule: take new requests and cancels from the inbox, free cancelled slots, admit waiting
            requests into free slots (one batched prefill, which emits each one's first token),
            and let the policy plan the step's mode and depths (policy.py: gate, ladder, rung,
            measured planner or host lookup, then the capacity clamp);
  run:      draft, then one batched verify forward (greedy: longest matching prefix + bonus;
            temperature > 0: lossless speculative sampling), rejected drafts rolled back;
  postprocess: stream each sequence's new text, retire finished ones (EOS, stop string,
            max_tokens, cancel) and free their slots at once, count, publish a snapshot.

The scheduler thread is the only one that touches the runner, the shared lookup cache (no
lock) and its SpecStats; other threads only submit, cancel and read snapshots.
A step that raises fails the sequences in it (each gets a Failed event, its slot freed) and
the loop goes on, so one bad request never stops the others.
"""

import heapq
import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

import torch

from met.engine.policy_base import Outcome, Policy, StepPlan, drafter_width
from met.engine.proposer import HOST_MODES, Proposer
from met.engine.logits import TokenLogprob
from met.engine.requests import Delta, Failed, Finished, Request, SeqState, Sink
from met.engine.runner import RECURSIVE_DRAFTERS, Draft, ModelRunner, VerifyResult
from met.engine.textstream import TextStream
from met.model.tokenizer import BYTES, Tokenizer
from met.speculative.shared_lookup import ScopeKey, SharedLookup, SharedLookupParams
from met.speculative.snapshot import SchedulerSnapshot, SnapshotCell
from met.speculative.spec_cost.lookup import shared_copy_params
from met.speculative.spec_stats import SpecStats, acceptance_by_position, recent_tokens_per_s

log = logging.getLogger("met.scheduler")

TOKENIZER = BYTES.name  # the default tokenizer's name in shared-lookup scopes (the embedded recipes' bytes)
IDLE_WAIT_S = 0.25  # an idle scheduler wakes this often to publish a snapshot
RATE_FRESH_S = 5.0  # the snapshot's tokens/s is 0 once no step has ended for this long: an idle server delivers none


class Draining(RuntimeError):
    """The scheduler is draining for shutdown and takes no new requests."""


class Scheduler:
    """Owns a ModelRunner and serves requests on its own thread."""

    def __init__(self, runner: ModelRunner, policy: Policy, model_id: str, *,
                 shared: SharedLookup | None = None, clock: Callable[[], float] = time.perf_counter,
                 tokenizer: Tokenizer = BYTES):
        self.runner = runner
        self.tokenizer = tokenizer  # EOS ids end sequences, its stream decoder streams text, its name scopes lookups
        self.policy = policy
        self.model_id = model_id  # the shared-lookup scope's model: recipe name@digest
        # a host-drafting policy's shortest match (--lookup-min-ngram) holds for copies from other requests too
        self.min_ngram = policy.copies.min_ngram
        self.shared_ngram = policy.copies.shared_ngram  # a planner that weighs other requests' copies too
        lowest = max(SharedLookupParams().min_ngram, self.min_ngram)
        cross = shared_copy_params(None, lowest, self.shared_ngram) if self.shared_ngram else \
            SharedLookupParams(min_ngram=lowest)
        self.shared = shared if shared is not None else SharedLookup(cross)
        self.clock = clock
        self.stats = SpecStats()  # the run's counts: drafts, acceptance, steps, requests, energy
        self.cell = SnapshotCell()
        self.host_drafts = policy.name in HOST_MODES
        self.copy_ngram = policy.copies.copy_ngram  # a policy that weighs copies: the longest match
        self.waiting: deque[tuple[Request, Sink]] = deque()
        self.running: list[SeqState] = []
        self.free_slots = list(range(runner.cache.max_batch))  # a heap: the lowest free slot is taken first
        self.ticks = 0
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()  # ("submit", Request, Sink) | ("cancel", id, None)
        self._submitted = 0  # requests put in the inbox and not yet taken (the snapshot's queued counts them)
        self._submitted_lock = threading.Lock()  # submit runs on the server's threads, the take on this one
        self._early: list = []  # inbox items the idle wait took, before the rest of the inbox
        self._stepped_at: float | None = None  # clock() when the latest step's verify returned
        self._draining = False
        self._thread: threading.Thread | None = None
        self._publish(None)  # readers see this serve's spec and slots before the first tick

    # --- any thread --------------------------------------------------------------------------

    @property
    def max_len(self) -> int:
        """Longest sequence (prompt + generated) a slot holds."""
        return self.runner.max_len

    @property
    def started(self) -> bool:
        """Whether start() has run."""
        return self._thread is not None

    @property
    def draining(self) -> bool:
        """Whether shutdown has begun (no new requests are taken)."""
        return self._draining

    def submit(self, request: Request, sink: Sink) -> None:
        """Queue a request; its events go to sink. Raises Draining once shutdown has begun."""
        if self._draining:
            raise Draining("the server is shutting down and takes no new requests")
        with self._submitted_lock:
            self._submitted += 1
        self._inbox.put(("submit", request, sink))

    def cancel(self, request_id: str) -> None:
        """Drop a request (client gone): its slot is freed at the start of the next tick."""
        self._inbox.put(("cancel", request_id, None))

    def start(self) -> None:
        """Run the loop on a daemon thread."""
        if self._thread is not None:
            raise RuntimeError("the scheduler is already running")
        threads = torch.get_num_threads()  # the run's setting, which the key was built with
        self._thread = threading.Thread(target=self._loop, args=(threads,), name="met-scheduler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> bool:
        """Drain: refuse new requests, finish every queued and running one, stop. False if still busy at timeout."""
        self._draining = True
        self._inbox.put(("wake", None, None))
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # --- the scheduler thread ----------------------------------------------------------------

    def _loop(self, threads: int) -> None:
        torch.set_num_threads(threads)  # OpenMP's thread count is per calling thread: set it on this one too
        while True:
            if not (self.running or self.waiting):
                if self._draining and self._inbox.empty() and not self._early:
                    break
                self._wait_for_work()
            try:
                self.tick()
            except Exception:  # outside the step's own guard (admission, publishing): log, count, keep the loop
                log.exception("scheduler tick failed")
                self.stats.record_failed_tick()
        self._publish(None)

    def _wait_for_work(self) -> None:
        try:
            self._early.append(self._inbox.get(timeout=IDLE_WAIT_S))  # taken first by the next tick, in order
        except queue.Empty:
            pass

    def tick(self) -> None:
        """One scheduler iteration: schedule -> run -> postprocess; always publishes a snapshot."""
        self.ticks += 1
        self._take_inbox()
        self._admit()
        self._compact()
        plan = None
        if self.running:
            # in slot order: a step over slots 0..n-1 reads the KV cache as a view instead of gathering
            seqs = sorted(self.running, key=lambda s: s.slot)
            try:
                plan = self.policy.plan(self.runner, seqs)
                drafts, results, seconds = self._run(seqs, plan)
                self._postprocess(seqs, plan, drafts, results, seconds)
            except Exception as exc:  # a bug or a bad request in this step: fail its sequences, keep serving
                log.exception("scheduler step failed; failing its %d sequences", len(seqs))
                self.stats.record_failed_tick()
                for seq in seqs:
                    if seq in self.running:
                        self._retire(seq, "error", Failed(f"the engine failed this step: {exc}"))
        self._publish(plan)

    # schedule

    def _take_inbox(self) -> None:
        cancels = set()
        while True:
            try:
                kind, item, sink = self._early.pop(0) if self._early else self._inbox.get_nowait()
            except queue.Empty:
                break
            if kind == "submit":
                with self._submitted_lock:
                    self._submitted -= 1
                self.waiting.append((item, sink))
            elif kind == "cancel":
                cancels.add(item)
        if not cancels:
            return
        for seq in [s for s in self.running if s.request.id in cancels]:
            self._retire(seq, "cancelled")
        kept = deque()
        for request, sink in self.waiting:
            if request.id in cancels:
                self.stats.record_finish("cancelled")
                sink.put(Finished("cancelled", "", len(request.prompt), 0))
            else:
                kept.append((request, sink))
        self.waiting = kept

    def _admit(self) -> None:
        admitted: list[SeqState] = []
        while self.waiting and self.free_slots:
            request, sink = self.waiting.popleft()
            if len(request.prompt) + 1 > self.max_len:
                self.stats.record_finish("error")
                sink.put(Failed(f"the prompt's {len(request.prompt)} tokens do not fit the context of {self.max_len}"))
                continue
            slot = heapq.heappop(self.free_slots)
            stream = TextStream(request.stop, self.tokenizer.stream())
            admitted.append(SeqState(request, sink, slot, self._proposer(request), stream))
        if not admitted:
            return
        try:
            firsts = self.runner.prefill([s.slot for s in admitted], [list(s.request.prompt) for s in admitted],
                                         [s.request.sampling for s in admitted])
        except Exception as exc:
            log.exception("prefill of %d requests failed", len(admitted))
            for seq in admitted:
                self.running.append(seq)
                self._retire(seq, "error", Failed(f"prefill failed: {exc}"))
            return
        for seq, first in zip(admitted, firsts):
            self.running.append(seq)
            seq.proposer.observe(0, 0, [first])
            scored = self.runner.prefill_logprobs(seq.slot) if seq.request.sampling.logprobs is not None else None
            if scored is not None and seq.request.sampling.prompt_logprobs:
                seq.sink.put(Delta("", 0, (), scored[1]))  # echo's scores come before any text
            self.stats.record_streamed(self._emit(seq, [first], scored[:1] if scored is not None else ()))
        for seq in [s for s in admitted if s.finish]:
            self._retire(seq, seq.finish)

    def _compact(self) -> None:
        """Keep the running sequences in slots 0..n-1 (ModelRunner.compact), the free slots the rest."""
        if not self.free_slots or self.free_slots[0] >= len(self.running):
            return  # no free slot below the last running one
        moved = self.runner.compact([s.slot for s in self.running])
        for seq in self.running:
            seq.slot = moved.get(seq.slot, seq.slot)
        busy = {s.slot for s in self.running}
        self.free_slots = [s for s in range(self.runner.cache.max_batch) if s not in busy]  # sorted: a heap

    def _proposer(self, request: Request) -> Proposer:
        if not self.host_drafts:
            if self.copy_ngram:  # the measured planner weighs copies from the history against MTP drafts
                scope = self.scope(request)  # and, a planner with shared bins, from the tenant's other requests
                shared = (lambda history, k, longer: self.shared.matched_copy(scope, history, k, longer)) \
                    if self.shared_ngram else None
                return Proposer("mtp", request.prompt, copy_ngram=self.copy_ngram, shared=shared)
            return Proposer("off", request.prompt)
        scope = self.scope(request)
        return Proposer(self.policy.name, request.prompt,
                        fallback=lambda history, k: self.shared.propose(scope, history, k),
                        min_ngram=self.min_ngram)

    def scope(self, request: Request) -> ScopeKey:
        """The shared-lookup scope of a request: only requests of one scope ever share tokens."""
        return ScopeKey(self.model_id, self.tokenizer.name, None, request.tenant)

    # run

    def _run(self, seqs: Sequence[SeqState], plan: StepPlan) -> tuple[list[Draft], list[VerifyResult], float]:
        t0 = self.clock()
        drafts = self.policy.draft(self.runner, seqs, plan)
        for d, k in zip(drafts, plan.depths):
            if len(d.tokens) > k:
                raise RuntimeError(f"the drafter proposed {len(d.tokens)} drafts where the clamp allows {k}")
        results = self.runner.verify([s.slot for s in seqs], drafts)
        self._stepped_at = self.clock()
        return drafts, results, max(self._stepped_at - t0, 1e-9)

    # postprocess

    def _postprocess(self, seqs: Sequence[SeqState], plan: StepPlan, drafts: list[Draft],
                     results: list[VerifyResult], seconds: float) -> None:
        outcomes, streamed = [], 0
        for seq, d, r in zip(seqs, drafts, results):
            k = len(d.tokens)
            outcomes.append(Outcome(k, r.accepted, len(r.tokens)))
            # only the prefix up to the first rejection is known to match: the runner stops judging there
            self.stats.record_verify([i < r.accepted for i in range(k)])
            seq.confidences, seq.drafted_by = list(d.confidences), plan.mode
            seq.proposer.observe(k, r.accepted, r.tokens)
            seq.drafted, seq.accepted = seq.drafted + k, seq.accepted + r.accepted
            streamed += self._emit(seq, r.tokens, r.logprobs or ())
        if len(seqs) == 1 and results[0].margin is not None and math.isfinite(results[0].margin):
            # the runner's margin is in log-prob: under 0.05 the runner-up is within 5% of the top token
            self.stats.record_b1_margin(1, results[0].margin)
        # priced as it ran: a probe drafts where the plan said k = 0, replans go deeper or stop early
        verified = max((o.proposed for o in outcomes), default=0)
        energy = plan.table.step_joules(len(outcomes), verified, drafted=plan.mode in RECURSIVE_DRAFTERS,
                                        draft_width=drafter_width(drafts)) \
            if plan.table is not None else None
        self.stats.record_step(plan.mode, seconds, streamed, energy)
        self.policy.observe(plan, outcomes, seconds)
        for seq in [s for s in seqs if s.finish]:
            self._retire(seq, seq.finish)

    def _emit(self, seq: SeqState, tokens: list[int], logprobs: Sequence[TokenLogprob] = ()) -> int:
        """Stream a sequence's new tokens; mark it finished on EOS, a stop string, max_tokens or a full context.

        Returns how many the client gets: none past a stop string, EOS or max_tokens (a verify step may
        emit several beyond them). logprobs: the tokens' own, when the request asks; each delta carries its tokens'.
        """
        req = seq.request
        enders = req.stop_ids if req.ignore_eos else self.tokenizer.eos_ids | req.stop_ids
        ends = [i for i, t in enumerate(tokens) if t in enders]
        eos = bool(ends)
        take = tokens[: ends[0]] if eos else tokens
        take = take[: seq.remaining]
        delta, used = seq.text.feed(take)
        seq.generated.extend(take[:used])
        if req.include_stop and seq.text.stopped_by is not None:
            delta += seq.text.stopped_by
        if delta or used:  # text held back (a character's first bytes) still counts its tokens, and their time
            seq.sink.put(Delta(delta, used, tuple(logprobs[:used])))
        if seq.text.stopped_by is not None or (eos and used == len(take) and seq.remaining > 0):
            seq.finish = "stop"
        elif seq.remaining <= 0 or self.runner.room(seq.slot) < 0:
            seq.finish = "length"
        return used

    def _retire(self, seq: SeqState, reason: str, event: Finished | Failed | None = None) -> None:
        """Take a sequence out: free its slot, hand its tokens to the shared cache, send its last event."""
        self.running.remove(seq)
        self.runner.release(seq.slot)
        heapq.heappush(self.free_slots, seq.slot)
        if event is None:
            tail = seq.text.finish()
            if reason == "length" and seq.text.stopped_by is not None:
                reason = "stop"  # the flush (a cut character become U+FFFD) completed a stop string
            event = Finished(reason, tail, len(seq.request.prompt), seq.text.tokens, seq.drafted, seq.accepted,
                             tuple(seq.generated))
        self.stats.record_finish(reason)
        if (self.host_drafts or self.shared_ngram) and reason in ("stop", "length"):
            self.shared.add_request(self.scope(seq.request), [*seq.request.prompt, *seq.generated])
        seq.sink.put(event)

    def _publish(self, plan: StepPlan | None) -> None:
        s = self.stats
        decision = plan.decision if plan is not None else None
        # idle wake-ups publish too, and a rate over steps that ended long ago is not what the server
        # delivers now: /metrics, /v1/snapshot and the TUI would show the last busy rate for ever
        fresh = self._stepped_at is not None and self.clock() - self._stepped_at <= RATE_FRESH_S
        jpt = None
        if decision is not None and decision.energy_j is not None and decision.expected_tokens > 0:
            jpt = decision.energy_j / decision.expected_tokens
        self.cell.publish(SchedulerSnapshot(
            tick=self.ticks,
            width=len(plan.depths) if plan is not None else 0,
            active=len(self.running),
            queued=len(self.waiting) + self._submitted,  # not the inbox's cancels and wake-ups
            mode=plan.mode if plan is not None else "idle",
            depth=plan.depth if plan is not None else 0,
            why=plan.why if plan is not None else "",
            acceptance=acceptance_by_position(s),
            tokens_per_s=recent_tokens_per_s(s) if fresh else 0.0,
            joules_per_token=jpt if jpt is None or jpt > 0 else None,
            drafts_proposed=s.proposed,
            drafts_accepted=s.accepted,
            emitted_tokens=s.streamed,
            spec=self.policy.name,
            max_batch=self.runner.cache.max_batch,
            drafted=s.drafted,
            draft_steps=s.verify_seq_steps,
            accepted_at=tuple(s.accepted_at),
            proposed_at=tuple(s.proposed_at),
            mode_steps=tuple(sorted(s.mode_steps.items())),
            mode_seconds=tuple(sorted(s.mode_seconds.items())),
            planned_tokens_per_s=decision.tokens_per_s if decision is not None else None,
            energy_j=s.energy_j,
            shared_lookup_tokens=self.shared.tokens_held,
            finished=tuple(sorted(s.finished.items())),
            failed_ticks=s.failed_ticks,
        ))
