"""met generate runs on the scheduler: prompts through Scheduler ticks, each request's counts adding up to the run's."""

from met.engine.generate import generate
from met.engine.runner import ModelRunner
from met.engine.scheduler import Scheduler


def _prompts() -> list[list[int]]:
    return [[97, 98, 99, 97, 98], [100, 101], [102, 97, 102, 97, 102, 97]]


def test_generate_ticks_one_scheduler_and_its_requests_counts_are_the_runs(model, monkeypatch):
    # generate kept a loop of its own beside the scheduler's (and its MTP path was the slowest of the three)
    ticked = []
    tick = Scheduler.tick

    def counted(self):
        ticked.append(self)
        return tick(self)

    monkeypatch.setattr(Scheduler, "tick", counted)
    outs = generate(ModelRunner(model, 2), _prompts(), 20, "mtp", 3, stop_at_eos=False)
    assert ticked and all(s is ticked[0] for s in ticked)  # one scheduler, ticked until the last request ended
    run = ticked[0].stats
    assert sum(o.steps for o in outs) == run.seq_steps and sum(o.proposed for o in outs) == run.proposed > 0
    assert sum(o.accepted for o in outs) == run.accepted
    # three prompts in two slots: the third starts when a slot frees; each text is the one it gets alone
    alone = [generate(ModelRunner(model, 1), [p], 20, "off", stop_at_eos=False)[0].tokens for p in _prompts()]
    assert [o.tokens for o in outs] == alone and all(len(t) == 20 for t in alone)


def test_an_eos_ends_a_sequence_only_when_asked(model):
    # eos_ids end it (finished_by "eos", the id not returned); with stop_at_eos False the same id is a token
    free = generate(ModelRunner(model, 1), [[97, 98]], 12, "off", stop_at_eos=False)[0]
    first = free.tokens[3]
    stopped = generate(ModelRunner(model, 1), [[97, 98]], 12, "off", eos_ids=(first,))[0]
    assert stopped.finished_by == "eos" and stopped.tokens == free.tokens[: free.tokens.index(first)]
    assert free.finished_by == "length" and len(free.tokens) == 12
