"""A session's progress: counts by state, tokens/s and an ETA within the job's caps.

Published as Prometheus metrics and to ``on_progress`` every
``progress_interval_s``, and once more at the end of the run.
"""

from __future__ import annotations

import asyncio
import time

from ._progress import Progress
from ._session_state import SessionState

__all__ = ["SessionProgress"]


class SessionProgress(SessionState):
    """Progress from the trajectories' states and the session's counts."""

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
