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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter

from heddle.api import AsynchronySpec, SamplingSpec, WeightsSpec
from heddle.exceptions import (
    ConfigError,
    HeddleError,
    StepFailedError,
    WorkerRejectedError,
    WorkerUnavailableError,
)
from heddle.scheduler import (
    SAMPLING_LIMITS,
    ClusterView,
    DrainingEngine,
    EngineInstance,
    FinishedTrajectory,
    Move,
    PerfModel,
    PredictorConfig,
    ReplanState,
    Trajectory,
    TrajectoryState,
    VersionAgedOrdering,
    decide_replan,
    engine_priority,
    get_policy,
    make_migration,
    make_ordering,
    make_placement,
    make_predictor,
)
from heddle.worker import HttpPool, StepReply, WorkerClient, WorkerEndpoint, trajectory_id

from ._admission import AdmissionWindow
from ._drafts_feed import DraftsFeed
from ._environments import Environment, Outcome, ParsedCalls
from ._groups import GroupStream
from ._output import OutputSink, record_key
from ._output_record import OutputRecord, TrajectoryStatus
from ._progress import Progress, SessionMetrics, TokenRate
from ._record import TrajectoryRun
from ._tasks import Task
from ._weights import WeightsKeeper

__all__ = ["RolloutSession", "SessionConfig", "SessionResult", "step_seed"]

log = logging.getLogger("heddle.session")


@dataclass(frozen=True)
class SessionConfig:
    """Knobs of the control loop; times in seconds."""

    replan_interval_s: float = 2.0  # placement re-plan and migration period
    step_timeout_s: float = 600.0  # one LLM step at most before the worker counts as silent
    health_interval_s: float = 1.0  # probe period of /readyz
    unhealthy_after: int = 3  # consecutive failed probes that mark a live worker down
    no_worker_timeout_s: float = 300.0  # give up when no worker is live for this long
    progress_interval_s: float = 1.0  # how often on_progress is called
    max_inflight_per_worker: int = 128  # requests in flight per worker; the rest queue here
    retry_backoff_s: float = 0.1  # first wait before a failed step is sent again; doubles
    retry_backoff_max_s: float = 10.0  # the longest wait between two attempts of one step
    max_step_retries: int = 8  # failures of one step on workers that stay ready, then it fails
    fail_fast_after: int = 8  # the first N finishes all rejected alike (4xx) stop the session


@dataclass
class SessionResult:
    progress: Progress
    migrations: int
    recomputes: int
    worker_failures: int
    steps: int
    deadline_hit: bool = False
    failures: list[str] = field(default_factory=list)  # first few failure reasons
    promotions: int = 0  # steps sent at a higher priority than the trajectory's previous step
    replans: int = 0  # placement plans redone during the run
    drafts: dict[str, int] | None = None  # the drafting corpus's traffic (DraftsFeed.stats)


class RolloutSession:
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
            drafts.track(self.runs)
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

    @property
    def steps(self) -> int:
        """LLM steps finished so far (a trainer pushing weights every N steps reads it)."""
        return self._steps

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

    def _serves_weights(self, name: str) -> None:
        self._live.add(name)
        self._worker_seen = time.monotonic()  # the no-worker timeout counts from here
        self._replan_now.set()  # place the waiting trajectories on it

    def _admit(self, name: str) -> None:
        """Let a worker take steps, once it has loaded the job's weights."""
        if self.weights.spec is None:
            self._live.add(name)
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
        calls = [client.purge(self.job) for client in self._probes.values()]
        results = await asyncio.gather(*calls, return_exceptions=True)
        for name, result in zip(self._probes, results, strict=True):
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

    @property
    def replans(self) -> int:
        """Placement plans redone so far."""
        return self._replans

    def resident_on(self, name: str) -> int:
        """Unfinished trajectories whose context lives on ``name``, or with a step there."""
        held = sum(1 for r in self.runs.values() if r.resident == name and r.status == "running")
        return held + len(self._inflight.get(name, ()))

    # -- the run ----------------------------------------------------------------------
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

    def _truncate_unfinished(self) -> None:
        for run in self.runs.values():
            if run.scoring:  # finished; only its score was cut short
                run.reward_error = "the deadline came before the reward endpoint answered"
                self._write(run)
            elif run.status == "running":
                run.status, run.finish_reason = TrajectoryStatus.TRUNCATED, "deadline"
                if self.environment.reward is not None:
                    run.reward_error = "not scored: the deadline came before it finished"
                self._write(run)

    # -- one trajectory ------------------------------------------------------------------
    async def _in_slot(self, run: TrajectoryRun) -> None:
        """:meth:`_trajectory` within the in-flight cap (tasks queue for a slot in task order),
        once its group may start; again while the group stream says it fell past the bound."""
        await self.groups.admitted(run.task_index)
        while True:
            if self._slots is None:
                await self._trajectory(run)
            else:
                async with self._slots:
                    await self._trajectory(run)
            settled = self.groups.finished(run)
            if settled is None or not await settled:
                return
            self._run_again(run)

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

    async def _trajectory(self, run: TrajectoryRun) -> None:
        await self.weights.ready.wait()
        while True:
            opening = await run.episode.opening()
            run.started_at = time.time()
            if opening is not None and opening.done:
                return await self._finish_with(run, opening)
            if opening is not None:  # the agent wrote the prompt (external)
                run.pending = list(opening.messages)
                run.traj.prompt_tokens = _prompt_estimate(run.pending)
                self._predict(run)
            if not await self._turns(run):
                return
            # The environment gave the episode up and hands it out afresh: nothing of
            # this attempt is kept or written.
            if run.resident is not None:
                self._release_later(run.resident, run.traj.id)
            run.restart()
            run.pending = list(run.task.messages)  # an external agent's opening replaces it
            self._predict(run)

    async def _finish_with(self, run: TrajectoryRun, outcome: Outcome) -> None:
        """End the trajectory as the environment's ``outcome`` says."""
        if outcome.reward is not None or outcome.reward_info is not None:
            run.reward, run.reward_info = outcome.reward, outcome.reward_info
        status = outcome.status or (
            TrajectoryStatus.FAILED if outcome.finish_reason == "failed" else TrajectoryStatus.DONE
        )
        await self._finish(run, status, outcome.finish_reason, outcome.error)

    async def _turns(self, run: TrajectoryRun) -> bool:
        """Steps and environment turns until the end; True when the episode restarts."""
        traj = run.traj
        while True:
            remaining = self.sampling.max_total_tokens - traj.generated_tokens
            if remaining <= 0:
                await self._finish(run, TrajectoryStatus.TRUNCATED, "length")
                return False
            verdict = await self._follow_past_bound(run)
            if verdict is not None:
                return verdict
            max_tokens, ignore_eos = run.episode.turn_limit(
                traj.turns, self.sampling.max_tokens_per_turn
            )
            max_tokens = min(max_tokens, remaining)
            traj.state = TrajectoryState.QUEUED
            traj.ready_s = time.monotonic() - self._started
            try:
                worker, reply = await self._step(run, max_tokens, ignore_eos)
            except WorkerRejectedError as exc:
                if exc.status == 400 and "max length" in str(exc):
                    await self._finish(run, TrajectoryStatus.TRUNCATED, "context_length", str(exc))
                    return False
                # The request itself is at fault: sending it again would fail again.
                await self._finish(run, TrajectoryStatus.FAILED, "failed", str(exc), rejected=exc)
                return False
            except StepFailedError as exc:
                await self._finish(run, TrajectoryStatus.FAILED, "failed", str(exc))
                return False
            run.apply(worker, reply, self.sampling.logprobs, run.step_weight_version)
            if self.drafts is not None:
                self.drafts.step_done(run.task.id, traj.id, traj.turns, reply.token_ids, worker)
            run.episode.note_step(len(run.tokens) - len(reply.token_ids), len(reply.token_ids))
            self._steps += 1
            self._tokens += len(reply.token_ids)
            self._rate.add(len(reply.token_ids))
            self._child(self.metrics.tokens, self.job).inc(len(reply.token_ids))
            self._child(self.metrics.steps, self.job, worker).inc()
            # A step that ran across a push (finished on the old weights, or sent again on
            # the new ones) may have put the trajectory past the bound: act before its tools.
            verdict = await self._follow_past_bound(run)
            if verdict is not None:
                return verdict
            if traj.turns >= self.max_turns:
                outcome_done, reason = True, "max_turns"
            else:
                outcome_done, reason = False, ""
            traj.state = TrajectoryState.IN_TOOL
            traj.tool_expected_end_s = (
                time.monotonic() - self._started + run.episode.expected_tool_s
            )
            self._predict(run)
            tool_started = time.monotonic()
            parsed = (
                None
                if reply.tool_calls is None
                else ParsedCalls(reply.content or "", reply.tool_calls)
            )
            outcome = await run.episode.after_turn(
                traj.turns - 1, reply.text, reply.finish_reason, parsed
            )
            if outcome.assistant is not None:  # the turn in OpenAI's format, with its tool_calls
                run.messages[-1] = outcome.assistant
            tool_s = time.monotonic() - tool_started
            traj.tool_expected_end_s = None
            run.tool_calls += len(outcome.tool_calls)
            run.tool_errors += outcome.tool_errors
            traj.tool_calls = run.tool_calls
            for _ in range(len(outcome.tool_calls) - outcome.tool_errors):
                self._child(self.metrics.tool_calls, self.job, "ok").inc()
            for _ in range(outcome.tool_errors):
                self._child(self.metrics.tool_calls, self.job, "error").inc()
            if outcome.restart:
                return True
            if outcome.done:
                await self._finish_with(run, outcome)
                return False
            run.pending.extend(outcome.messages)
            run.tool_latency_s.append(tool_s)
            run.note_tool_gap(tool_s, outcome.tool_calls)
            if outcome_done:
                await self._finish(run, TrajectoryStatus.TRUNCATED, reason)
                return False
            self._predict(run)

    async def _step(
        self, run: TrajectoryRun, max_tokens: int, ignore_eos: bool
    ) -> tuple[str, StepReply]:
        """Run one LLM step somewhere; retried on other workers until it succeeds."""
        traj = run.traj
        sampling = {
            "max_tokens": max_tokens,
            "temperature": self.sampling.temperature,
            "top_p": self.sampling.top_p,
            "ignore_eos": ignore_eos,
            "logprobs": self.sampling.logprobs,
        }
        if self.sampling.seed is not None:
            sampling["seed"] = step_seed(self.sampling.seed, run.task_index, run.sample, traj.turns)
        failures = 0  # of this step on workers that stayed ready
        delay = self.config.retry_backoff_s
        while True:
            if run.moving is not None:
                await asyncio.shield(run.moving)
            name = await self._route(run)
            self._load[name] += 1
            step = asyncio.create_task(self._attempt(run, name, sampling))
            step.add_done_callback(_retrieved)
            self._inflight[name].add(step)
            try:
                await asyncio.wait({step})
            finally:
                self._inflight[name].discard(step)
                self._load[name] -= 1
                if not step.done():
                    step.cancel()
            try:
                if step.cancelled():
                    raise WorkerUnavailableError(name, "marked down while the step ran")
                return name, step.result()
            except WorkerUnavailableError as exc:
                run.resident = None  # the worker may hold half a step: rebuild the context
                run.retries += 1
                if exc.status == 401:
                    # Its /readyz is open, so it would look healthy: keep it down until the
                    # pool hands over its endpoint again (a new pod, a new token).
                    self._refused.add(name)
                    self._mark_down(name, str(exc))
                elif not step.cancelled() and await self._probes[name].ready(timeout=5.0):
                    failures += 1  # the worker is fine: the request may be what fails
                    if failures > self.config.max_step_retries:
                        raise StepFailedError(
                            name,
                            f"the step failed {failures} times on workers that stayed ready; "
                            f"last: {exc}",
                            exc.status,
                        ) from exc
                    log.info(
                        "%s: step of %s on %s failed (%s); retrying", self.job, traj.id, name, exc
                    )
                else:
                    self._mark_down(name, str(exc))
            except WorkerRejectedError as exc:
                run.resident = None
                # 404: the worker lost the context (restarted): recompute. 409: an abandoned
                # step still runs there. 421: it serves other weights (restarted): reload
                # them there, the step goes elsewhere. Else the request's fault: no retry.
                if exc.status == 421:
                    self.weights.forget(name)
                    self._live.discard(name)
                    self._admit(name)
                elif exc.status not in (404, 409):
                    raise
            # Every retry waits, doubling per attempt of this step: nothing loops hot.
            await asyncio.sleep(delay)
            delay = min(self.config.retry_backoff_max_s, delay * 2)

    async def _attempt(
        self, run: TrajectoryRun, name: str, sampling: Mapping[str, object]
    ) -> StepReply:
        """In the worker's admission window: bring the context there if needed, then generate."""
        traj = run.traj
        window = self._windows[name]
        await window.acquire(engine_priority(self.ordering.priority(traj)))
        try:
            traj.state = TrajectoryState.GENERATING
            client = self._clients[name]
            if run.resident != name:
                if run.resident is not None:
                    self._release_later(run.resident, traj.id)
                if run.tokens:  # the context is rebuilt here from the session's history
                    run.recomputes += 1
                    self._recomputes += 1
                    self.metrics.recomputes.labels(self.job).inc()
                run.resident = None
                if run.tokens:
                    await client.import_context(traj.id, run.tokens, warm=False)
            # A first step starts afresh ("reset"): a stale context of an earlier session goes.
            reset = run.resident != name and not run.tokens
            priority = engine_priority(self.ordering.priority(traj))
            previous = self._last_priority.get(traj.id)
            if previous is not None and priority < previous:
                self._promotions += 1  # re-prediction found it longer than thought: runs sooner
            self._last_priority[traj.id] = priority
            tools, tool_parser = run.episode.chat_tools()
            # The worker refuses a step naming other weights than it serves (421), so the
            # version named here is the one that produces the step's tokens.
            run.step_weight_version = self.weights.spec.version if self.weights.spec else None
            if self.drafts is not None:  # queues the texts this engine lacks; never waits
                self.drafts.before_step(run.task.id, name, traj.id)
            reply = await client.generate(
                traj.id,
                messages=run.pending,
                sampling=sampling,
                priority=priority,
                reset=reset,
                weight_version=run.step_weight_version,
                tools=tools,
                tool_parser=tool_parser,
            )
            run.resident = name
            traj.instance = name
            return reply
        finally:
            window.release()

    async def _route(self, run: TrajectoryRun) -> str:
        while True:
            view = self._view()
            if view is not None:
                self._worker_seen = time.monotonic()
                if self.policy.version_age and self.groups.kv_voided(run):
                    run.traj.instance = None  # a push dropped its KV: routed as a new one
                return self.placement.route(run.traj, view)
            if time.monotonic() - self._worker_seen > self.config.no_worker_timeout_s:
                raise HeddleError(
                    f"no worker of job {self.job} has been ready for "
                    f"{self.config.no_worker_timeout_s:.0f} s; unfinished trajectories stay "
                    "out of the output and run when the session starts again"
                )
            await asyncio.sleep(self.config.health_interval_s / 2)

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

    def _child(self, metric: Counter, *labels: str) -> Counter:
        child = self._children.get((metric, labels))
        if child is None:
            child = self._children[metric, labels] = metric.labels(*labels)
        return child

    def _predict(self, run: TrajectoryRun) -> None:
        if self.predictor is not None:
            self.predictor.update(run.traj)

    async def _finish(
        self,
        run: TrajectoryRun,
        status: TrajectoryStatus,
        reason: str,
        error: str | None = None,
        *,
        rejected: WorkerRejectedError | None = None,
    ) -> None:
        run.status, run.finish_reason, run.error = status, reason, error
        self._note_finish(rejected)
        run.finished_at = time.time()
        run.traj.state = TrajectoryState.FAILED if status == "failed" else TrajectoryState.DONE
        run.traj.predicted_remaining_tokens = 0.0
        if self.predictor is not None and status == "done":
            self.predictor.finish(run.traj)
        if self.drafts is not None:
            self.drafts.finished(run.task.id, run.traj.id, keep=status != "failed")
        if run.resident is not None:
            self._release_later(run.resident, run.traj.id)
            run.resident = None
        if status != "failed":
            await self._score(run)
        if run.status == "failed" and len(self._failures) < 10:
            self._failures.append(f"{run.task.id}#{run.sample}: {run.error}")
        self._write(run)

    async def _score(self, run: TrajectoryRun) -> None:
        """Ask the environment's reward for a score; a deadline mid-call still writes the run."""
        scorer = self.environment.reward
        if scorer is None:
            return
        run.scoring = True
        # The record as it will be written, less what the scorer is to fill.
        fill = ("reward", "reward_info", "reward_error")
        record = {k: v for k, v in self._record(run).items() if k not in fill}
        got = await scorer.score(record)
        run.scoring = False
        run.reward, run.reward_info, run.reward_error = got.reward, got.info, got.error
        self.metrics.reward_calls.labels(self.job, "ok" if got.error is None else "error").inc()
        self.metrics.reward_seconds.labels(self.job).observe(got.seconds)
        if got.error is not None and scorer.spec.on_error == "fail":
            run.status, run.finish_reason, run.error = (
                TrajectoryStatus.FAILED,
                "reward_failed",
                got.error,
            )
            run.traj.state = TrajectoryState.FAILED

    def _note_finish(self, rejected: WorkerRejectedError | None) -> None:
        """Give up when the first finishes were all rejected alike: the rest would be too."""
        streak = self._rejected_streak
        if streak is None:
            return
        if rejected is None or (streak and streak[0].status != rejected.status):
            self._rejected_streak = None  # something else finished: the job can work
            return
        streak.append(rejected)
        unfinished = any(r.status == "running" for r in self.runs.values())
        if len(streak) >= self.config.fail_fast_after and unfinished and not self._give_up.is_set():
            self._give_up_reason = HeddleError(
                f"job {self.job}: the first {len(streak)} trajectories to finish were all "
                f"rejected by the workers ({streak[0]}), so the rest would be too; fix the "
                "job and run it again (what finished stays in the output)"
            )
            self._give_up.set()

    async def _give_up_watch(self) -> None:
        await self._give_up.wait()
        assert self._give_up_reason is not None
        raise self._give_up_reason

    def _record(self, run: TrajectoryRun) -> OutputRecord:
        spec = self.weights.spec
        record = run.record(
            policy=self.policy.name,
            want_logprobs=self.sampling.logprobs,
            weight_version=spec.version if spec is not None else None,
        )
        episode = run.episode.episode_record()
        if episode is not None:
            record["episode"] = episode
        return record

    def _write(self, run: TrajectoryRun) -> None:
        if self.groups.holds and not self.groups.closed:
            return  # written when its group is taken (GroupStream.finished)
        self.groups.written(run, self._write_now(run))

    def _write_now(self, run: TrajectoryRun) -> OutputRecord:
        record = self._record(run)
        if self.sink.write(record):
            self._finished["failed" if run.status == "failed" else "done"] += 1
            if self.trace is not None:  # after the output: a trace line never lacks its record
                self.trace.write(run.trace_line(record))
        run.episode.finished(run.status, run.finish_reason)
        run.forget_history()
        return record

    def _release_later(self, worker: str, trajectory_id: str) -> None:
        client = self._clients.get(worker)
        if client is None or worker not in self._live:
            return

        async def release() -> None:
            with contextlib.suppress(WorkerUnavailableError, WorkerRejectedError):
                await client.release(trajectory_id)

        asyncio.get_running_loop().create_task(release())

    # -- workers ---------------------------------------------------------------------------
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

    # -- progress -------------------------------------------------------------------------
    def progress(self) -> Progress:
        counts = dict.fromkeys(("queued", "generating", "in_tool"), 0)
        remaining_tokens = 0.0
        for run in self.runs.values():
            if run.status != "running":
                continue
            traj = run.traj
            counts[traj.state.value] = counts.get(traj.state.value, 0) + 1
            # The prediction knows nothing of the job's caps; the ETA must not outrun them.
            budget = min(
                self.sampling.max_total_tokens - traj.generated_tokens,
                max(1, self.max_turns - traj.turns) * self.sampling.max_tokens_per_turn,
            )
            remaining_tokens += max(0.0, min(traj.predicted_remaining_tokens, budget))
        rate = self._rate.rate()
        unfinished = sum(counts.values())
        eta = None
        if unfinished == 0:
            eta = 0.0
        elif rate > 0 and remaining_tokens > 0:
            eta = remaining_tokens / rate
        return Progress(
            total=len(self.runs) + self._resumed,
            queued=counts["queued"],
            generating=counts["generating"],
            in_tool=counts["in_tool"],
            done=self._finished["done"] + self._resumed,
            failed=self._finished["failed"],
            resumed=self._resumed,
            malformed_tasks=self.malformed_tasks,
            tokens=self._tokens,
            tokens_per_s=rate,
            elapsed_s=time.monotonic() - self._started if self._started else 0.0,
            eta_s=eta,
        )

    def _publish(self, progress: Progress) -> None:
        self.metrics.publish(self.job, progress)
        if self.on_progress is not None:
            self.on_progress(progress)

    async def _progress_loop(self) -> None:
        while True:
            self._publish(self.progress())
            await asyncio.sleep(self.config.progress_interval_s)


def _prompt_estimate(messages: Sequence[Mapping[str, Any]]) -> int:
    """A prompt's tokens before it is tokenised: about four characters a token."""
    return max(1, sum(len(m.get("content") or "") // 4 for m in messages))


def step_seed(seed: int, task_index: int, sample: int, turn: int) -> int:
    """The seed of one step, derived from the job's; wrapped so it stays a valid seed."""
    return (seed + 1009 * task_index + 7 * sample + turn) % (SAMPLING_LIMITS.seed_max + 1)


def _retrieved(task: asyncio.Task[StepReply]) -> None:
    """Mark a step's outcome as seen: one whose trajectory was cancelled meanwhile is not wanted."""
    if not task.cancelled():
        task.exception()
