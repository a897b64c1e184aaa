"""Suite-wide pytest settings: hypothesis profiles and the guard against an empty collection."""

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else "dev")


def pytest_collection_finish(session: pytest.Session) -> None:
    """A run that collected nothing is a broken run, not a green one."""
    if not session.items and not session.config.option.collectonly:
        raise pytest.UsageError("no tests collected: the suite is missing or its paths are wrong")


@pytest.fixture(autouse=True, scope="session")
def _met_cache_dir(tmp_path_factory):
    """met's digest cache in a temporary folder (subprocesses inherit it): the suite never writes ~/.cache."""
    os.environ["MET_CACHE_DIR"] = str(tmp_path_factory.mktemp("met-cache"))


def pytest_configure(config: pytest.Config) -> None:
    """Tiny test models run fastest on one thread, and so do two test processes sharing two cores."""
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model():
    """A random micro model in float64 (random_models.micro_model), one per test module."""
    from random_models import micro_model

    return micro_model()


@pytest.fixture
def micro_embedded(tmp_path, monkeypatch):
    """(model, recipe): a random micro model installed as the embedded recipe 'micro-t' in a temporary weights folder."""
    from dataclasses import asdict

    import torch

    import met.model.recipes as recipes
    from met.model.config import ModelConfig
    from met.model.transformer import Transformer
    from met.model.weights import save_weights, write_card

    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_name("micro"))
    digest = save_weights(model, tmp_path / "micro-t.safetensors")
    write_card({"config": asdict(model.cfg), "digest": digest}, tmp_path / "micro-t.card.json")
    monkeypatch.setattr(recipes, "WEIGHTS_DIR", tmp_path)
    return model, recipes.embedded("micro-t")
