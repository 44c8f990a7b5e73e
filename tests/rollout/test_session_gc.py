"""The collector while a session runs: its objects frozen, young collections rarer, all undone."""

from __future__ import annotations

import gc
import weakref

from heddle.rollout._session_gc import _YOUNG_THRESHOLD, quiet_collector


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_a_running_session_freezes_its_objects_and_restores_the_collector_after() -> None:
    before = gc.get_threshold()
    gc.unfreeze()
    with quiet_collector():
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (max(_YOUNG_THRESHOLD, before[0]), *before[1:])
        with quiet_collector():  # a second session overlapping the first
            pass
        assert gc.get_threshold()[0] == max(_YOUNG_THRESHOLD, before[0])  # the first still runs
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_garbage_frozen_with_the_session_is_collected_once_it_ends() -> None:
    node = _Node()
    alive = weakref.ref(node)
    with quiet_collector():
        del node  # garbage now, but frozen: no collection frees it while the session runs
        gc.collect()
        assert alive() is not None
    gc.collect()
    assert alive() is None
