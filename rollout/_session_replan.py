"""A session's re-plan driver: the placement plan redone, and trajectories in tool calls moved.

Every ``replan_interval_s``, or at once when a worker joins or drains, the
session builds a ``ReplanState`` from its own state and takes the one re-plan
decision, ``heddle.scheduler.decide_replan`` (the simulator takes the same).
The moves it returns run here: the context is imported with ``warm`` on the
receiver, then released at the source.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from heddle.exceptions import WorkerRejectedError, WorkerUnavailableError
from heddle.scheduler import DrainingEngine, Move, ReplanState, TrajectoryState, decide_replan

from ._record import TrajectoryRun
from ._session_state import log
from ._session_workers import SessionWorkers

__all__ = ["SessionReplan"]


class SessionReplan(SessionWorkers):
    """The re-plan loop, its decision's input, and migrations."""

    _moving: set[str]
    _migrations: int
    _replans: int

    @property
    def replans(self) -> int:
        """Placement plans redone so far."""
        return self._replans

    async def _replan_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._replan_now.wait(), self.config.replan_interval_s)
            self._replan_now.clear()
            for move in self._replan():
                run = self.runs[move.trajectory_id]
                run.moving = asyncio.create_task(self._move(run, move.source, move.destination))

    def _replan_state(self) -> ReplanState | None:
        """The session's state as the re-plan decision sees it; ``None``: nothing to plan."""
        live = [r.traj for r in self.runs.values() if r.status == "running"]
        view = self._view()
        if not live or view is None:
            return None
        movable = [
            r.traj
            for r in self.runs.values()
            if r.status == "running"
            and r.moving is None
            and r.resident is not None
            and r.traj.state is TrajectoryState.IN_TOOL  # only these may move
        ]
        for t in movable:
            t.instance = self.runs[t.id].resident  # where its context is: a move starts there
        draining = {
            name: DrainingEngine(
                self.perf.instance(name, self._endpoints[name].tp), self._load.get(name, 0)
            )
            for name in sorted(self._draining & self._live)
            if name in self._endpoints
        }
        now = time.monotonic() - self._started
        return ReplanState(live, movable, view, now, draining, frozenset(self._moving))

    def _replan(self) -> tuple[Move, ...]:
        """Redo the placement plan; the moves to start (heddle.scheduler.decide_replan)."""
        state = self._replan_state()
        if state is None:
            return ()
        self._replans += 1
        return decide_replan(state, self.placement, self.migration).moves

    async def _move(self, run: TrajectoryRun, source: str, destination: str) -> None:
        if run.status != "running":
            run.moving = None  # it finished since the move was planned: nothing to move
            return
        self._moving.update((source, destination))
        try:
            await self._clients[destination].import_context(run.traj.id, run.tokens, warm=True)
        except (WorkerUnavailableError, WorkerRejectedError) as exc:
            log.info(
                "%s: migration of %s to %s failed (%s); it stays",
                self.job,
                run.traj.id,
                destination,
                exc,
            )
            return
        finally:
            self._moving.difference_update((source, destination))
            run.moving = None
        if run.resident == source:
            self._release_later(source, run.traj.id)
            run.resident = destination
            run.traj.instance = destination
            run.migrations.append({"from": source, "to": destination, "after_turn": run.traj.turns})
            self._migrations += 1
            self.metrics.migrations.labels(self.job).inc()
