"""Heddle inside each trainer, at the trainer's own extension point (docs/trainers.md).

One module per trainer, each importing its trainer (so import only the one you
use): ``heddle.integrations.verl`` (an agent loop registered as ``heddle``),
``.slime`` (a rollout function and a weights hook), ``.skyrl`` (a generator),
``.openrlhf`` (an agent executor), ``.areal`` (a rollout workflow), ``.roll``
(an env manager). This front holds what they share and needs no trainer: the
settings, the runner that turns a batch into one RolloutJob through
:mod:`heddle.client`, each trainer's fields from a record, and the
:class:`WeightPusher` a weight hook pushes the trainer's state dict with.

>>> from heddle.integrations import HeddleSettings
>>> HeddleSettings(job="job.yaml", engine="sim").failed
'placeholder'
"""

from __future__ import annotations

from ._fields import (
    areal_fields,
    openrlhf_result,
    roll_fields,
    skyrl_output,
    skyrl_tasks,
    slime_fields,
    slime_task,
    verl_output_fields,
    verl_task,
)
from ._push import PushReport, WeightPusher
from ._rollouts import HeddleRollouts, SampleBatcher, plain, run_sync
from ._settings import ENV_PREFIX, WEIGHTS_SYNCS, HeddleSettings

__all__ = [
    "ENV_PREFIX",
    "WEIGHTS_SYNCS",
    "HeddleRollouts",
    "HeddleSettings",
    "PushReport",
    "SampleBatcher",
    "WeightPusher",
    "areal_fields",
    "openrlhf_result",
    "plain",
    "roll_fields",
    "run_sync",
    "skyrl_output",
    "skyrl_tasks",
    "slime_fields",
    "slime_task",
    "verl_output_fields",
    "verl_task",
]
