"""Where a model comes from: an embedded recipe's name or a local checkpoint folder, as recipe, model and tokenizer."""

from pathlib import Path
from typing import NamedTuple

import torch

from met.model import recipes
from met.model.hf_checkpoint import checkpoint_name
from met.model.hf_tokenizer import HfTokenizer
from met.model.errors import CheckpointError
from met.model.recipes import Recipe, RecipeError, hf_recipe
from met.model.tokenizer import BYTES, Tokenizer
from met.model.transformer import Transformer

DEFAULT_MAX_LEN = 2048  # context a runner allocates unless told (the KV cache holds slots x this); real
# checkpoints declare far longer max_position_embeddings than a CPU box or a test wants to allocate


class Source(NamedTuple):
    """A loaded model: the recipe that keys its tables and lookup scopes, the model, its tokenizer."""

    recipe: Recipe
    model: Transformer
    tokenizer: Tokenizer


def is_path(spec: str) -> bool:
    """Whether --model names a folder rather than an embedded recipe: a path-like name, or an existing directory."""
    return spec.startswith((".", "~", "/")) or "/" in spec or _is_dir(spec)


def resolve(spec: str) -> Recipe:
    """The recipe an embedded name or a checkpoint folder stands for (weights are digested, not loaded)."""
    if not is_path(spec):
        return recipes.embedded(spec)
    return hf_recipe(_folder(spec))


def recipe_name(spec: str) -> str:
    """The name tables are filed under: the embedded recipe's, or the folder's model name (reads config.json only)."""
    if not is_path(spec):
        recipes.embedded(spec)  # an unknown or unusable name is refused before a table is filed under it
        return spec
    return checkpoint_name(_folder(spec))


def _folder(spec: str) -> Path:
    if not _is_dir(spec):
        raise RecipeError(f"no checkpoint folder {spec!r} (--model takes an embedded recipe's name, e.g. "
                          f"{recipes.DEFAULT_RECIPE}, or a folder with config.json, *.safetensors and tokenizer.json)")
    return Path(spec).expanduser()


def _is_dir(spec: str) -> bool:
    try:
        return Path(spec).expanduser().is_dir()
    except (OSError, RuntimeError, ValueError):  # a name past the file system's limit; ~user of no such user; a NUL
        return False


def tokenizer_for(recipe: Recipe) -> Tokenizer:
    """The recipe's tokenizer: bytes for the embedded recipes, the folder's tokenizer.json for a checkpoint."""
    if recipe.source != "hf":
        return BYTES
    path = recipe.weights / "tokenizer.json"
    if not path.exists():
        raise RecipeError(f"{recipe.weights} has no tokenizer.json (met reads fast tokenizers only; "
                          "AutoTokenizer.from_pretrained(...).save_pretrained(folder) writes one)")
    return HfTokenizer(path, recipe.card.get("eos_ids", ()))


def load_source(spec: str, dtype: torch.dtype = torch.float32, device: str = "cpu") -> Source:
    """Recipe, model (eval mode, in dtype on device) and tokenizer of an embedded name or a checkpoint folder."""
    recipe = resolve(spec)
    tokenizer = tokenizer_for(recipe)  # before the weights: a missing tokenizer should not cost a load
    return Source(recipe, recipe.load(dtype, device), tokenizer)


def context_len(recipe: Recipe, max_len: int = 0) -> int:
    """Tokens per sequence a runner allocates: max_len if given, else the model's own, at most DEFAULT_MAX_LEN.

    ValueError for a max_len the model cannot run: 1 (no room for a prompt and a new token) or past its context
    (which was cut silently before).
    """
    if max_len == 1 or max_len > recipe.config.max_seq_len:
        raise ValueError(f"{max_len} is not a context {recipe.name} can run: 2..{recipe.config.max_seq_len} tokens "
                         "(a prompt and one new token at least), or 0 for the model's own")
    return min(max_len or DEFAULT_MAX_LEN, recipe.config.max_seq_len)


def draft_model_for(target: Recipe, spec: str) -> Recipe:
    """The recipe of --draft-model `spec` drafting for target: CheckpointError (exit 65) unless both share a tokenizer.

    A draft model proposes token ids the target verifies, so both must mean the same thing by every id:
    the same tokenizer (the byte tokenizer of the embedded recipes, or the same tokenizer.json) and the
    same vocabulary size.
    """
    draft = resolve(spec)
    mine, theirs = tokenizer_for(target).name, tokenizer_for(draft).name
    if mine != theirs:
        raise CheckpointError(f"draft model {draft.name} has tokenizer {theirs}, the target {target.name} has {mine}; "
                              "a draft model must share its target's tokenizer")
    if draft.config.vocab_size != target.config.vocab_size:
        raise CheckpointError(f"draft model {draft.name} has a vocabulary of {draft.config.vocab_size} tokens, the "
                              f"target {target.name} of {target.config.vocab_size}; a draft model must share its "
                              "target's vocabulary")
    return draft
