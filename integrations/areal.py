"""AReaL: a ``RolloutWorkflow`` whose ``arun_episode`` runs on Heddle
(docs/trainers.md#areal).

``arun_episode(engine, data)`` returns one trajectory as ``[1, seq_len]``
tensors: ``input_ids``, ``attention_mask``, ``loss_mask``, ``logprobs``,
``versions`` (the weight version per token, -1 on the prompt) and ``rewards``
(``areal/api/workflow_api.py``; the fields in
``docs/en/reference/rollout_workflow.md``, inclusionAI/AReaL@4aef98d). AReaL's
``GroupedRolloutWorkflow`` calls it ``group_size`` times with the same ``data``:
those calls are one task's samples in one RolloutJob. A failed trajectory comes
back as its placeholder (``loss_mask`` all zero), not ``None``, so the group
stays whole.
"""

from __future__ import annotations

from typing import Any

import torch
from areal.api.workflow_api import RolloutWorkflow

from ._fields import areal_fields
from ._settings import HeddleSettings
from ._shared import batcher_for

__all__ = ["HeddleWorkflow"]

_DTYPES = {
    "input_ids": torch.int32,
    "attention_mask": torch.bool,
    "loss_mask": torch.int32,
    "logprobs": torch.float32,
    "versions": torch.int32,
}


class HeddleWorkflow(RolloutWorkflow):  # type: ignore[misc]
    def __init__(self, settings: HeddleSettings | None = None, **given: Any) -> None:
        self.heddle = settings or HeddleSettings.from_env(**given)

    async def arun_episode(self, engine: Any, data: dict[str, Any]) -> dict[str, Any]:
        task = {k: v for k, v in data.items() if k in ("messages", "prompt", "metadata")}
        task.setdefault("metadata", {})
        for key in ("answer", "solution"):  # the reward's ground truth, as AReaL's data names it
            if key in data:
                task["metadata"] = {**task["metadata"], key: data[key]}
        record = await batcher_for(self.heddle).submit(task, group=id(data))
        fields = areal_fields(record)
        out = {k: torch.tensor([fields[k]], dtype=dtype) for k, dtype in _DTYPES.items()}
        out["rewards"] = torch.tensor([fields["rewards"]], dtype=torch.float32)
        return out
