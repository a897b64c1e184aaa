"""Composes the drafting policy a serve runs from its flags (--spec, --spec-cost-model, --lift-wide-tier).

off: plain decode. mtp, static: the MTP gate picks MTP or plain by measured throughput, the
ladder and adaptive rung pick the depth (policy_mtp.MtpLadderPolicy). mtp, measured: the
measured planner picks the depth from the cost table and calibration, k = 0 meaning plain
(policy_mtp.MtpPlannedPolicy). draft: the same two policies drafting with the runner's draft
model in the MTP module's place (static, or measured from the draft model's own table and
calibration); a draft model has no depth of its own, so PolicyConfig.draft_depth is its deepest
draft, as the MTP depth is the MTP module's. eagle: the same two policies over the runner's EAGLE-3
head, as deep as draft_depth (measured: from the head's own table and calibration). A choice, the
`+`-joined names of two or three recursive drafters in the order mtp, draft, eagle (mtp+draft,
mtp+eagle, draft+eagle, mtp+draft+eagle): each drafter's measured planner, the best plan run each
step (policy_choice.DrafterChoicePolicy). ngram / prompt-lookup: host drafts from the sequence's own history,
the tenant's shared lookup cache as fallback (policy_lookup.LookupPolicy). dflash: the runner's
DFlash block drafter, its verify width set by the DFlash rung (policy_dflash.DflashPolicy), its
verify pools sized by the rung's tiers and the drafter's block rather than PolicyConfig.pools. The
capacity clamp applies under every policy (policy_base.clamp_depths).
"""

import os
from collections.abc import Mapping
from dataclasses import dataclass

from met.engine.policy_base import PlainPolicy, Policy
from met.engine.policy_dflash import DflashPolicy, RunnerDflash
from met.engine.policy_choice import DrafterChoicePolicy
from met.engine.policy_lookup import LookupPolicy
from met.engine.policy_mtp import MtpLadderPolicy, MtpPlannedPolicy
from met.engine.proposer import NGRAM_MAX
from met.speculative.spec_capacity import DEFAULT_POOLS, VerifyPools
from met.speculative.spec_cost import SpecCostState

CHOOSABLE = ("mtp", "draft", "eagle")  # the recursive drafters a choice is among, in the order --spec names them
# every choice: the `+`-joined names of two or more of them, in that order
CHOICES = ("mtp+draft", "mtp+eagle", "draft+eagle", "mtp+draft+eagle")
CHOICE = CHOICES[0]  # the MTP module and the draft model: the default with --draft-model on a model with MTP
SERVE_SPECS = ("off", "mtp", "draft", *CHOICES[:1], "eagle", *CHOICES[1:], "ngram", "prompt-lookup", "dflash")
PLANNED_SPECS = CHOOSABLE + CHOICES  # what --spec-cost-model measured plans


def choice_drafters(spec: str) -> tuple[str, ...]:
    """The drafters a --spec chooses among (mtp+eagle -> ("mtp", "eagle")); () for a spec that is no choice."""
    return tuple(spec.split("+")) if spec in CHOICES else ()
DRAFT_DEPTH = 4  # the draft model's default most drafts: what the default verify pools hold at widths 1..=8


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """The serve's drafting flags."""

    spec: str = "off"  # one of SERVE_SPECS
    lookup_depth: int = 4  # host proposers: most drafts per step (prompt-lookup's own window may ask fewer)
    lookup_min_ngram: int = 1  # host proposers: the shortest suffix match that proposes drafts
    pools: VerifyPools = DEFAULT_POOLS  # mtp, draft and host drafts; --lift-wide-tier lifts widths 9..=16 to two
    draft_depth: int = DRAFT_DEPTH  # draft, eagle: the drafter's most drafts per step (the ladder's at widths 1..=8)

    def __post_init__(self) -> None:
        if self.spec not in SERVE_SPECS:
            raise ValueError(f"--spec {self.spec!r} is not one of {', '.join(SERVE_SPECS)}")
        if not 1 <= self.lookup_depth <= 16:
            raise ValueError(f"lookup depth must be in 1..=16, got {self.lookup_depth}")
        if not 1 <= self.lookup_min_ngram <= NGRAM_MAX:
            raise ValueError(f"lookup min n-gram must be in 1..={NGRAM_MAX}, got {self.lookup_min_ngram}")
        if not 1 <= self.draft_depth <= 16:
            raise ValueError(f"draft depth must be in 1..=16, got {self.draft_depth}")


_NEEDS = {"mtp": "a model with an MTP module", "draft": "a draft model (--draft-model)",
          "eagle": "an EAGLE-3 head (--drafter FOLDER)"}


def build_policy(config: PolicyConfig, num_drafts: int, cost_state: SpecCostState | None = None,
                 environ: Mapping[str, str] | None = None, dflash_block: int | None = None,
                 draft_model: bool = False, eagle: bool = False,
                 draft_cost_state: SpecCostState | None = None,
                 cost_states: Mapping[str, SpecCostState] | None = None) -> Policy:
    """The policy for these flags; cost_state (a SpecCostState) selects the measured planner for mtp, draft or eagle.

    num_drafts: the model's MTP depth. dflash_block: the block of the runner's DFlash drafter (--spec
    dflash needs one). draft_model, eagle: whether the runner has a draft model (--spec draft needs one) or
    an EAGLE-3 head (--spec eagle). A choice: cost_states holds each drafter's state by name (mtp, draft,
    eagle), and the measured planner of each plans every step (policy_choice.DrafterChoicePolicy); for
    mtp+draft, cost_state and draft_cost_state may stand for the MTP module's and the draft model's.
    """
    if config.spec == "off":
        return PlainPolicy()
    if drafters := choice_drafters(config.spec):
        states = dict(cost_states or {})
        if config.spec == CHOICE:
            states.setdefault("mtp", cost_state)
            states.setdefault("draft", draft_cost_state)
        held = {"mtp": num_drafts >= 1, "draft": draft_model, "eagle": eagle}
        if missing := [d for d in drafters if states.get(d) is None or not held[d]]:
            raise ValueError(f"--spec {config.spec} chooses among {', '.join(drafters)} by their measured tables: "
                             f"{' and '.join(missing)} lack{'s' if len(missing) == 1 else ''} a drafter or a "
                             "table (it needs " + ", ".join(_NEEDS[d] for d in drafters) +
                             ", and --spec-cost-model measured)")
        depths = {"mtp": num_drafts, "draft": config.draft_depth, "eagle": config.draft_depth}
        return DrafterChoicePolicy([MtpPlannedPolicy(states[d], depths[d], config.pools, d) for d in drafters])
    if config.spec in CHOOSABLE:
        if config.spec == "mtp" and num_drafts < 1:
            raise ValueError("--spec mtp needs a model with an MTP module (mtp_depth >= 1)")
        if config.spec != "mtp":
            if not (draft_model if config.spec == "draft" else eagle):
                raise ValueError(f"--spec {config.spec} needs a runner with {_NEEDS[config.spec]}")
            num_drafts = config.draft_depth
        if cost_state is not None:
            return MtpPlannedPolicy(cost_state, num_drafts, config.pools, config.spec)
        return MtpLadderPolicy(num_drafts, config.pools, os.environ if environ is None else environ, config.spec)
    if cost_state is not None:
        raise ValueError(f"--spec-cost-model measured plans MTP, draft-model or EAGLE-3 depth; --spec {config.spec} "
                         "has no calibrated drafter")
    if config.spec == "dflash":
        if dflash_block is None:
            raise ValueError("--spec dflash needs a DFlash drafter (met model train --drafter dflash)")
        if config.pools != DEFAULT_POOLS:  # sized for MTP drafts; the rung's would be cut or ignored
            raise ValueError(f"--spec dflash sizes its verify pools from the DFlash rung; pools {config.pools} "
                             "(--lift-wide-tier) are for --spec mtp, drop them")
        return DflashPolicy(RunnerDflash(dflash_block))
    return LookupPolicy(config.spec, config.lookup_depth, config.pools, config.lookup_min_ngram)
