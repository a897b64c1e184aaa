"""met_tokens_per_second and the snapshot's tokens_per_s: the last 32 steps' rate while steps run, 0 once idle."""

from met.engine.policy_base import PlainPolicy
from met.engine.requests import Failed, Finished, QueueSink, Request
from met.engine.runner import ModelRunner
from met.engine.scheduler import Scheduler
from met.serve.metrics import ServeMetrics


class Clock:
    """A fake clock that moves 1/64 s at each read, so a step (read before and after) takes 1/64 s."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1 / 64
        return self.t


def _serve(sched: Scheduler, request: Request) -> None:
    """Submit one request and tick on this thread until it has finished."""
    sink = QueueSink()
    sched.submit(request, sink)
    while not any(isinstance(e, Finished | Failed) for e in list(sink.queue.queue)):
        sched.tick()


def _rates(sched: Scheduler, metrics: ServeMetrics) -> tuple[float, float]:
    """The gauge a scrape reads and the snapshot's tokens_per_s (what /v1/snapshot and the TUI show)."""
    return metrics.registry.get_sample_value("met_tokens_per_second"), sched.cell.latest().tokens_per_s


def test_tokens_per_second_is_zero_once_no_step_has_run_for_5_s(model):
    # the idle wake-ups republished the last busy rate, so an idle server showed it for ever
    clock = Clock()
    sched = Scheduler(ModelRunner(model, 1), PlainPolicy(), "micro@t", clock=clock)
    metrics = ServeMetrics(sched.cell)
    assert _rates(sched, metrics) == (0.0, 0.0)  # before any step
    _serve(sched, Request("a", (97, 98, 99), 8))
    # under load as before: 7 decode steps of one token each, 1/64 s each
    assert sched.stats.streamed == 8 and _rates(sched, metrics) == (64.0, 64.0)
    clock.t += 4.0
    sched.tick()  # an idle wake-up 4 s after the last step: still the recent rate
    assert _rates(sched, metrics) == (64.0, 64.0)
    clock.t += 1.5
    sched.tick()  # 5.5 s after the last step: nothing delivered in the last 5 s
    assert _rates(sched, metrics) == (0.0, 0.0)
    _serve(sched, Request("b", (97, 98, 99), 8))
    assert _rates(sched, metrics) == (64.0, 64.0)  # traffic again: the rate is back


def test_the_gauges_help_states_the_rule(model):
    # a dashboard reader learns from the help text that the gauge is 0 while idle
    sched = Scheduler(ModelRunner(model, 1), PlainPolicy(), "micro@t")
    (family,) = [f for f in ServeMetrics(sched.cell).registry.collect() if f.name == "met_tokens_per_second"]
    assert family.documentation == ("Emitted tokens per second of step time over the last 32 steps; "
                                    "0 once no step has run for 5 s")
