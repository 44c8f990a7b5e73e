"""The start-up decisions' simulations on worker processes (docs/simulator.md).

The shape planner and the co-location verdict (``plan_pool``, ``live_colocation``)
ask their questions in waves of independent simulations
(:mod:`heddle.scheduler.sim`'s ``MiniRunner``). Python runs one simulation per
process at a time, so :class:`ProcessRunner` runs a wave's on up to
``DECISION_WORKERS`` processes: the same answers, sooner. The simulator charges
Heddle's runs this way too (``PlannerCost.decision_workers``). Where worker
processes cannot start (no ``/dev/shm``, a process limit), it says so once and
runs the simulations in this process.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from types import TracebackType

from heddle.scheduler.sim import DECISION_WORKERS, MiniRun, Wave, run_mini, wave_workers

__all__ = ["CPUS_ENV", "ProcessRunner", "usable_cpus"]

log = logging.getLogger("heddle.run")

# The CPUs a session pod asked for (its container's requests.cpu, rounded up; the
# operator sets it through the downward API). Unset or 0: no such bound.
CPUS_ENV = "HEDDLE_CPUS"
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2: "QUOTA PERIOD" or "max PERIOD"


def usable_cpus(cgroup_cpu_max: Path = CGROUP_CPU_MAX) -> int:
    """CPUs this process may keep busy: those it may run on, bounded by its cgroup's CPU
    quota (a container's CPU limit) and by the CPUs its pod asked for (``CPUS_ENV``). A
    pod that asked for one CPU on a large node still sees every core; it gets its share
    of them only, so more processes than that would only take turns."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    try:
        quota, period = cgroup_cpu_max.read_text(encoding="ascii").split()[:2]
        if quota != "max":
            cpus = min(cpus, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):  # no cgroup v2 here, or a line that is not a quota
        pass
    asked = os.environ.get(CPUS_ENV, "").strip()
    if asked.isdigit() and int(asked) > 0:
        cpus = min(cpus, int(asked))
    return max(1, cpus)


class ProcessRunner:
    """Runs each wave of simulations on up to ``workers`` processes (default
    ``DECISION_WORKERS``, at most the usable CPUs), started at the first wave that pays
    for them (``wave_workers``) and stopped by :meth:`close` (a ``with`` block)."""

    def __init__(self, workers: int = DECISION_WORKERS) -> None:
        self.workers = max(1, min(workers, usable_cpus()))
        self._pool: ProcessPoolExecutor | None = None
        self._inline = self.workers == 1  # workers failed to start, or none to start
        self.used = 1  # the most processes a wave ran on (reports)

    def run_wave(self, runs: Sequence[MiniRun]) -> tuple[list[float], Wave]:
        workers = 1 if self._inline else wave_workers([len(r.scripts) for r in runs], self.workers)
        if workers > 1:
            try:
                results = list(self._started().map(run_mini, runs))
            except (OSError, BrokenProcessPool) as exc:
                log.warning(
                    "the decisions' worker processes failed (%s); running their "
                    "simulations in the session's process, one at a time",
                    exc,
                )
                self._inline = True
                self.close()
            else:
                self.used = max(self.used, workers)
                return [m for m, _ in results], Wave(tuple(e for _, e in results), workers)
        results = [run_mini(run) for run in runs]
        return [m for m, _ in results], Wave(tuple(e for _, e in results), 1)

    def _started(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # spawn, not fork: the session runs threads (its loop's to_thread calls),
            # whose held locks a forked child would inherit.
            context = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(self.workers, mp_context=context)
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> ProcessRunner:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()
