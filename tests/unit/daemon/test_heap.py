"""The daemon's collector settings once its configuration runs (settle_heap)."""

from __future__ import annotations

import gc

import pytest

from honk.daemon.app import GC_YOUNG_THRESHOLD, settle_heap


@pytest.fixture
def collector():
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


def test_settling_the_heap_freezes_what_runs_and_spaces_young_collections(collector):
    gc.unfreeze()
    kept = [[i] for i in range(100)]  # containers the running configuration would hold
    _young, *older = gc.get_threshold()
    settle_heap()
    assert gc.get_freeze_count() >= len(kept)
    assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, *older)
    settle_heap()  # a reload settles again: nothing stacks up
    assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, *older)
