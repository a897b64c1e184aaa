"""Drafter acceptance measured by real speculative decoding on held-out prompts (for the model card)."""

from collections.abc import Iterable

from met.engine.generate import Output, generate
from met.engine.runner import ModelRunner
from met.model.corpus import heldout_prompts
from met.model.dflash import DflashDrafter
from met.model.tokenizer import encode
from met.model.transformer import Transformer
from met.speculative.dflash_rung import DflashParams, DflashRung


def acceptance_summary(outputs: Iterable[Output], method: str) -> dict:
    """Acceptance figures over generations.

    per_position[j]: share of steps that proposed a j-th draft in which drafts 1..j were all accepted
    (position 1 is the first-draft acceptance). mean_accepted_length counts accepted drafts per step;
    the bonus token is not counted.
    """
    proposed: list[int] = []
    accepted: list[int] = []
    steps = drafts = hits = 0
    for o in outputs:
        steps, drafts, hits = steps + o.steps, drafts + o.proposed, hits + o.accepted
        for j, (p, a) in enumerate(zip(o.proposed_at, o.accepted_at)):
            if j == len(proposed):
                proposed.append(0)
                accepted.append(0)
            proposed[j] += p
            accepted[j] += a
    return {
        "method": method,
        "per_position": {str(j + 1): round(a / p, 4) for j, (a, p) in enumerate(zip(accepted, proposed)) if p},
        "acceptance_rate": round(hits / drafts, 4) if drafts else None,
        "mean_accepted_length": round(hits / steps, 4) if steps else None,
    }


def mtp_acceptance(model: Transformer, prompts: int = 16, max_tokens: int = 128, depth: int = 4,
                   width: int = 8, prompt_bytes: int = 256) -> dict:
    """Greedy MTP decoding at a fixed depth from held-out file openings (see acceptance_summary)."""
    texts = heldout_prompts(prompts, prompt_bytes=prompt_bytes)
    runner = ModelRunner(model, max_batch=width)
    outs = [o for i in range(0, len(texts), width)
            for o in generate(runner, [encode(t) for t in texts[i : i + width]], max_tokens, "mtp", depth,
                              stop_at_eos=False)]
    return acceptance_summary(outs, f"greedy MTP decoding, depth {depth}, {max_tokens} tokens from each of "
                                    f"{len(texts)} held-out file openings ({prompt_bytes} bytes)")


def dflash_acceptance(model: Transformer, drafter: DflashDrafter, prompts: int = 16, max_tokens: int = 128,
                      prompt_bytes: int = 256) -> dict:
    """Greedy DFlash decoding at a fixed gamma (the whole block), one stream at a time (see acceptance_summary)."""
    texts = heldout_prompts(prompts, prompt_bytes=prompt_bytes)
    block = drafter.block
    fixed = DflashParams(tiers=(), wide_gamma=block, single_levels=(block,), up=())
    runner = ModelRunner(model, max_batch=1, dflash=drafter)
    outs = [generate(runner, [encode(t)], max_tokens, "dflash", stop_at_eos=False, rung=DflashRung(fixed))[0]
            for t in texts]
    return acceptance_summary(outs, f"greedy DFlash decoding, gamma {block}, width 1, {max_tokens} tokens from each "
                                    f"of {len(texts)} held-out file openings ({prompt_bytes} bytes)")
