"""New weights under a running session: pushes, the order of versions, the staleness bound.

``push_weights`` brings every worker to new weights while trajectories keep
running (docs/async.md). Each push takes the next place in the order of
versions; with ``spec.asynchrony`` a trajectory whose oldest step ran more
than ``max_staleness_versions`` pushes ago goes on, starts afresh or is
dropped, as ``pastBound`` says. Loading weights on a worker is
``_weights.WeightsKeeper``'s part.
"""

from __future__ import annotations

from heddle.api import AsynchronySpec, WeightsSpec
from heddle.exceptions import ConfigError

from ._output_record import TrajectoryStatus
from ._record import TrajectoryRun
from ._session_output import SessionOutput
from ._session_state import log

__all__ = ["SessionWeights"]


class SessionWeights(SessionOutput):
    """Weight pushes, the versions' places, and what happens past the staleness bound."""

    asynchrony: AsynchronySpec | None
    _version_index: dict[str, int]
    _pushes: int
    past_bound_restarts: int
    past_bound_drops: int

    def push_weights(self, spec: WeightsSpec) -> None:
        """New weights under the running rollout (docs/async.md).

        Each worker leaves the view (no new step goes to it), finishes the steps it runs
        (the worker settles them before it loads, aborting what outlasts its grace; an
        aborted step is sent again), loads ``spec`` in place and takes steps again. Every
        step sent from now on names ``spec.version``, and a worker still on the old
        weights refuses it (421), so each record's ``segments`` say which version made
        which tokens. Trajectories keep running: those in a tool gap never notice.
        """
        if self.weights.spec is None:
            raise ConfigError(
                f"job {self.job} names no spec.weights, so its workers have no version to "
                "move from; give the job spec.weights to push new ones mid-rollout"
            )
        if spec == self.weights.spec:
            return
        log.info("%s: new weights, version %s (%s)", self.job, spec.version, spec.path)
        self.weights.spec = spec
        self._pushes += 1
        self._version_index[spec.version] = self._pushes
        for name in list(self._endpoints):
            self._live.discard(name)
            self.weights.forget(name)
            self.weights.request(name)
        self.groups.pushed()  # finished members of untaken groups may now be past the bound

    def _past_bound(self, run: TrajectoryRun) -> str | None:
        """The version of ``run``'s oldest step when it is past the staleness bound, else None."""
        if self.asynchrony is None or not run.segments:
            return None
        oldest = run.segments[0][0]
        place = self._version_index.get(oldest) if oldest is not None else None
        if place is None or self._pushes - place <= self.asynchrony.max_staleness_versions:
            return None
        return oldest

    async def _follow_past_bound(self, run: TrajectoryRun) -> bool | None:
        """Before a step: what spec.asynchrony.pastBound says for a trajectory past the bound.

        None: go on (within the bound, or ``finish``: its segments show the versions);
        True: start afresh on the weights served now (``restart``); False: written as
        failed (``drop``).
        """
        stale = self._past_bound(run)
        if stale is None or self.asynchrony is None or self.asynchrony.past_bound == "finish":
            return None
        if self.asynchrony.past_bound == "restart":
            self.past_bound_restarts += 1
            run.past_bound_restarts += 1
            run.episode = self.environment.episode(
                run.task, run.task_index, run.sample, run.traj.id
            )
            return True
        self.past_bound_drops += 1
        now = self.weights.spec.version if self.weights.spec else None
        await self._finish(
            run,
            TrajectoryStatus.FAILED,
            "past_bound",
            f"its first step ran on weights version {stale}, more than "
            f"{self.asynchrony.max_staleness_versions} pushes before version {now}; "
            "spec.asynchrony.pastBound is drop",
        )
        return False

    def _run_again(self, run: TrajectoryRun) -> None:
        """A finished trajectory past the staleness bound starts afresh (pastBound restart)."""
        self.past_bound_restarts += 1
        run.past_bound_restarts += 1
        run.status, run.finish_reason, run.error = TrajectoryStatus.RUNNING, "", None
        run.reward = run.reward_info = run.reward_error = None
        run.restart()
        run.pending = list(run.task.messages)
        run.episode = self.environment.episode(run.task, run.task_index, run.sample, run.traj.id)
        self._predict(run)

    def _drop_stale(self, run: TrajectoryRun, reason: str) -> None:
        """A finished trajectory past the bound becomes a failed placeholder (pastBound drop)."""
        if run.finish_reason != "past_bound":
            self.past_bound_drops += 1
        run.status, run.finish_reason, run.error = TrajectoryStatus.FAILED, "past_bound", reason
