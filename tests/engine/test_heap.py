"""Tests for met.engine.heap: settle collects boot's garbage first, then freezes what is alive."""

import gc
import weakref

import pytest

from met.engine.heap import settle


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


@pytest.fixture(autouse=True)
def _thaw():
    yield
    gc.unfreeze()  # the rest of the session's objects back under the collector


def test_settle_collects_cycles_before_freezing_the_survivors() -> None:
    garbage, alive = _Node(), _Node()
    dead = weakref.ref(garbage)
    del garbage
    frozen = settle()
    assert dead() is None  # collected, not frozen for ever
    # settle's count is of the moment it froze: a frozen object freed since (a caller's temporary) leaves the
    # permanent generation, so the count now may be lower, and only the survivors' state is checked
    assert frozen > 0
    assert not any(obj is alive for obj in gc.get_objects())  # frozen objects are out of every generation


def test_objects_made_after_settle_are_still_collected() -> None:
    settle()
    later = _Node()
    dead = weakref.ref(later)
    del later
    gc.collect()
    assert dead() is None
