"""OpenRLHF: an ``AgentExecutor`` for ``--agent_func_path`` (docs/trainers.md#openrlhf).

OpenRLHF calls ``execute(prompt, label, sampling_params, max_length,
hf_tokenizer, llm_engine, images=None)`` once per sample
(``openrlhf/utils/agent.py``, OpenRLHF/OpenRLHF@3c3be62) and builds an
``Experience`` from ``observation_tokens``, ``action_ranges`` and
``rollout_log_probs`` (one per observation token; it drops the first itself:
``samples_generator.py``, ``_process_response_into_experience``). The samples
of a batch meet in one RolloutJob, grouped by prompt. An agent file holds::

    from heddle.integrations.openrlhf import AgentExecutor
"""

from __future__ import annotations

from typing import Any

from openrlhf.utils.agent import AgentExecutorBase

from ._fields import openrlhf_result
from ._settings import HeddleSettings
from ._shared import batcher_for

__all__ = ["AgentExecutor"]


class AgentExecutor(AgentExecutorBase):  # type: ignore[misc]
    def __init__(self, settings: HeddleSettings | None = None, **given: Any) -> None:
        self.heddle = settings or HeddleSettings.from_env(**given)

    async def execute(
        self,
        prompt: Any,
        label: Any,
        sampling_params: Any,
        max_length: int,
        hf_tokenizer: Any,
        llm_engine: Any,
        images: Any = None,
    ) -> dict[str, Any]:
        task: dict[str, Any] = {"prompt": prompt}
        if label is not None:
            task["label"] = label
        record = await batcher_for(self.heddle).submit(task, group=str(prompt))
        return openrlhf_result(record, prompt, label)
