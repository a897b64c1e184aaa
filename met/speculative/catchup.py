"""How the MTP block's catch-up rows share passes: the runner runs them so, the planner prices them so.

A sequence's MTP block is behind by the rows it has not seen (a prompt just prefilled, the rows of
a run of plain steps, or the k + 1 rows a verify left). Catch-ups of at most CATCHUP_SHARED_ROWS
rows share one pass. Longer ones share a pass only with catch-ups of the same power-of-two size
class: batched with short ones, every row would be padded to the longest (at width 4 after a
256-token prompt, a 4 x 256 pass of which three quarters is padding), while a pass per sequence
pays the per-pass overhead width times (at width 16 after 16 plain steps, 16 passes of 17 rows
took 2.1x the time of one: `python3 benchmarks/studies/mtp_catchup.py`).
"""

CATCHUP_SHARED_ROWS = 16


def catchup_groups(rows: list[int]) -> list[list[int]]:
    """Indices of `rows` in catch-up passes: every short catch-up in one, the long ones by size class.

    Within a long pass no row is padded to more than twice its length.
    """
    short = [b for b, r in enumerate(rows) if r <= CATCHUP_SHARED_ROWS]
    classes: dict[int, list[int]] = {}
    for b, r in enumerate(rows):
        if r > CATCHUP_SHARED_ROWS:
            classes.setdefault((r - 1).bit_length(), []).append(b)  # r in (2^(c-1), 2^c]
    return ([short] if short else []) + [classes[c] for c in sorted(classes)]


def check_verified(slots: list[int], rows: list[int]) -> None:
    """RuntimeError if a slot has no rows to catch up on: its last draft took them and no verify has added more."""
    if not all(rows):
        raise RuntimeError(f"slot {slots[rows.index(0)]} was drafted for and not verified since; verify its drafts "
                           "before drafting again")
