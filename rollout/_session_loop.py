"""A session's control loop: each trajectory's agent loop, and each step's way to a worker.

One asyncio task per trajectory runs step → environment → step, within the
in-flight cap, once its GRPO group may start. Before each step the predictor
re-ranks it (progressive priority goes to vLLM as the request priority) and
the placement policy picks a worker; a worker that does not hold the context
gets it by import (recompute from the session's token history). Every retry
of a step backs off (doubling); a step that keeps failing on ready workers
fails its trajectory, and so does a step the worker rejects (4xx: the request
is at fault). A step a worker refused or aborted because the session had it
load weights (503 during a push) is neither: it goes at once to a worker that
serves the weights, or waits until one does.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping

from heddle.exceptions import (
    HeddleError,
    StepFailedError,
    WorkerRejectedError,
    WorkerUnavailableError,
)
from heddle.scheduler import SAMPLING_LIMITS, TrajectoryState, engine_priority
from heddle.worker import StepReply

from ._environments import ParsedCalls
from ._output_record import TrajectoryStatus
from ._record import TrajectoryRun
from ._session_state import _prompt_estimate, log
from ._session_weights import SessionWeights

__all__ = ["SessionLoop", "step_seed"]


class SessionLoop(SessionWeights):
    """Trajectories' turns and their steps: routing, admission, retries."""

    _slots: asyncio.Semaphore | None
    _steps: int
    _recomputes: int
    _promotions: int
    _last_priority: dict[str, int]
    _worker_live: asyncio.Event  # set when a worker starts taking steps (its weights loaded)

    @property
    def steps(self) -> int:
        """LLM steps finished so far (a trainer pushing weights every N steps reads it)."""
        return self._steps

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
            pushes = self._pushes  # a push from here on may have the worker refuse the step
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
                if exc.status == 503 and (self._pushes != pushes or self.weights.loading(name)):
                    # This session had the worker load weights, so it refused or aborted the
                    # step for the load: not the step's failure, and no blind back-off. The
                    # worker left the view at the push, so the step goes to one that serves
                    # the new weights, or waits in _route until the first one does.
                    log.debug("%s: %s loads weights; step of %s goes on", self.job, name, traj.id)
                    continue
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
            # Until a worker takes steps again (a push's load ends): at once, not on a poll.
            self._worker_live.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._worker_live.wait(), self.config.health_interval_s / 2)


def step_seed(seed: int, task_index: int, sample: int, turn: int) -> int:
    """The seed of one step, derived from the job's; wrapped so it stays a valid seed."""
    return (seed + 1009 * task_index + 7 * sample + turn) % (SAMPLING_LIMITS.seed_max + 1)


def _retrieved(task: asyncio.Task[StepReply]) -> None:
    """Mark a step's outcome as seen: one whose trajectory was cancelled meanwhile is not wanted."""
    if not task.cancelled():
        task.exception()
