"""Fixed copies (met.engine.policy_lookup): exactly the asked depth of copies from a sequence's history."""

import pytest

from met.engine.policy_lookup import CopyFixedPolicy, fixed_copy
from met.engine.proposer import Proposer
from met.speculative.spec_capacity import VerifyPools


def test_a_fixed_copy_is_the_matched_copy_cycled_to_the_depth():
    # the suffix (5, 6) last occurred before 7: its continuation [7, 5, 6] reaches the present, so it loops
    assert fixed_copy(Proposer("mtp", [5, 6, 7, 5, 6], copy_ngram=4), 5) == [7, 5, 6, 7, 5]


def test_without_a_match_the_copy_is_the_historys_last_tokens_cycled():
    # no token of [1, 2, 3] recurs: its last tokens, cycled to the depth
    assert fixed_copy(Proposer("mtp", [1, 2, 3], copy_ngram=4), 5) == [1, 2, 3, 1, 2]
    assert fixed_copy(Proposer("mtp", [1, 2, 3, 4], copy_ngram=4), 2) == [3, 4]
    # a proposer with no index (a policy that does not copy) has no match either
    assert fixed_copy(Proposer("off", [9, 8]), 3) == [9, 8, 9]
    assert fixed_copy(Proposer("mtp", [1, 2, 3], copy_ngram=4), 0) == []


def test_copy_fixed_policy_asks_the_scheduler_for_indexed_histories_and_refuses_depth_zero():
    policy = CopyFixedPolicy(6, VerifyPools())
    assert policy.copies.copy_ngram > 0 and policy.name == "copy/fixed-6"
    with pytest.raises(ValueError, match="at least 1"):
        CopyFixedPolicy(0, VerifyPools())
