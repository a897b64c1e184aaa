"""Why a model cannot be used: a recipe or checkpoint folder that is missing (66) or there but unusable (65).

Below recipes.py and the checkpoint readers (hf_config.py, hf_checkpoint.py, hf_tokenizer.py),
which all raise them, so that the registry can import its readers and none of them imports it.
"""

from met.exit_codes import EX_DATAERR, EX_NOINPUT


class RecipeError(Exception):
    """A recipe that cannot be used: unknown, missing weights, or weights that are not the recipe's.

    `status` is the exit status every command reports it with: EX_NOINPUT here (a subclass for bad
    data, CheckpointError, says EX_DATAERR).
    """

    status = EX_NOINPUT


class CheckpointError(RecipeError):
    """A checkpoint folder (or a card) that is there but cannot be used: unsupported architecture, bad files."""

    status = EX_DATAERR  # invalid data, not missing input
