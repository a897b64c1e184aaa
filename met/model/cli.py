"""The `met model` sub-app and its info command: describe a recipe (embedded or a checkpoint folder).

`met model train` is met.train.cli's: the card it writes carries acceptance decoded by the
engine, which met.model does not import. met/cli.py wires both commands into model_app.
"""

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Callable

import typer

from met.choices import DEFAULT_RECIPE
from met.exit_codes import EX_DATAERR, EX_NOINPUT
from met.model.config import ModelConfig
from met.path_option import nonempty_model

if TYPE_CHECKING:
    from met.model.recipes import Recipe

model_app = typer.Typer(help="Train and inspect the embedded model recipe.", no_args_is_help=True, rich_markup_mode=None)


def fail(message: str, code: int) -> typer.Exit:
    """Print `error: message` on stderr (one line, unwrapped); the typer.Exit(code) to raise."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def info_cmd(
    recipe: Annotated[str, typer.Option(
        "--model", "--recipe", parser=nonempty_model,
        help="Embedded recipe name, or a Hugging Face checkpoint folder (Llama, Mistral, Qwen2, Qwen3).",
    )] = DEFAULT_RECIPE,
    as_json: Annotated[bool, typer.Option("--json", help="Print the whole card as JSON.")] = False,
) -> None:
    """Print the recipe, its parameter count, weights digest and model card.

    For a checkpoint folder: its recipe id (the digest covers its weights and the config met reads
    from config.json: what tables and calibrations are keyed by), architecture, config and files.
    Exit statuses: 0 printed; 65 (EX_DATAERR) the recipe's card, or its DFlash drafter's card, is
    damaged (not a JSON object, or a field missing or of the wrong type), or the checkpoint folder
    is one met cannot run; 66 (EX_NOINPUT) --model names no embedded recipe or checkpoint folder,
    or a card cannot be read.
    """
    from rich.console import Console  # rich, torch and the recipe: imported when the command runs

    from met.model.recipes import RecipeError
    from met.model.sources import resolve
    from met.model.weights import read_card

    try:
        r = resolve(recipe)
    except RecipeError as e:
        raise fail(str(e), e.status) from None
    if as_json:
        typer.echo(json.dumps(r.card, indent=2, sort_keys=True))
        return
    if r.source == "hf":
        out = Console(soft_wrap=True)  # a line to a pipe or a log stays one line
        out.print(f"[bold]{r.id}[/bold]  ({r.weights})")
        for line in _checkpoint_lines(r):
            out.print(line, markup=False)  # names from the folder's files are not rich markup
        return
    lines = _card_lines(r.weights.with_name(f"{r.name}.card.json"), r.card, lambda card: _recipe_lines(r, card))
    dflash_path = r.weights.with_name(f"{r.name}.dflash.card.json")
    if dflash_path.exists():
        try:
            dflash_card = read_card(dflash_path)
        except OSError as e:
            raise fail(f"cannot read {dflash_path}: {e.strerror or e}", EX_NOINPUT) from None
        except ValueError as e:
            raise fail(f"{e}; reinstall met to restore the card it ships", EX_DATAERR) from None
        lines += _card_lines(dflash_path, dflash_card, _dflash_lines)
    out = Console(soft_wrap=True)  # a line to a pipe or a log stays one line
    out.print(f"[bold]{r.id}[/bold]  ({r.weights})")
    for line in lines:
        out.print(line, markup=False)  # a card's text is not rich markup


def _card_lines(path: Path, card: dict, lines: Callable[[dict], list[str]]) -> list[str]:
    """lines(card); exit 65 naming the card and the field when a field is missing or of the wrong type."""
    try:
        return lines(card)
    except KeyError as e:
        raise fail(f"{path} has no {e.args[0]!r}; reinstall met to restore the card it ships", EX_DATAERR) from None
    except (TypeError, ValueError, AttributeError) as e:
        raise fail(f"{path} holds a field of the wrong type ({e}); reinstall met to restore the card it ships",
                   EX_DATAERR) from None


def _config_line(c: ModelConfig) -> str:
    return (f"config: dim {c.dim}, layers {c.n_layers}, heads {c.n_heads}/{c.n_kv_heads} kv, ffn {c.ffn_dim}, "
            f"context {c.max_seq_len}, vocab {c.vocab_size}, MTP depth {c.mtp_depth}")


def _checkpoint_lines(r: "Recipe") -> list[str]:
    card = r.card
    hub = f" (hub model {card['hub_id']})" if card.get("hub_id") else ""
    return [f"checkpoint folder: {card['architecture']}{hub}", _config_line(r.config),
            f"weights: {', '.join(card['files'])}; the recipe's digest covers them and the config met reads "
            "from config.json",
            f"end-of-sequence ids: {', '.join(map(str, card['eos_ids'])) or 'none'}"]


def _recipe_lines(r: "Recipe", card: dict) -> list[str]:
    c = r.config
    corpus, t = card["corpus"], card["training"]
    without = card["parameters_without_mtp"]
    lines = [
        f"parameters: {card['parameters']:,}" + (f" ({without:,} without the MTP module)" if c.mtp_depth else ""),
        _config_line(c),
        *([f"distilled from: {card['distilled_from']} (met model train --drafter draft)"]
          if "distilled_from" in card else []),
        f"corpus: {corpus['source']}: {corpus['train_files']} train files ({corpus['train_tokens']:,} bytes), "
        f"{corpus['heldout_files']} held out ({corpus['heldout_rule']})",
        _training_line(t),
    ]
    for earlier in _started_from(t):  # the runs whose weights this one continued, latest first
        lines.append(f"  started from {earlier['digest']}: " + _training_line(earlier["training"])
                     if earlier.get("training") else f"  started from {earlier['digest']}")
    lines += [f"held-out {name.replace('_', ' ')}: {value}" for name, value in card["heldout"].items()]
    return lines + [f"MTP greedy acceptance at draft {depth}: {rate}" for depth, rate in _per_position(card)]


def _training_line(t: dict) -> str:
    return (f"training: {t['steps']} steps x {t['batch']} x {t['seq_len']}, {t['tokens_seen']:,} tokens, "
            f"{t['wall_s'] / 60:.0f} min on {t['threads']} threads")


def _started_from(t: dict) -> list[dict]:
    """The card's chain of `started_from` entries (met model train --init-from), latest first."""
    chain = []
    while isinstance(t, dict) and isinstance(t.get("started_from"), dict):
        chain.append(t["started_from"])
        t = t["started_from"].get("training")
    return chain


def _dflash_lines(dc: dict) -> list[str]:
    lines = [f"DFlash drafter: block {dc['config']['block']}, {dc['parameters']:,} parameters, "
             f"digest {dc['digest']} (trained against {dc['target']})"]
    return lines + [f"DFlash greedy acceptance at draft {depth}: {rate}" for depth, rate in _per_position(dc)]


def _per_position(card: dict) -> list[tuple[str, object]]:
    """The card's acceptance per draft position, in position order (1, 2, ..., 10, not as strings sort)."""
    per_position = card.get("acceptance", {}).get("per_position", {})
    return sorted(per_position.items(), key=lambda item: _position(item[0]))


def _position(key: str) -> tuple[int, int, str]:
    """Numbered positions by number, then any others by name."""
    return (0, int(key), key) if key.isdecimal() else (1, 0, key)
