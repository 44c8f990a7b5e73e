"""The trainer's handle on one rollout (docs/client.md): submit, follow, stream, wait.

An asynchronous trainer starts on a GRPO group as soon as all its samples are
written, while the rest of the rollout still runs. The records come from the
output file as the session appends them (:class:`~._tail.RecordTail`); on a
cluster that file lies on a volume the trainer mounts too.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from heddle.api import load_manifests
from heddle.exceptions import ConfigError
from heddle.rollout import LocalJob, RecordTail, prepare_manifests, worker_options

from ._runs import ClusterAccess, ClusterRun, InProcessRun, RolloutProgress, Run, SubprocessRun

__all__ = ["Group", "Rollout"]

Manifest = Mapping[str, Any]
Source = str | Path | Manifest  # a YAML file, or one parsed manifest


@dataclass(frozen=True)
class Group:
    """All ``samplesPerTask`` records of one task (failed and truncated ones included)."""

    task_id: str
    records: list[dict[str, Any]]  # by sample


def _docs(source: Source, spec: Mapping[str, Any] | None) -> list[Manifest]:
    docs: list[Manifest] = (
        [source] if isinstance(source, Mapping) else list(load_manifests(Path(source)))
    )
    if not spec:
        return docs
    out: list[Manifest] = []
    for doc in docs:  # spec keys replace the RolloutJob's: one RL step's weights, output, ...
        if doc.get("kind") == "RolloutJob":
            changed = copy.deepcopy(dict(doc))
            changed["spec"] = {**(changed.get("spec") or {}), **spec}
            out.append(changed)
        else:
            out.append(doc)
    return out


def _prepare(
    job: Source, pool: Source | None, spec: Mapping[str, Any] | None, output: str | Path | None
) -> LocalJob:
    docs = _docs(job, spec)
    pool_docs = _docs(pool, None) if pool is not None else docs
    base = Path.cwd() if isinstance(job, Mapping) else Path(job).parent
    local = prepare_manifests(
        docs, pool_docs, base=base, sources=(_name(job, "job"), _name(pool or job, "pool"))
    )
    if output is not None:
        local.output = Path(output)
    return local


def _name(source: Source, what: str) -> str:
    return f"the {what} manifest" if isinstance(source, Mapping) else str(source)


class Rollout:
    """One submitted RolloutJob. Build it with :meth:`submit_local` or :meth:`submit_cluster`."""

    def __init__(self, run: Run, output: Path, samples_per_task: int, name: str) -> None:
        self.name = name
        self.output = output
        self.samples_per_task = samples_per_task
        self._run = run
        self._tail = RecordTail(output)
        self._groups: dict[str, dict[int, dict[str, Any]]] = {}

    @classmethod
    async def submit_local(
        cls,
        job: Source,
        *,
        pool: Source | None = None,
        engine: str = "vllm",
        spec: Mapping[str, Any] | None = None,
        output: str | Path | None = None,
        subprocess: bool = False,
        time_scale: float = 1.0,
    ) -> Rollout:
        """Run ``job`` on local workers, as ``heddle run`` does (in this process by default).

        ``spec`` replaces keys of the job's spec (``weights`` for this RL step, ``output``);
        relative paths resolve against the job file's folder (the working directory for a
        manifest given as a dict). Bad input raises a one-sentence ConfigError here,
        before any worker starts.
        """
        if engine not in ("vllm", "sim"):
            raise ConfigError(f"engine {engine!r} is not one of vllm, sim")
        local = _prepare(job, pool, spec, output)
        samples = local.job.samples_per_task
        if not subprocess:
            run: Run = InProcessRun(local, worker_options(local, engine, time_scale=time_scale))
        else:
            run = await SubprocessRun.start(
                _run_args(job, pool, spec, engine, time_scale, local),
                len(local.tasks.tasks) * samples,
                local.output,
                local.output.parent / "logs" / f"{local.job.name}.heddle-run.log",
            )
        return cls(run, local.output, samples, local.job.name)

    @classmethod
    async def submit_cluster(
        cls,
        job: Manifest,
        *,
        access: ClusterAccess | None = None,
        output: str | Path | None = None,
        data_root: str | Path = "/data",
        namespace: str | None = None,
    ) -> Rollout:
        """Create ``job`` through the Kubernetes API; the operator runs it.

        ``access`` is the API server and its credentials; None: the pod's service account,
        else the kubeconfig (``KUBECONFIG`` or ``~/.kube/config``), as kubectl finds them.
        ``output`` is where this process sees the job's output file (the volume the
        session pod writes to, mounted here); by default ``spec.output.path`` under
        ``data_root``, as the operator resolves it.
        """
        spec = job.get("spec") or {}
        name = (job.get("metadata") or {}).get("name")
        if not isinstance(name, str) or not isinstance((spec.get("output") or {}).get("path"), str):
            raise ConfigError("the RolloutJob needs metadata.name and spec.output.path")
        ns = namespace or (job.get("metadata") or {}).get("namespace") or "default"
        path = Path(output) if output is not None else Path(data_root) / spec["output"]["path"]
        run = await ClusterRun.create(access, ns, job)
        return cls(run, path, int(spec.get("samplesPerTask") or 1), name)

    async def progress(self) -> RolloutProgress:
        """The phase and counts now."""
        p = await self._run.poll()
        if isinstance(self._run, SubprocessRun):
            self._run.written = max(self._run.written, self._tail.count)
        return p

    async def records(self, poll_s: float = 0.2) -> AsyncIterator[dict[str, Any]]:
        """Each record once, as soon as its whole line is in the output; ends with the run.

        Records already yielded (by this or an earlier call) are not yielded again.
        A run that failed as a whole raises RolloutFailedError after its last record.
        """
        while True:
            finished = (await self._run.poll()).finished  # before reading: nothing is missed
            for record in self._tail.read():
                if isinstance(self._run, SubprocessRun):
                    self._run.written = self._tail.count
                yield record
            if finished:
                break
            await asyncio.sleep(poll_s)
        await self.wait()

    async def groups(self, poll_s: float = 0.2) -> AsyncIterator[Group]:
        """Each task's records once all ``samplesPerTask`` of them are written."""
        async for record in self.records(poll_s):
            task_id = str(record["task_id"])
            group = self._groups.setdefault(task_id, {})
            group[int(record["sample"])] = record
            if len(group) == self.samples_per_task:
                del self._groups[task_id]
                yield Group(task_id, [group[s] for s in sorted(group)])

    async def wait(self) -> dict[str, Any]:
        """The run's end: the summary (local) or the RolloutJob's status (cluster)."""
        return await self._run.finish()


def _run_args(
    job: Source,
    pool: Source | None,
    spec: Mapping[str, Any] | None,
    engine: str,
    time_scale: float,
    local: LocalJob,
) -> list[str]:
    """``heddle run``'s arguments: the child reads the same files the parent checked."""
    if isinstance(job, Mapping) or isinstance(pool, Mapping) or set(spec or ()) - {"output"}:
        raise ConfigError(
            "subprocess=True runs `heddle run` on files: give the job and pool as YAML paths "
            "(spec may override only output, through output=)"
        )
    args: Sequence[str] = [str(job), "--engine", engine, "--quiet", "--output", str(local.output)]
    if pool is not None:
        args = [*args, "--pool", str(pool)]
    return [*args, "--time-scale", str(time_scale)]
