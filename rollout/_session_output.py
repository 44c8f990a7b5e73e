"""How a session's trajectory ends: its status, its score, and its one record in the output.

A finished trajectory releases its context, is scored by the environment's
reward and goes to the output sink (and the token trace) at once, unless its
GRPO group is held for a trainer (``_groups.GroupStream``); a restarted
session skips what is written. When the first finishes are all rejections by
the workers alike, the session stops with the error instead of grinding
through the rest. At the deadline what is unfinished is written truncated.
"""

from __future__ import annotations

import asyncio
import time

from heddle.exceptions import HeddleError, WorkerRejectedError
from heddle.scheduler import TrajectoryState

from ._environments import Outcome
from ._output_record import OutputRecord, TrajectoryStatus
from ._record import TrajectoryRun
from ._session_workers import SessionWorkers

__all__ = ["SessionOutput"]


class SessionOutput(SessionWorkers):
    """Finishing, scoring and writing trajectories; the fail-fast watch."""

    _failures: list[str]
    _rejected_streak: list[WorkerRejectedError] | None
    _give_up: asyncio.Event
    _give_up_reason: HeddleError | None

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

    async def _finish_with(self, run: TrajectoryRun, outcome: Outcome) -> None:
        """End the trajectory as the environment's ``outcome`` says."""
        if outcome.reward is not None or outcome.reward_info is not None:
            run.reward, run.reward_info = outcome.reward, outcome.reward_info
        status = outcome.status or (
            TrajectoryStatus.FAILED if outcome.finish_reason == "failed" else TrajectoryStatus.DONE
        )
        await self._finish(run, status, outcome.finish_reason, outcome.error)

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
