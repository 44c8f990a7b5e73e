"""A trainer's batch as one RolloutJob, and its records back one per row, in order.

Every adapter is this plus its trainer's field names: :class:`HeddleRollouts`
runs a whole batch (SkyRL's generator, slime's rollout function get one);
:class:`SampleBatcher` gathers the one-sample calls of verl's agent loops,
OpenRLHF's executor, AReaL's workflow and ROLL's env managers for a short
window and runs them as one job, so Heddle still schedules the whole batch and
co-locates each group's samples. Both go through :mod:`heddle.client` only.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import os
import threading
import uuid
from collections.abc import Coroutine, Hashable, Mapping, Sequence
from concurrent.futures import Future as ThreadFuture
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from heddle.client import ClusterAccess, Rollout
from heddle.exceptions import ConfigError, OutputError
from heddle.export import order_rows

from ._settings import HeddleSettings

__all__ = [
    "HeddleRollouts",
    "SampleBatcher",
    "plain",
    "run_sync",
    "weights_file",
]

Record = dict[str, Any]
T = TypeVar("T")
_WEIGHTS_FILE = "weights.json"  # a trainer's post-write hook names the new checkpoint here


def plain(value: Any) -> Any:
    """JSON-ready copies of a trainer's row: numpy scalars and arrays, tuples, sets."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [plain(v) for v in value]
    tolist = getattr(value, "tolist", None)  # numpy arrays and scalars, torch tensors
    if callable(tolist):
        return plain(tolist())
    return value


def weights_file(settings: HeddleSettings) -> Path:
    return Path(settings.work_dir) / _WEIGHTS_FILE


class HeddleRollouts:
    """Runs batches under ``settings``; each :meth:`run` is one RolloutJob."""

    def __init__(self, settings: HeddleSettings, access: ClusterAccess | None = None) -> None:
        self.settings = settings
        self.access = access
        self._count = itertools.count()
        self._weights: tuple[str, str] | None = None

    def set_weights(self, path: str, version: str) -> None:
        """Run the next batches on this checkpoint (the job's ``spec.weights``)."""
        self._weights = (str(path), str(version))

    def publish_weights(self, path: str, version: str) -> None:
        """Name a new checkpoint for every process that runs batches under these settings
        (a trainer's weight hook runs in another process than its rollout function)."""
        target = weights_file(self.settings)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"path": str(path), "version": str(version)}))
        tmp.replace(target)  # whole or not at all
        self.set_weights(path, version)

    def _current_weights(self) -> tuple[str, str] | None:
        published = weights_file(self.settings)
        if published.exists():
            got = json.loads(published.read_text())
            return str(got["path"]), str(got["version"])
        return self._weights

    def _spec(self, tasks: Sequence[Mapping[str, Any]], samples: int, output: str) -> Record:
        entries = []
        for i, task in enumerate(tasks):
            entry = plain(task)
            entry["id"] = f"{i:06d}"  # the batch position: unique, and sorts as the batch
            entries.append(entry)
        spec: Record = {
            "tasks": {"inline": entries},
            "samplesPerTask": samples,
            "output": {"path": output},
        }
        weights = self._current_weights()
        if weights is not None:
            spec["weights"] = {"path": weights[0], "version": weights[1]}
        return spec

    async def run(self, tasks: Sequence[Mapping[str, Any]], samples: int) -> list[Record]:
        """One record per (task, sample), tasks in the given order, samples 0..n-1 each;
        a failed or missing trajectory is a placeholder unless ``settings.failed`` drops it."""
        if not tasks:
            return []
        if samples < 1:
            raise ConfigError(f"samples per task must be 1 or more, not {samples}")
        name = f"{next(self._count):05d}-{uuid.uuid4().hex[:8]}"
        if self.settings.mode == "local":
            output = Path(self.settings.work_dir).resolve() / f"batch-{name}.jsonl"
            rollout = await Rollout.submit_local(
                self.settings.job,
                pool=self.settings.pool,
                engine=self.settings.engine,
                spec=self._spec(tasks, samples, str(output)),
                time_scale=self.settings.time_scale,
            )
        else:
            manifest = self._cluster_manifest(tasks, samples, name)
            rollout = await Rollout.submit_cluster(
                manifest,
                access=self.access,
                data_root=self.settings.data_root,
                namespace=self.settings.namespace,
            )
        records = [record async for record in rollout.records(poll_s=0.1)]
        ids = [f"{i:06d}" for i in range(len(tasks))]
        return order_rows(records, failed=self.settings.failed, tasks=ids, samples=samples)

    def _cluster_manifest(
        self, tasks: Sequence[Mapping[str, Any]], samples: int, name: str
    ) -> Record:
        docs = list(yaml.safe_load_all(Path(self.settings.job).read_text(encoding="utf-8")))
        jobs = [d for d in docs if isinstance(d, dict) and d.get("kind") == "RolloutJob"]
        if len(jobs) != 1:
            raise ConfigError(f"{self.settings.job} must hold exactly one RolloutJob")
        job = copy.deepcopy(jobs[0])
        metadata = job.setdefault("metadata", {})
        base = str(metadata.get("name") or "heddle")[:40]
        metadata["name"] = f"{base}-{name}"
        job["spec"] = {
            **(job.get("spec") or {}),
            **self._spec(tasks, samples, f"heddle-rollouts/{metadata['name']}.jsonl"),
        }
        return job


@dataclass
class _Call:
    task: Mapping[str, Any]
    group: Hashable | None
    future: asyncio.Future[Record]


class SampleBatcher:
    """Gathers one-sample calls for ``settings.batch_window_s`` and runs them as one job.

    Calls that share a ``group`` (verl's ``uid``, the same prompt object in AReaL, the
    same prompt text in OpenRLHF) are one task's samples when every group in the
    window has the same size; otherwise each call is a task of its own (one sample).
    """

    def __init__(self, rollouts: HeddleRollouts) -> None:
        self.rollouts = rollouts
        self._pending: list[_Call] = []
        self._timer: asyncio.TimerHandle | None = None
        self._running: set[asyncio.Task[None]] = set()

    async def submit(self, task: Mapping[str, Any], group: Hashable | None = None) -> Record:
        loop = asyncio.get_running_loop()
        call = _Call(task, group, loop.create_future())
        self._pending.append(call)
        if self._timer is None:
            self._timer = loop.call_later(self.rollouts.settings.batch_window_s, self._flush)
        return await call.future

    def _flush(self) -> None:
        calls, self._pending, self._timer = self._pending, [], None
        job = asyncio.get_running_loop().create_task(self._run(calls))
        self._running.add(job)  # keep a reference until it ends
        job.add_done_callback(self._running.discard)

    async def _run(self, calls: list[_Call]) -> None:
        groups: dict[Hashable, list[_Call]] = {}
        for n, call in enumerate(calls):
            groups.setdefault(call.group if call.group is not None else ("call", n), []).append(
                call
            )
        sizes = {len(g) for g in groups.values()}
        try:
            if len(sizes) == 1:
                size = sizes.pop()
                members = list(groups.values())
                records = _by_key(await self.rollouts.run([g[0].task for g in members], size))
                for i, group in enumerate(members):  # group i's k-th call is task i's sample k
                    for k, call in enumerate(group):
                        _resolve(call, records.get((f"{i:06d}", k)))
            else:
                records = _by_key(await self.rollouts.run([c.task for c in calls], 1))
                for i, call in enumerate(calls):
                    _resolve(call, records.get((f"{i:06d}", 0)))
        except Exception as exc:  # every caller hears why its batch failed
            for call in calls:
                if not call.future.done():
                    call.future.set_exception(exc)


def _by_key(records: list[Record]) -> dict[tuple[str, int], Record]:
    return {(str(r["task_id"]), int(r["sample"])): r for r in records}


def _resolve(call: _Call, record: Record | None) -> None:
    if call.future.done():
        return
    if record is not None:
        call.future.set_result(record)
    else:  # failed="drop" took its row out
        call.future.set_exception(
            OutputError("its trajectory failed and the setting failed=drop left it out")
        )


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` from synchronous trainer code (slime's rollout function, ROLL's env
    managers), on a loop of its own when the caller's thread already runs one."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    done: ThreadFuture[T] = ThreadFuture()

    def target() -> None:
        try:
            done.set_result(asyncio.run(coro))
        except BaseException as exc:  # handed to the caller's thread
            done.set_exception(exc)

    threading.Thread(target=target, daemon=True).start()
    return done.result()
