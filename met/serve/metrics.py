"""Prometheus metrics of a serve, in its own registry: the snapshot's counters and gauges, and HTTP statuses.

The scheduler thread owns the counters; this collector reads only the latest published snapshot,
so a scrape never touches scheduler state. Units: tokens, seconds, joules. "Draft tokens" are
drafts verified; "accepted tokens" excludes the bonus token; energy is what the measured cost
table prices the steps run at (there is no live meter in the serve), present only under
--spec-cost-model measured with a table measured with energy.
"""

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from met.engine.scheduler import RATE_FRESH_S
from met.speculative.snapshot import SnapshotCell
from met.speculative.spec_stats import RATE_WINDOW

# the scheduler zeroes the rate at its idle wake-ups, so an idle serve reads 0, not its last busy rate
RATE_HELP = (f"Emitted tokens per second of step time over the last {RATE_WINDOW} steps; "
             f"0 once no step has run for {RATE_FRESH_S:g} s")


class SnapshotCollector:
    """Turns the latest snapshot into metric families at each scrape."""

    def __init__(self, cell: SnapshotCell) -> None:
        self.cell = cell

    def describe(self):
        return []  # families are known only at scrape time (per-position and per-mode labels)

    def collect(self):
        s = self.cell.latest()
        yield CounterMetricFamily("met_spec_drafts", "Sequence-steps that verified at least one draft",
                                  value=s.draft_steps)
        yield CounterMetricFamily("met_spec_draft_tokens", "Draft tokens verified", value=s.drafts_proposed)
        yield CounterMetricFamily("met_spec_drafted_tokens", "Draft tokens the drafter produced", value=s.drafted)
        yield CounterMetricFamily("met_spec_accepted_tokens", "Draft tokens accepted (bonus tokens not counted)",
                                  value=s.drafts_accepted)
        per_pos = CounterMetricFamily("met_spec_accepted_tokens_per_pos",
                                      "Sequence-steps whose drafts 0..=position were all accepted",
                                      labels=["position"])
        verified_pos = CounterMetricFamily("met_spec_draft_tokens_per_pos",
                                           "Sequence-steps that verified a draft at position", labels=["position"])
        for i, (a, p) in enumerate(zip(s.accepted_at, s.proposed_at)):
            per_pos.add_metric([str(i)], a)
            verified_pos.add_metric([str(i)], p)
        yield per_pos
        yield verified_pos
        seconds = CounterMetricFamily("met_step_seconds", "Step wall seconds by mode", labels=["mode"])
        for mode, value in s.mode_seconds:
            seconds.add_metric([mode], value)
        yield seconds
        steps = CounterMetricFamily("met_steps", "Scheduler steps by mode", labels=["mode"])
        for mode, value in s.mode_steps:
            steps.add_metric([mode], value)
        yield steps
        yield CounterMetricFamily("met_emitted_tokens", "Tokens generated (first and bonus tokens included)",
                                  value=s.emitted_tokens)
        finished = CounterMetricFamily("met_requests_finished", "Requests that left the scheduler, by reason",
                                       labels=["reason"])
        for reason, n in s.finished:
            finished.add_metric([reason], n)
        yield finished
        yield CounterMetricFamily("met_failed_ticks", "Scheduler steps that raised", value=s.failed_ticks)
        yield GaugeMetricFamily("met_planned_depth", "Drafts per sequence planned at the latest tick", value=s.depth)
        yield GaugeMetricFamily("met_batch_width", "Sequences in the latest step", value=s.width)
        yield GaugeMetricFamily("met_active_sequences", "Sequences holding a KV slot", value=s.active)
        yield GaugeMetricFamily("met_kv_slots", "KV-cache sequence slots", value=s.max_batch)
        yield GaugeMetricFamily("met_queued_requests", "Requests waiting for a slot", value=s.queued)
        yield GaugeMetricFamily("met_tokens_per_second", RATE_HELP, value=s.tokens_per_s)
        yield GaugeMetricFamily("met_shared_lookup_tokens", "Tokens held by the shared lookup cache",
                                value=s.shared_lookup_tokens)
        if s.planned_tokens_per_s is not None:
            yield GaugeMetricFamily("met_planned_tokens_per_second", "The planner's expected tokens/s at its depth",
                                    value=s.planned_tokens_per_s)
        if s.energy_j is not None:
            yield CounterMetricFamily("met_energy_joules", "Joules of the steps run, as the cost table prices them",
                                      value=s.energy_j)
        if s.joules_per_token is not None:
            yield GaugeMetricFamily("met_joules_per_token", "The planner's expected joules per token at its depth",
                                    value=s.joules_per_token)


# vLLM's buckets for its histograms of the same names (vllm:time_to_first_token_seconds, ...)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)


class ServeMetrics:
    """The serve's registry: the snapshot collector, a counter of HTTP responses by status, latency histograms.

    Latencies are per choice, seen by the HTTP layer: from the request's queueing to its first token
    (time to first token), between its tokens (a step that emits several spreads its interval over
    them: with speculation a token's share, not the wait for it), and to its end (end-to-end).
    """

    def __init__(self, cell: SnapshotCell) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(SnapshotCollector(cell))
        self.responses = Counter("met_http_responses", "HTTP responses by status code", ["code"],
                                 registry=self.registry)
        self.ttft = Histogram("met_time_to_first_token_seconds", "Seconds from queueing to the first token",
                              buckets=TTFT_BUCKETS, registry=self.registry)
        self.itl = Histogram("met_inter_token_latency_seconds", "Seconds between tokens (a step's shared by its tokens)",
                             buckets=ITL_BUCKETS, registry=self.registry)
        self.e2e = Histogram("met_e2e_request_latency_seconds", "Seconds from queueing to the end of a choice",
                             buckets=E2E_BUCKETS, registry=self.registry)


class StatusLayer:
    """ASGI middleware that counts every response's status code."""

    def __init__(self, app, metrics: ServeMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        started = False

        async def counted(message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                self.metrics.responses.labels(str(message["status"])).inc()
            await send(message)

        try:
            await self.app(scope, receive, counted)
        except Exception:
            if not started:  # the error middleware outside this layer answers 500 for it
                self.metrics.responses.labels("500").inc()
            raise
