"""What the cards of the recipe and of its draft model both record: the corpus they were trained on.

A card that names its corpus lets `met model info` say what the weights saw, and a reader check
that the held-out figures were measured on files the weights never trained on.
"""

import sys

from met.model.corpus import HELDOUT_PERCENT, Split, stdlib_root


def corpus_card(train_split: Split, heldout: Split) -> dict:
    """The card's "corpus": where it was read, how it was split, and the size of each split."""
    return {"source": f"Python {'.'.join(map(str, sys.version_info[:3]))} stdlib .py files",
            "root": str(stdlib_root()), "train_files": len(train_split.files), "heldout_files": len(heldout.files),
            "heldout_rule": f"int(sha256(relative path).hexdigest()[:8], 16) % 100 < {HELDOUT_PERCENT}",
            "train_tokens": int(len(train_split.tokens)), "heldout_tokens": int(len(heldout.tokens))}
