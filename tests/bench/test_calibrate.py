"""The calibration's outcomes: judged drafts, each with its sequence's previous first draft for the carry-over."""

import pytest
from random_models import micro_model

from met.bench.calibrate import CalibrationParams, collect, copy_missed, judged
from met.engine.generate import generate
from met.engine.runner import Draft, ModelRunner
from met.speculative.prompt_lookup import PromptLookup
from met.speculative.spec_cost import AcceptanceCalibration, DrafterKey
from met.speculative.spec_cost.calibration import AFTER_COPY
from met.speculative.spec_cost.lookup import copy_params


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
    assert {o[3] for o in outcomes if o[3] not in (None, AFTER_COPY)} <= {o[0] for o in firsts}
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


def test_a_step_whose_pending_token_the_historys_long_copy_missed_is_at_a_copys_end():
    history = PromptLookup(copy_params(), [1, 2, 3, 4, 5, 9, 1, 2, 3, 4])  # (1, 2, 3, 4) recurs: its copy says 5
    assert copy_missed(history, 7) and not copy_missed(history, 5)
    short = PromptLookup(copy_params(), [1, 2, 3, 5, 9, 1, 2, 3])  # a 3-token match says little of a copy
    assert not copy_missed(short, 7)
    # a decode of text that repeats itself: its copy-end steps carry AFTER_COPY, and the fit keeps their rates apart
    prompts = [[3, 9, 4, 1, 7, 3, 9, 4, 1, 2] * 3, [5, 6, 7, 8, 1, 5, 6, 7, 8, 2] * 3]
    outcomes = collect(micro_model(), prompts, CalibrationParams(prompts=2, new_tokens=48, depth=3, batch=2))
    after = [o for o in outcomes if o[3] == AFTER_COPY]
    assert after and len(after) < len(outcomes)
    fitted = AcceptanceCalibration.fit(outcomes * 40, DrafterKey("mtp", "m", "d"))
    rate = sum(o[1] for o in after if o[2] == 1) / sum(o[2] == 1 for o in after)
    assert fitted.after_copy and fitted.after_copy[0].position == 1
    assert fitted.after_copy[0].p_accept == pytest.approx(rate)
    assert fitted.p_carried(AFTER_COPY, 1) == pytest.approx(rate)
    assert AcceptanceCalibration.parse(fitted.to_toml()) == fitted
