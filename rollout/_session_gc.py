"""The cyclic garbage collector kept off a running session's hot path.

A session builds its trajectories (their tasks, episodes, scripts, predictor
state) at the start and keeps them to the end, and each step allocates a few
dozen short-lived containers (coroutines, futures, request and reply dicts)
that are freed by reference counting, almost never by the collector: at
3,000 trajectories it found 529 objects of cyclic garbage in a run, while
its collections took 11% of the session's CPU (docs/benchmarks.md,
"Control-loop scale"). So while a session runs:

- what it built is frozen (``gc.freeze``): no full collection walks it again;
- the youngest generation is collected every ``_YOUNG_THRESHOLD`` net
  allocations instead of Python's 700, so the collector runs a thirtieth as
  often; what cyclic garbage the steps make waits a little longer.

Both end with the last session running in the process: the thresholds come
back and the frozen objects are collected as before.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["quiet_collector"]

_YOUNG_THRESHOLD = 20_000


class _Sessions:
    """Sessions running in this process: the last one to end restores the collector."""

    running = 0
    saved: tuple[int, int, int] = gc.get_threshold()


@contextlib.contextmanager
def quiet_collector() -> Iterator[None]:
    """Freeze what is alive now and collect the young generation less often, until the end."""
    if _Sessions.running == 0:
        _Sessions.saved = gc.get_threshold()
        young, *older = _Sessions.saved
        gc.set_threshold(max(_YOUNG_THRESHOLD, young), *older)
    gc.freeze()  # a session that starts while another runs freezes its own trajectories too
    _Sessions.running += 1
    try:
        yield
    finally:
        _Sessions.running -= 1
        if _Sessions.running == 0:
            gc.set_threshold(*_Sessions.saved)
            gc.unfreeze()
