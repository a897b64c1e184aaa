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


def pytest_configure(config: pytest.Config) -> None:
    """Tiny test models run fastest on one thread, and so do two test processes sharing two cores."""
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(1)
