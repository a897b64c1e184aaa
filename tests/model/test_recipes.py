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


def test_overlong_name_is_an_unknown_recipe():
    # 300 characters is past the file system's name limit: an unknown recipe, not an OSError
    with pytest.raises(RecipeError, match="no embedded recipe 'xxxx.*known: met-tiny-py"):
        embedded("x" * 300)


@pytest.mark.parametrize("name", ["../weights/met-tiny-py", "weights/met-tiny-py", "..", ".", "met tiny", ""])
def test_a_name_that_is_not_plain_is_refused(name):
    # an embedded recipe is a plain name, never a path into or out of the weights folder
    with pytest.raises(RecipeError, match="not an embedded recipe's name .*known: met-tiny-py"):
        embedded(name)


def _shipped_with_card(tmp_path, monkeypatch, text: str):
    """A weights folder holding the shipped weights (linked) beside a card with this text."""
    weights = embedded(verify=False).weights
    (tmp_path / "met-tiny-py.safetensors").symlink_to(weights)
    (tmp_path / "met-tiny-py.card.json").write_text(text)
    monkeypatch.setattr("met.model.recipes.WEIGHTS_DIR", tmp_path)


@pytest.mark.parametrize("text, why", [
    ("{", "is not JSON"),  # cut short
    ("", "is not JSON"),  # emptied
    ("[]", "is not a JSON object"),  # a list
    ("{}", "has no 'config'"),  # no fields
    ('{"config": [], "digest": "00"}', "config must be a JSON object"),  # config of the wrong type
    ('{"config": {"dim": 7}, "digest": "00"}', "config: "),  # config ModelConfig refuses
    ('{"config": {"bogus": 1}, "digest": "00"}', "config: "),  # a field ModelConfig does not have
    ('{"config": {}}', "has no 'digest'"),  # no digest
    ('{"config": {}, "digest": 5}', "digest must be a string"),  # digest of the wrong type
])
def test_damaged_card_is_a_checkpoint_error_naming_it(tmp_path, monkeypatch, text, why):
    # a damaged card is invalid data (CheckpointError: commands exit 65), named with what is wrong
    from met.model.hf_config import CheckpointError

    _shipped_with_card(tmp_path, monkeypatch, text)
    with pytest.raises(CheckpointError, match=f"met-tiny-py.card.json.*{why}"):
        embedded()
