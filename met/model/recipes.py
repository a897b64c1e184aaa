"""The recipe registry: a recipe is a name, a config and a weights file with its digest."""

from dataclasses import dataclass
from pathlib import Path

import torch

from met.model.config import ModelConfig
from met.model.transformer import Transformer
from met.model.weights import file_digest, load_model, read_card

WEIGHTS_DIR = Path(__file__).parent / "weights"
DEFAULT_RECIPE = "met-tiny-py"


class RecipeError(Exception):
    """A recipe that cannot be used: unknown, missing weights, or weights that are not the recipe's."""


@dataclass(frozen=True, slots=True)
class Recipe:
    """A model as tables and caches key it: name, config, weights and the digest of those weights."""

    name: str
    config: ModelConfig
    weights: Path  # the safetensors file; for a checkpoint folder, the folder
    digest: str  # file_digest of weights, as recorded in the model card (a folder: over its safetensors files)
    card: dict
    source: str = "embedded"  # "embedded": shipped in the package; "hf": a local Hugging Face checkpoint folder

    @property
    def id(self) -> str:
        """What cost tables record as their recipe: name@digest."""
        return f"{self.name}@{self.digest}"

    def load(self, dtype: torch.dtype = torch.float32, device: str = "cpu") -> Transformer:
        """The model with this recipe's weights."""
        if self.source == "hf":
            from met.model.hf_checkpoint import load_hf  # not at the top: it imports this module

            return load_hf(self, dtype, device)
        return load_model(self.config, self.weights, dtype).to(device)


def embedded(name: str = DEFAULT_RECIPE, verify: bool = True) -> Recipe:
    """A recipe shipped in the package (weights under met/model/weights/); verify checks the digest."""
    weights = WEIGHTS_DIR / f"{name}.safetensors"
    card_path = WEIGHTS_DIR / f"{name}.card.json"
    if not weights.exists() or not card_path.exists():
        known = sorted(p.name.removesuffix(".safetensors") for p in WEIGHTS_DIR.glob("*.safetensors")
                       if not p.name.endswith(".dflash.safetensors"))  # drafters ship beside their recipes
        raise RecipeError(f"no embedded recipe {name!r} (known: {', '.join(known) or 'none'}); "
                          f"train one with: met model train")
    card = read_card(card_path)
    if "drafter" in card:
        raise RecipeError(f"{name!r} is the {card['drafter']} drafter of {card.get('target')}, not a recipe")
    config = ModelConfig(**card["config"])
    if verify and (actual := file_digest(weights)) != card["digest"]:
        raise RecipeError(f"{weights} has digest {actual}, but its card says {card['digest']}; "
                          f"the weights were replaced without their card")
    return Recipe(name, config, weights, card["digest"], card)
