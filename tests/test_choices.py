"""met.choices holds copies of values whose owners import torch or fastapi: each must equal its owner's."""

import pytest

import met.choices as choices


@pytest.mark.parametrize("name, owner", [
    ("DEFAULT_RECIPE", "met.model.recipes"),
    ("RUN_DTYPES", "met.engine.identity"),
    ("MAX_THREADS", "met.engine.identity"),
    ("SPEC_MODES", "met.engine.proposer"),
    ("NGRAM_MAX", "met.engine.proposer"),
    ("SERVE_SPECS", "met.engine.policy"),
    ("LOG_LEVELS", "met.serve.server"),
    ("ENERGY_CHOICES", "met.bench.meters"),
    ("POLICIES", "met.bench.policies"),
    ("OPTIONAL_POLICIES", "met.bench.policies"),
])
def test_each_choice_equals_its_owners(name, owner):
    import importlib

    assert getattr(choices, name) == getattr(importlib.import_module(owner), name)
