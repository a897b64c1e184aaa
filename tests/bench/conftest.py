"""Fixtures of the bench tests: a micro recipe with random weights, so no test needs the shipped weights."""

import pytest
import torch

from met.model.config import ModelConfig
from met.model.recipes import Recipe
from met.model.transformer import Transformer
from met.model.weights import save_weights


@pytest.fixture(scope="session")
def micro_recipe(tmp_path_factory) -> Recipe:
    """The micro preset with seeded random weights, saved as a recipe would be (name, weights, digest)."""
    torch.manual_seed(0)
    config = ModelConfig.from_name("micro")
    weights = tmp_path_factory.mktemp("recipe") / "micro-random.safetensors"
    digest = save_weights(Transformer(config), weights)
    return Recipe("micro-random", config, weights, digest, {})


@pytest.fixture
def use_micro(monkeypatch, micro_recipe) -> Recipe:
    """Every recipe name resolves to the micro recipe (the commands load recipes through `embedded`)."""
    import met.model.recipes as recipes

    monkeypatch.setattr(recipes, "embedded", lambda name: micro_recipe)  # the commands import it when they run
    return micro_recipe
