"""A session's workers: who is in the pool, who takes steps, connections, health, draining.

A worker takes steps once it is live (``_live``): admitted, and serving the
job's weights when the job names some (``_weights.WeightsKeeper`` loads them).
The operator adds, drains and removes workers as pods come and go. A worker
that fails is marked down; its trajectories recompute elsewhere and a health
loop brings it back once ``/readyz`` answers. ``_view`` is the pool as
placement sees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from heddle.exceptions import WorkerRejectedError, WorkerUnavailableError
from heddle.scheduler import ClusterView, EngineInstance
from heddle.worker import HttpPool, StepReply, WorkerClient, WorkerEndpoint

from ._admission import AdmissionWindow
from ._session_state import SessionState, log

__all__ = ["SessionWorkers"]


class SessionWorkers(SessionState):
    """The pool as the session uses it: membership, connections, health, load."""

    _endpoints: dict[str, WorkerEndpoint]
    _live: set[str]
    _draining: set[str]
    _strikes: dict[str, int]
    _refused: set[str]
    _load: dict[str, int]
    _inflight: dict[str, set[asyncio.Task[StepReply]]]
    _clients: dict[str, WorkerClient]
    _probes: dict[str, WorkerClient]
    _windows: dict[str, AdmissionWindow]
    _instances: dict[str, EngineInstance]
    _pools: dict[str, HttpPool]
    _connected: bool
    _worker_seen: float
    _worker_failures: int
    _replan_now: asyncio.Event  # set when a worker joins or drains: re-plan at once
    _worker_live: asyncio.Event  # set when a worker starts taking steps: routing waits on it

    # -- pool changes (the operator calls these as pods come and go) ---------------------
    def add_worker(self, endpoint: WorkerEndpoint) -> None:
        # A new endpoint, perhaps with a new token: try it again.
        self._refused.discard(endpoint.name)
        self.weights.refused.discard(endpoint.name)
        self._endpoints[endpoint.name] = endpoint
        self._load.setdefault(endpoint.name, 0)
        self._inflight.setdefault(endpoint.name, set())
        if self._connected:
            self._connect(endpoint)
        self._admit(endpoint.name)

    def _serves_weights(self, name: str) -> None:
        self._live.add(name)
        self._worker_live.set()  # steps waiting for a worker (a push's load) go at once
        self._worker_seen = time.monotonic()  # the no-worker timeout counts from here
        self._replan_now.set()  # place the waiting trajectories on it

    def _admit(self, name: str) -> None:
        """Let a worker take steps, once it has loaded the job's weights."""
        if self.weights.spec is None:
            self._live.add(name)
            self._worker_live.set()
        else:
            self.weights.request(name)

    def _connect(self, endpoint: WorkerEndpoint) -> None:
        window = self.config.max_inflight_per_worker
        name = endpoint.name
        for pool in (self._pools.pop(name, None), self._pools.pop(f"{name}/probe", None)):
            if pool is not None:
                asyncio.get_running_loop().create_task(pool.aclose())
        token = endpoint.token
        http = self._pools[name] = HttpPool(endpoint.url, window + 16, token=token)
        probe = self._pools[f"{name}/probe"] = HttpPool(endpoint.url, 2, token=token)
        timeout = self.config.step_timeout_s
        self._clients[name] = WorkerClient(endpoint, http, step_timeout_s=timeout)
        self._probes[name] = WorkerClient(endpoint, probe)
        self._windows.setdefault(
            endpoint.name, AdmissionWindow(self.config.max_inflight_per_worker)
        )

    async def _purge_workers(self) -> None:
        """Ask every worker to drop this job's resident contexts; a worker that does not
        answer in time keeps them until its idle TTL (docs/worker-api.md)."""
        # The workers now: one may join (add_worker) while the purges are under way.
        names = list(self._probes)
        calls = [self._probes[name].purge(self.job) for name in names]
        results = await asyncio.gather(*calls, return_exceptions=True)
        for name, result in zip(names, results, strict=True):
            if isinstance(result, Exception):
                log.info("%s: worker %s did not purge the job's contexts (%s)",
                         self.job, name, result)  # fmt: skip

    def drain_worker(self, name: str) -> None:
        """No new steps go there; contexts in tool calls migrate off (docs/operator.md)."""
        if name not in self._draining:
            self._draining.add(name)
            log.info("%s: worker %s drains; %d trajectories on it", self.job, name,
                     self.resident_on(name))  # fmt: skip
            self._replan_now.set()  # start moving trajectories off now, not at the next period

    def remove_worker(self, name: str) -> None:
        self._mark_down(name, "removed from the pool")
        self._endpoints.pop(name, None)
        self._draining.discard(name)

    def drained(self) -> list[str]:
        """Draining workers this session no longer uses and holds no trajectory on."""
        return sorted(n for n in self._draining if self.resident_on(n) == 0)

    def resident_on(self, name: str) -> int:
        """Unfinished trajectories whose context lives on ``name``, or with a step there."""
        held = sum(1 for r in self.runs.values() if r.resident == name and r.status == "running")
        return held + len(self._inflight.get(name, ()))

    def _view(self) -> ClusterView | None:
        """The workers steps may go to now; ``None`` when there is none."""
        names = sorted(n for n in self._live if n not in self._draining and n in self._endpoints)
        if not names:
            return None
        for n in names:
            if n not in self._instances:
                self._instances[n] = self.perf.instance(n, self._endpoints[n].tp)
        instances = [self._instances[n] for n in names]
        return ClusterView(instances, {n: self._load[n] for n in names})

    def _release_later(self, worker: str, trajectory_id: str) -> None:
        client = self._clients.get(worker)
        if client is None or worker not in self._live:
            return

        async def release() -> None:
            with contextlib.suppress(WorkerUnavailableError, WorkerRejectedError):
                await client.release(trajectory_id)

        asyncio.get_running_loop().create_task(release())

    def _mark_down(self, name: str, reason: str) -> None:
        self.weights.forget(name)  # a worker that comes back is loaded again (_admit)
        if name not in self._live:
            return
        self._live.discard(name)
        if self.drafts is not None:
            self.drafts.forget_engine(name)
        self._worker_failures += 1
        self.metrics.worker_failures.labels(self.job, name).inc()
        log.warning(
            "%s: worker %s is down (%s); its trajectories recompute elsewhere",
            self.job,
            name,
            reason,
        )
        for run in self.runs.values():
            if run.resident == name:
                run.resident = None
        for step in list(self._inflight.get(name, ())):
            step.cancel()

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.health_interval_s)
            names = list(self._endpoints)
            answers = await asyncio.gather(
                *(self._probes[n].ready(timeout=self.config.health_interval_s * 2) for n in names)
            )
            for name, ok in zip(names, answers, strict=True):
                if ok:
                    self._strikes[name] = 0
                    if (
                        name not in self._live
                        and name not in self._refused
                        and name not in self.weights.refused
                        and not self.weights.loading(name)
                    ):
                        log.info("%s: worker %s is ready again", self.job, name)
                        self._admit(name)
                    continue
                self._strikes[name] = self._strikes.get(name, 0) + 1
                if self._strikes[name] >= self.config.unhealthy_after:
                    self._mark_down(name, f"{self._strikes[name]} failed readiness probes")
