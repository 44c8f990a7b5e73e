"""A per-worker admission window: at most ``limit`` requests in flight, best priority first.

Thousands of trajectories may wait for one worker. Sending every step at
once would need a connection each and leave the ordering to whichever HTTP
connection frees up first; instead the session keeps the queue itself, in
the scheduler's priority order (lower first, FIFO among equals), and the
worker sees a window of requests wide enough to fill its batch, ordered
again by vLLM's priority scheduler.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools

__all__ = ["AdmissionWindow"]


class AdmissionWindow:
    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"admission limit {limit} must be >= 1")
        self.limit = limit
        self.active = 0
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    @property
    def waiting(self) -> int:
        return sum(1 for *_, f in self._waiting if not f.done())

    async def acquire(self, priority: int) -> None:
        if self.active < self.limit and not self._waiting:
            self.active += 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (priority, next(self._seq), future))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()  # granted just as it was cancelled: pass the slot on
            raise

    def release(self) -> None:
        self.active -= 1
        while self._waiting and self.active < self.limit:
            _, _, future = heapq.heappop(self._waiting)
            if not future.done():
                self.active += 1
                future.set_result(None)
