"""verl: an agent loop registered as ``heddle`` (docs/trainers.md#verl).

verl's ``AgentLoopWorker.generate_sequences`` makes one ``AgentLoopBase`` per
sample and awaits ``run(sampling_params, **row)`` for each; this loop hands the
row to Heddle (the samples of one batch meet in one RolloutJob, grouped by
``uid``) and returns its trajectory as an ``AgentLoopOutput``
(``verl/experimental/agent_loop/agent_loop.py``, volcengine/verl@b178a3c).
Register it through ``actor_rollout_ref.rollout.agent.agent_loop_config_path``::

    - name: heddle
      _target_: heddle.integrations.verl.HeddleAgentLoop
      job: heddle/job.yaml
"""

from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)

from ._fields import verl_output_fields, verl_task
from ._settings import setting_names
from ._shared import batcher_for, settings_from

__all__ = ["HeddleAgentLoop"]


@register("heddle")
class HeddleAgentLoop(AgentLoopBase):  # type: ignore[misc]
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        names = setting_names()  # hydra passes the registry entry's other keys here
        given = {k: kwargs.pop(k) for k in list(kwargs) if k in names}
        super().__init__(*args, **kwargs)
        self.heddle = settings_from(given)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        record = await batcher_for(self.heddle).submit(verl_task(kwargs), kwargs.get("uid"))
        fields = verl_output_fields(record)
        metrics = AgentLoopMetrics(
            generate_sequences=fields.pop("generate_s"), tool_calls=fields.pop("tool_s")
        )
        return AgentLoopOutput(metrics=metrics, **fields)
