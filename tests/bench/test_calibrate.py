"""The calibration's outcomes: judged drafts, each with its sequence's previous first draft for the carry-over."""

from random_models import micro_model

from met.bench.calibrate import CalibrationParams, collect, judged
from met.engine.generate import generate
from met.engine.runner import Draft, ModelRunner


def test_judged_drafts_stop_after_the_first_rejection_and_carry_the_previous_first_draft():
    draft = Draft([5, 6, 7, 8], [-0.1, -0.2, -0.3, -0.4])
    assert list(judged(draft, 1, -0.5)) == [(-0.1, True, 1, -0.5), (-0.2, False, 2, -0.5)]
    assert list(judged(draft, 4)) == [(c, True, j, None) for j, c in enumerate(draft.confidences, 1)]


def test_each_sequences_first_step_has_no_previous_and_later_steps_carry_their_last_first_draft():
    prompts = [[3, 9, 4, 1, 7], [2, 2, 8], [6, 5, 4, 3, 2, 1], [11, 12]]
    outcomes = collect(micro_model(), prompts, CalibrationParams(prompts=4, new_tokens=24, depth=3, batch=4))
    firsts = [o for o in outcomes if o[2] == 1]
    # one first-position outcome per step of every sequence; only each sequence's first step has no previous
    assert sum(o[3] is None for o in firsts) == len(prompts)
    assert {o[3] for o in outcomes if o[3] is not None} <= {o[0] for o in firsts}
    assert len(firsts) > 2 * len(prompts)  # several steps per sequence, so a carry-over was recorded


def test_generations_are_each_prompt_and_its_greedy_continuation_for_prompt_lookups_fit():
    model = micro_model()
    prompts = [[3, 9, 4, 1, 7], [2, 2, 8], [6, 5, 4, 3, 2, 1], [11, 12], [5, 5, 5]]
    generations: list = []
    collect(model, prompts, CalibrationParams(prompts=5, new_tokens=20, depth=3, batch=2), generations=generations)
    assert [p for p, _ in generations] == prompts  # batches of 2: every prompt once, in order
    for prompt, generated in generations:
        plain = generate(ModelRunner(model, 1), [prompt], len(generated), "off")[0].tokens
        assert len(generated) >= 20 and generated == plain  # drafting changed nothing of the greedy text
