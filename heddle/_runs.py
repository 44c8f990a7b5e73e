"""Where a trainer's rollout runs: in this process, in a ``heddle run`` child, or on a cluster.

Each run answers :meth:`poll` with a :class:`RolloutProgress` and :meth:`finish`
with its result, or raises :class:`~heddle.exceptions.RolloutFailedError`.
The local runs go through :func:`~heddle.rollout._run.run_local`, the path
``heddle run`` takes; the cluster run creates the RolloutJob and reads its
status, which the operator keeps (docs/resources.md).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from heddle.exceptions import OutputError, RolloutFailedError
from heddle.rollout import (
    DecisionCache,
    LocalJob,
    LocalWorkerOptions,
    PreviousRollouts,
    Progress,
    run_local,
)

if TYPE_CHECKING:  # the Kubernetes client (and kopf) load only when a cluster run starts
    from heddle.operator import KubeClient

__all__ = ["ClusterAccess", "ClusterRun", "InProcessRun", "RolloutProgress", "Run", "SubprocessRun"]

TERMINAL = ("Succeeded", "Failed")


@dataclass(frozen=True)
class RolloutProgress:
    """Where a rollout stands; the counts of a RolloutJob's status."""

    phase: str  # Pending, Queued, Running, Succeeded, Failed
    total: int
    done: int  # includes truncated trajectories and those already in the output
    failed: int
    tokens: int = 0

    @property
    def finished(self) -> bool:
        return self.phase in TERMINAL


@dataclass(frozen=True)
class ClusterAccess:
    """An API server and its credentials (the attributes the operator's client reads)."""

    server: str
    token: str | None = None
    ca_path: str | None = None
    insecure: bool = False


class Run(Protocol):
    async def poll(self) -> RolloutProgress: ...

    async def finish(self) -> dict[str, Any]: ...


def _from_session(p: Progress, phase: str) -> RolloutProgress:
    return RolloutProgress(phase, p.total, p.done, p.failed, p.tokens)


class InProcessRun:
    """``run_local`` as a task on the caller's event loop."""

    def __init__(self, local: LocalJob, options: LocalWorkerOptions) -> None:
        self._total = len(local.tasks.tasks) * local.job.samples_per_task
        self._last: Progress | None = None
        # As `heddle run` (the pool's previous rollout, decisions kept by their inputs), and
        # the next iteration's decisions taken while the trainer trains (ahead=True).
        run = run_local(local, options, on_progress=self._progress, decisions=DecisionCache(),
                        history=PreviousRollouts(), ahead=True)  # fmt: skip
        self._task = asyncio.create_task(run)

    def _progress(self, p: Progress) -> None:
        self._last = p

    async def poll(self) -> RolloutProgress:
        if not self._task.done():
            if self._last is None:
                return RolloutProgress("Pending", self._total, 0, 0)
            return _from_session(self._last, "Running")
        if self._task.cancelled() or self._task.exception() is not None:
            last = self._last
            return RolloutProgress(
                "Failed", self._total, last.done if last else 0, last.failed if last else 0
            )
        _, result = self._task.result()
        return _from_session(result.progress, "Succeeded")

    async def finish(self) -> dict[str, Any]:
        summary, _ = await self._task  # the run's own error, one sentence, propagates
        return summary


class SubprocessRun:
    """``heddle run`` in a child process; progress counts the records it has written."""

    def __init__(self, process: asyncio.subprocess.Process, total: int, output: Path, log: Path):
        self._process = process
        self._total = total
        self._output = output
        self._log = log
        self.written = 0  # set by the caller's tail: the child reports nothing else

    @classmethod
    async def start(cls, args: list[str], total: int, output: Path, log: Path) -> SubprocessRun:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("wb") as sink:  # the child holds its own descriptor
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "heddle", "run", *args, stdout=sink, stderr=sink
            )
        return cls(process, total, output, log)

    async def poll(self) -> RolloutProgress:
        code = self._process.returncode
        # heddle run exits 1 when a trajectory failed: the rollout itself finished.
        phase = "Running" if code is None else ("Succeeded" if code in (0, 1) else "Failed")
        return RolloutProgress(phase, self._total, self.written, 0)

    async def finish(self) -> dict[str, Any]:
        code = await self._process.wait()
        if code not in (0, 1):
            lines = self._log.read_text(encoding="utf-8", errors="replace").strip().splitlines()
            cause = lines[-1] if lines else "no output"
            raise RolloutFailedError(
                f"heddle run exited with status {code}: {cause} (log: {self._log})"
            )
        summary = self._output.with_name(self._output.name + ".summary.json")
        try:
            data: dict[str, Any] = json.loads(summary.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise OutputError(f"cannot read the run's summary {summary}: {exc}") from None
        return data


class ClusterRun:
    """A RolloutJob the operator runs; its status is the progress."""

    def __init__(self, client: KubeClient, namespace: str, name: str) -> None:
        self._client = client
        self.namespace = namespace
        self.name = name
        self._status: Mapping[str, Any] = {}
        self._final: RolloutProgress | None = None

    @classmethod
    async def create(
        cls, access: ClusterAccess | None, namespace: str, manifest: Mapping[str, Any]
    ) -> ClusterRun:
        from heddle.operator import ROLLOUTJOBS, KubeClient  # noqa: PLC0415  (loads kopf)

        # No access given: the service account in a pod, else the kubeconfig, as kubectl.
        client = await asyncio.to_thread(KubeClient, access)
        try:
            await client.create(ROLLOUTJOBS, namespace, manifest)
        except BaseException:
            await client.aclose()
            raise
        return cls(client, namespace, str(manifest["metadata"]["name"]))

    async def poll(self) -> RolloutProgress:
        if self._final is not None:
            return self._final
        from heddle.operator import ROLLOUTJOBS  # noqa: PLC0415

        obj = await self._client.get(ROLLOUTJOBS, self.namespace, self.name)
        if obj is None:
            raise RolloutFailedError(
                f"RolloutJob {self.namespace}/{self.name} was deleted before it finished"
            )
        s = self._status = obj.get("status") or {}
        progress = RolloutProgress(
            str(s.get("phase") or "Pending"),
            int(s.get("total") or 0),
            int(s.get("done") or 0),
            int(s.get("failed") or 0),
            int(s.get("tokens") or 0),
        )
        if progress.finished:
            self._final = progress  # a finished job's status no longer changes
            await self._client.aclose()
        return progress

    async def finish(self) -> dict[str, Any]:
        while not (await self.poll()).finished:
            await asyncio.sleep(1.0)
        status = dict(self._status)
        if status.get("phase") == "Failed":
            failed = [c for c in status.get("conditions") or [] if c.get("type") == "Failed"]
            cause = failed[0].get("message", "no message") if failed else "no Failed condition"
            raise RolloutFailedError(f"RolloutJob {self.namespace}/{self.name} failed: {cause}")
        return status
