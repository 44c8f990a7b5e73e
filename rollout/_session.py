"""The rollout session: every task sample's agent loop, under one scheduling policy.

One asyncio task per trajectory runs step → environment → step. Before each
step the predictor re-ranks it (progressive priority goes to vLLM as the
request priority) and the placement policy picks a worker; a worker that
does not hold the context gets it by import (recompute from the session's
token history). Every ``replan_interval_s`` the placement plan is redone and
trajectories in tool calls migrate (import with ``warm`` on the receiver).
A worker that fails is marked down; its trajectories recompute elsewhere and
a health loop brings it back once ``/readyz`` answers. Every retry of a step
backs off (doubling); a step that keeps failing on ready workers fails its
trajectory, and so does a step the worker rejects (4xx: the request is at
fault). When the first finishes are all such rejections, the session stops
with the error instead of grinding through the rest. Finished trajectories
go to the output sink at once; a restarted session skips them.

The session is composed of parts, one module each, all over one state:

- ``_session_state``: configuration, result, and the state every part reads;
- ``_session_workers``: the pool's workers, connections, health, draining;
- ``_session_loop``: the control loop, each trajectory's turns and steps;
- ``_session_output``: how a trajectory ends, its score and its record;
- ``_session_weights``: weight pushes, versions and the staleness bound;
- ``_session_replan``: the re-plan driver and migrations;
- ``_session_progress``: counts, tokens/s and the ETA.

This module composes them: the constructor and the run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from prometheus_client import Counter

from heddle.api import AsynchronySpec, SamplingSpec, WeightsSpec
from heddle.exceptions import HeddleError, WorkerRejectedError
from heddle.scheduler import (
    EngineInstance,
    FinishedTrajectory,
    PerfModel,
    PredictorConfig,
    Trajectory,
    VersionAgedOrdering,
    get_policy,
    make_migration,
    make_ordering,
    make_placement,
    make_predictor,
)
from heddle.worker import HttpPool, StepReply, WorkerClient, WorkerEndpoint, trajectory_id

from ._admission import AdmissionWindow
from ._drafts_feed import DraftsFeed
from ._environments import Environment
from ._groups import GroupStream
from ._output import OutputSink, record_key
from ._progress import Progress, SessionMetrics, TokenRate
from ._record import TrajectoryRun
from ._session_gc import quiet_collector
from ._session_loop import SessionLoop, step_seed
from ._session_progress import SessionProgress
from ._session_replan import SessionReplan
from ._session_state import SessionConfig, SessionResult, _prompt_estimate, log
from ._tasks import Task
from ._weights import WeightsKeeper

__all__ = ["RolloutSession", "SessionConfig", "SessionResult", "step_seed"]


class RolloutSession(SessionLoop, SessionReplan, SessionProgress):
    """Runs ``tasks × samples_per_task`` trajectories on ``workers``; see the module docstring."""

    def __init__(
        self,
        *,
        job: str,
        tasks: Sequence[Task],
        samples_per_task: int,
        environment: Environment,
        workers: Sequence[WorkerEndpoint],
        sink: OutputSink,
        perf: PerfModel,
        sampling: SamplingSpec,
        max_turns: int,
        policy: str = "heddle",
        deadline_s: float | None = None,
        malformed_tasks: int = 0,
        history: Sequence[FinishedTrajectory] = (),
        config: SessionConfig | None = None,
        metrics: SessionMetrics | None = None,
        on_progress: Callable[[Progress], None] | None = None,
        weights: WeightsSpec | None = None,
        weight_versions: dict[str, str] | None = None,
        max_trajectories_in_flight: int | None = None,
        trace: OutputSink | None = None,
        asynchrony: AsynchronySpec | None = None,
        drafts: DraftsFeed | None = None,
    ) -> None:
        if not workers:
            raise HeddleError("a rollout session needs at least one worker")
        self.job = job
        self.tasks = list(tasks)
        self.samples_per_task = samples_per_task
        self.environment = environment
        self.sink = sink
        self.trace = trace  # the token trace (spec.output.trace), resumed like the output
        self.perf = perf
        self.sampling = sampling
        self.max_turns = max_turns
        self.policy = get_policy(policy)
        self.deadline_s = deadline_s
        self.malformed_tasks = malformed_tasks
        self.config = config or SessionConfig()
        self.metrics = metrics or SessionMetrics()
        # Labelled children of the per-step counters, looked up once: labels() takes a
        # lock and checks its arguments on every call, several times a step.
        self._children: dict[tuple[Counter, tuple[str, ...]], Counter] = {}
        self.on_progress = on_progress
        # At most this many trajectories started and unfinished (the rest start in task
        # order as others finish): the in-flight cap the shape planner may ask for.
        if max_trajectories_in_flight is not None and max_trajectories_in_flight < 1:
            raise HeddleError(
                f"max_trajectories_in_flight={max_trajectories_in_flight} must be >= 1"
            )
        self._slots = (
            asyncio.Semaphore(max_trajectories_in_flight) if max_trajectories_in_flight else None
        )
        self.ordering = make_ordering(self.policy.ordering)
        self.placement = make_placement(self.policy.placement)
        self.migration = make_migration(self.policy.migration, perf)
        # Priors at the job's scale: the paper's (4,096 of 40,960 tokens) on a small budget
        # rank the tail last until the first refit (PredictorConfig.for_budget).
        self.predictor = (
            make_predictor(
                self.policy.predictor, PredictorConfig.for_budget(sampling.max_total_tokens)
            )
            if self.policy.predictor
            else None
        )
        if self.predictor is not None and history:
            self.predictor.seed(history)
        self._endpoints = {w.name: w for w in workers}
        self._history = history
        # Siblings' and earlier iterations' texts for engines' suffix caches (suffix/auto).
        self.drafts = drafts
        self.runs: dict[str, TrajectoryRun] = {}
        if drafts is not None:  # the seed gate reads the trajectories' predictions
            drafts.track(self.runs, len(workers))
        # With spec.weights, a worker takes steps only once it serves them (docs/rollouts.md).
        self.weights = WeightsKeeper(job, weights, weight_versions, self.config.step_timeout_s)
        # spec.asynchrony: weight versions in the order they were pushed (the first: the
        # job's), each with its place, which the staleness bound counts in.
        self.asynchrony = asynchrony
        self._version_index: dict[str, int] = {} if weights is None else {weights.version: 0}
        self._pushes = 0
        self.past_bound_restarts = 0
        self.past_bound_drops = 0
        # Finished groups for a trainer, the quota and the carry-over (rollout/_groups.py).
        self.groups = GroupStream(
            asynchrony,
            write=self._write_now,
            drop=self._drop_stale,
            place=lambda version: None if version is None else self._version_index.get(version),
            pushes=lambda: self._pushes,
            version=lambda: self.weights.spec.version if self.weights.spec else None,
            oldest_first=self.policy.version_age,  # the trainer's take (heddle.scheduler)
        )
        if self.policy.version_age:  # oldest weight version first (heddle.scheduler._versions)
            self.ordering = VersionAgedOrdering(
                self.ordering, lambda t: self.groups.age(self.runs[t.id])
            )
        self._live: set[str] = set(self._endpoints) if weights is None else set()
        self._draining: set[str] = set()
        self._strikes: dict[str, int] = {}
        # Workers that answered 401 (another token): down until the pool gives a new endpoint.
        self._refused: set[str] = set()
        self._load: dict[str, int] = dict.fromkeys(self._endpoints, 0)
        self._inflight: dict[str, set[asyncio.Task[StepReply]]] = {
            n: set() for n in self._endpoints
        }
        self._clients: dict[str, WorkerClient] = {}
        self._probes: dict[str, WorkerClient] = {}  # own connections: never queued behind steps
        self._windows: dict[str, AdmissionWindow] = {}
        self._instances: dict[str, EngineInstance] = {}
        self._pools: dict[str, HttpPool] = {}  # per worker: steps, and probes apart
        self._connected = False
        self._moving: set[str] = set()
        self._replan_now = asyncio.Event()
        self._worker_live = asyncio.Event()
        self._rate = TokenRate()
        self._tokens = 0
        self._resumed = 0
        self._finished = {"done": 0, "failed": 0}
        self._steps = 0
        self._migrations = 0
        self._recomputes = 0
        self._promotions = 0
        self._replans = 0
        self._last_priority: dict[str, int] = {}
        self._worker_failures = 0
        self._failures: list[str] = []
        # Worker rejections (4xx) of the first finishes, while nothing else has finished.
        self._rejected_streak: list[WorkerRejectedError] | None = []
        self._give_up = asyncio.Event()
        self._give_up_reason: HeddleError | None = None
        self._started = 0.0
        self._worker_seen = 0.0

    async def run(self) -> SessionResult:
        done_keys = self.sink.open()
        if self.trace is not None:
            try:
                self.trace.open()
            except BaseException:
                self.sink.close()
                raise
        self._started = self._worker_seen = time.monotonic()
        for index, task in enumerate(self.tasks):
            for sample in range(self.samples_per_task):
                if record_key(task.id, sample) in done_keys:
                    self._resumed += 1
                    continue
                tid = trajectory_id(self.job, index, sample)
                traj = Trajectory(tid, f"{self.job}-t{index:06d}", prompt_tokens=0)
                self.runs[tid] = TrajectoryRun(
                    traj,
                    task,
                    index,
                    sample,
                    self.environment.episode(task, index, sample, tid),
                    pending=list(task.messages),
                    steps=[] if self.trace is not None else None,
                )
        for run in self.runs.values():
            run.traj.prompt_tokens = _prompt_estimate(run.pending)
            self._predict(run)
        sizes: dict[int, int] = {}
        for run in self.runs.values():
            sizes[run.task_index] = sizes.get(run.task_index, 0) + 1
        self.groups.begin(sizes)
        self.environment.begin()
        view = self._view()
        if self.runs and view is not None:
            self.placement.replan([r.traj for r in self.runs.values()], view)
        deadline_hit = False
        self._connected = True
        for endpoint in self._endpoints.values():
            self._connect(endpoint)
        await self._purge_workers()  # what an earlier session of this job left resident
        tasks = [asyncio.create_task(self._in_slot(r), name=r.traj.id) for r in self.runs.values()]
        helpers = [
            asyncio.create_task(self._health_loop(), name="health"),
            asyncio.create_task(self._progress_loop(), name="progress"),
            asyncio.create_task(self._give_up_watch(), name="give-up"),
        ]
        if self.weights.spec is not None:
            helpers.append(
                asyncio.create_task(
                    self.weights.run(list(self._endpoints), self._probes.get, self._serves_weights),
                    name="weights",
                )
            )
        if self.drafts is not None:
            helpers.append(asyncio.create_task(self.drafts.run(self._clients.get), name="drafts"))
        if self.policy.migration != "none" or self.policy.placement == "presorted-dp":
            helpers.append(asyncio.create_task(self._replan_loop(), name="replan"))
        try:
            with quiet_collector():  # the trajectories built above stay out of its way
                deadline_hit = await self._wait(tasks, helpers)
        finally:
            # A worker may join while the session shuts down (the operator syncs workers
            # concurrently): from here on it is not connected.
            self._connected = False
            for t in [*tasks, *helpers]:
                t.cancel()
            await asyncio.gather(*tasks, *helpers, return_exceptions=True)
            await self._purge_workers()  # nothing of this job stays resident after it
            await self.environment.close()
            if self.environment.reward is not None:
                await self.environment.reward.close()
            pools, self._pools = list(self._pools.values()), {}
            for http in pools:
                await http.aclose()
            try:
                self.groups.close()  # held records (a quota's) go to the output
                if deadline_hit:
                    self._truncate_unfinished()
            finally:
                try:
                    self.sink.close()  # the output's lock goes even if a last write fails
                finally:
                    if self.trace is not None:
                        self.trace.close()
        progress = self.progress()
        self._publish(progress)
        return SessionResult(
            progress,
            self._migrations,
            self._recomputes,
            self._worker_failures,
            self._steps,
            deadline_hit,
            self._failures[:10],
            promotions=self._promotions,
            replans=self._replans,
            drafts=None if self.drafts is None else self.drafts.stats.as_dict(),
        )

    async def _wait(
        self, tasks: list[asyncio.Task[None]], helpers: list[asyncio.Task[None]]
    ) -> bool:
        """Until every trajectory finished; True when the deadline cut the run short.

        Done-callbacks count finishes (``asyncio.wait`` on thousands of tasks would
        re-register on every one of them after each finish).
        """
        remaining = len(tasks)
        wake = asyncio.Event()
        failures: list[BaseException] = []

        def finished(task: asyncio.Task[None]) -> None:
            nonlocal remaining
            if task in helper_set or not task.cancelled():
                error = None if task.cancelled() else task.exception()
                if task in helper_set and error is None and not task.cancelled():
                    error = HeddleError(f"session helper {task.get_name()} stopped")
                if error is not None:
                    failures.append(error)
            if task not in helper_set:
                remaining -= 1
            if remaining == 0 or failures:
                wake.set()

        helper_set = set(helpers)
        for t in [*tasks, *helpers]:
            t.add_done_callback(finished)
        if not tasks:
            return False
        timeout = None
        if self.deadline_s is not None:
            timeout = max(0.0, self._started + self.deadline_s - time.monotonic())
        try:
            await asyncio.wait_for(wake.wait(), timeout)
        except TimeoutError:
            log.warning(
                "%s: deadline of %.0f s reached; recording %d unfinished trajectories as truncated",
                self.job,
                self.deadline_s,
                remaining,
            )
            return True
        if failures:
            raise failures[0]
        return False
