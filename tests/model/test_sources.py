"""Where --model points: an embedded recipe's name or a checkpoint folder, and names the file system refuses."""

import pytest

from met.model.recipes import RecipeError
from met.model.sources import is_path, recipe_name, resolve


def test_overlong_name_is_an_unknown_embedded_recipe():
    # 300 characters is past the file system's name limit: not a folder, so an unknown recipe
    assert not is_path("x" * 300)
    with pytest.raises(RecipeError, match="no embedded recipe"):
        resolve("x" * 300)


def test_overlong_path_is_no_checkpoint_folder(tmp_path):
    # a path with a 300-character part cannot be a folder: said so, not an OSError
    spec = str(tmp_path / ("x" * 300))
    assert is_path(spec)
    with pytest.raises(RecipeError, match="no checkpoint folder"):
        resolve(spec)


def test_unknown_user_home_is_no_checkpoint_folder():
    # ~user of a user that does not exist: no folder, not a RuntimeError from expanduser
    with pytest.raises(RecipeError, match="no checkpoint folder '~no-such-user-met/m'"):
        resolve("~no-such-user-met/m")


def test_an_existing_folder_is_a_path_even_without_a_slash(tmp_path, monkeypatch):
    # a folder in the working directory named plainly is still a checkpoint folder
    (tmp_path / "ckpt").mkdir()
    monkeypatch.chdir(tmp_path)
    assert is_path("ckpt") and not is_path("met-tiny-py")


@pytest.mark.parametrize("spec", ["x" * 300, "met-tiny", "met tiny"])
def test_recipe_name_refuses_what_is_no_embedded_recipe(spec):
    # tables are filed under the name: one that is no recipe (or past the name limit) is refused first
    with pytest.raises(RecipeError, match="embedded recipe"):
        recipe_name(spec)
    assert recipe_name("met-tiny-py") == "met-tiny-py"
