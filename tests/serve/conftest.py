"""Fixtures of the serve tests: one random micro model for the session (helpers live in serve_helpers.py)."""

import pytest

from met.model.transformer import Transformer
from random_models import micro_model


@pytest.fixture(scope="session")
def model() -> Transformer:
    return micro_model()
