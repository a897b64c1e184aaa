"""The recipe registry: a recipe is a name, a config and a weights file with its digest.

A recipe is either embedded (shipped under met/model/weights/ with its card) or a local Hugging
Face checkpoint folder (read by hf_config.py and hf_checkpoint.py); both are built and loaded here.
"""

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from met.model.config import ModelConfig
from met.model.digest_cache import cached_digest
from met.model.errors import CheckpointError, RecipeError
from met.model.hf_checkpoint import files_digest, load_hf, model_name, recipe_digest, weight_files
from met.model.hf_config import read_hf_config
from met.model.transformer import Transformer
from met.model.weights import file_digest, load_model, read_card

WEIGHTS_DIR = Path(__file__).parent / "weights"
DEFAULT_RECIPE = "met-tiny-py"
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")  # a file name in WEIGHTS_DIR: no folder, no leading dot


@dataclass(frozen=True, slots=True)
class Recipe:
    """A model as tables and caches key it: name, config, weights and the digest of those weights."""

    name: str
    config: ModelConfig
    weights: Path  # the safetensors file; for a checkpoint folder, the folder
    digest: str  # file_digest of weights, as recorded in the model card (a folder: its safetensors files and config)
    card: dict
    source: str = "embedded"  # "embedded": shipped in the package; "hf": a local Hugging Face checkpoint folder

    @property
    def id(self) -> str:
        """What cost tables record as their recipe: name@digest."""
        return f"{self.name}@{self.digest}"

    def load(self, dtype: torch.dtype = torch.float32, device: str = "cpu") -> Transformer:
        """The model with this recipe's weights."""
        if self.source == "hf":
            return load_hf(self.weights, self.config, self.card.get("architecture"), dtype, device)
        return load_model(self.config, self.weights, dtype).to(device)


def embedded(name: str = DEFAULT_RECIPE, verify: bool = True) -> Recipe:
    """A recipe shipped in the package (weights under met/model/weights/); verify checks the digest.

    RecipeError when there is no such recipe (or name is not a plain name); CheckpointError, the
    subclass commands exit 65 with, when its card is there but damaged.
    """
    if not _PLAIN_NAME.fullmatch(name) or ".." in name:
        raise RecipeError(f"{_shown(name)} is not an embedded recipe's name (a plain name of letters, digits, "
                          f"'.', '_' and '-'; known: {_known()})")
    weights = WEIGHTS_DIR / f"{name}.safetensors"
    card_path = WEIGHTS_DIR / f"{name}.card.json"
    if not _is_file(weights) or not _is_file(card_path):
        raise RecipeError(f"no embedded recipe {_shown(name)} (known: {_known()}); train one with: met model train")
    try:
        card = read_card(card_path)
    except OSError as exc:
        raise RecipeError(f"cannot read {card_path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise _damaged(str(exc)) from None
    if "drafter" in card:
        raise RecipeError(f"{name!r} is the {card['drafter']} drafter of {card.get('target')}, not a recipe")
    config, digest = card.get("config"), card.get("digest")
    for key, value, kind, what in (("config", config, dict, "a JSON object"), ("digest", digest, str, "a string")):
        if key not in card:
            raise _damaged(f"{card_path} has no {key!r}")
        if not isinstance(value, kind):
            raise _damaged(f"{card_path}: {key} must be {what}, got {value!r:.80}")
    try:
        config = ModelConfig(**config)
    except (TypeError, ValueError) as exc:  # a field ModelConfig lacks, a value of the wrong type or out of range
        raise _damaged(f"{card_path}: config: {exc}") from None
    if verify:
        try:
            actual = file_digest(weights)
        except OSError as exc:
            raise RecipeError(f"cannot read {weights}: {exc.strerror or exc}") from None
        if actual != digest:
            raise RecipeError(f"{weights} has digest {actual}, but its card says {digest}; "
                              f"the weights were replaced without their card")
    return Recipe(name, config, weights, digest, card)


def hf_recipe(folder: Path) -> Recipe:
    """The recipe of a checkpoint folder: its model name, config and the digest of its weights and config."""
    folder = folder.resolve()
    hf = read_hf_config(folder)
    files = weight_files(folder)
    name = model_name(folder, hf.hub_id)
    card = {"source": "hf", "folder": str(folder), "architecture": hf.architecture, "hub_id": hf.hub_id,
            "files": [f.name for f in files], "eos_ids": list(hf.eos_ids)}
    digest = recipe_digest(cached_digest(folder, files, files_digest), hf.config)
    return Recipe(name, hf.config, folder, digest, card, source="hf")


def _known() -> str:
    """The embedded recipes' names, comma-separated (drafters, which ship beside their recipes, left out)."""
    known = sorted(p.name.removesuffix(".safetensors") for p in WEIGHTS_DIR.glob("*.safetensors")
                   if not p.name.endswith(".dflash.safetensors"))
    return ", ".join(known) or "none"


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # a name past the file system's limit (ENAMETOOLONG) names no file
        return False


def _shown(name: str) -> str:
    """name quoted, cut short when it is too long to read in a message."""
    return repr(name) if len(name) <= 64 else f"{name[:60]!r}... ({len(name)} characters)"


def _damaged(message: str) -> RecipeError:
    """A card that is there but damaged: invalid data, so a CheckpointError (commands exit 65 with it)."""
    return CheckpointError(f"{message}; reinstall met to restore the card it ships")
