"""The scheduler snapshot as plain JSON data: what GET /v1/snapshot returns and what the TUI renders."""

import dataclasses

from met.speculative.snapshot import SchedulerSnapshot

PAIR_FIELDS = ("mode_steps", "mode_seconds", "finished")  # tuples of (name, value) pairs, shown as objects


def snapshot_doc(snap: SchedulerSnapshot) -> dict:
    """Every snapshot field; (name, value) pair tuples become objects, other tuples lists."""
    doc = {}
    for f in dataclasses.fields(snap):
        value = getattr(snap, f.name)
        if f.name in PAIR_FIELDS:
            value = dict(value)
        elif isinstance(value, tuple):
            value = list(value)
        doc[f.name] = value
    return doc
