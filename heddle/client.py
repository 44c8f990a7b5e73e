"""A trainer's client: submit a RolloutJob, follow it, stream its records (docs/client.md).

>>> import asyncio
>>> from heddle.client import Rollout
>>> async def step():                                                  # doctest: +SKIP
...     rollout = await Rollout.submit_local("job.yaml", pool="pool.yaml", engine="sim")
...     async for group in rollout.groups():   # a task's samples, before the rollout ends
...         train_on(group.records)
...     return await rollout.wait()
>>> asyncio.run(step())                                                # doctest: +SKIP

``Rollout.submit_local`` runs the job on local workers exactly as ``heddle run``
does (in this process, or ``subprocess=True`` for a ``heddle run`` child);
``Rollout.submit_cluster`` creates it through the Kubernetes API, where the
operator runs it, and reads the output from a volume this process mounts.
"""

from __future__ import annotations

from heddle._rollout_client import Group, Rollout
from heddle._runs import ClusterAccess, RolloutProgress
from heddle._trainer_client import TrainerClient
from heddle.worker import WorkerEndpoint, changed_tensors, push_weights

__all__ = [
    "ClusterAccess",
    "Group",
    "Rollout",
    "RolloutProgress",
    "TrainerClient",
    "WorkerEndpoint",
    "changed_tensors",
    "push_weights",
]
