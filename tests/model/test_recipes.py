"""The shipped recipe: its weights load, their digest is the recipe's, and its card holds the figures."""

import shutil

import pytest
import torch

from met.model.recipes import RecipeError, embedded
from met.model.weights import file_digest


def test_shipped_weights_load_and_match_their_digest():
    # the package ships met-tiny-py; the file's sha256 is the digest its card and recipe id carry
    r = embedded()
    assert file_digest(r.weights) == r.digest
    assert r.id == f"met-tiny-py@{r.digest}"
    model = r.load()
    assert model.num_parameters() == r.card["parameters"]
    assert torch.isfinite(model(torch.tensor([list(b"def f(x):")]))).all()


def test_card_reports_heldout_bpb_and_acceptance_per_depth():
    # the card carries held-out bits per byte and MTP acceptance at depths 1..4
    card = embedded().card
    assert 0 < card["heldout"]["bits_per_byte"] < 8
    per_position = card["acceptance"]["per_position"]
    assert sorted(per_position) == ["1", "2", "3", "4"]
    assert per_position["1"] >= 0.5


def test_replaced_weights_are_refused(tmp_path, monkeypatch):
    # weights that are not the card's digest are refused with both digests named
    r = embedded()
    shutil.copy(r.weights, tmp_path / "met-tiny-py.safetensors")
    shutil.copy(r.weights.with_name("met-tiny-py.card.json"), tmp_path / "met-tiny-py.card.json")
    with open(tmp_path / "met-tiny-py.safetensors", "r+b") as f:
        f.seek(-4, 2)
        f.write(b"\x00\x01\x02\x03")
    monkeypatch.setattr("met.model.recipes.WEIGHTS_DIR", tmp_path)
    with pytest.raises(RecipeError, match="replaced without their card"):
        embedded()


def test_unknown_recipe_names_the_known_ones():
    # a typo lists what exists and how to make one
    with pytest.raises(RecipeError, match="met-tiny-py"):
        embedded("met-tiny")
