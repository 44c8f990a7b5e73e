"""SkyRL: a ``GeneratorInterface`` to return from ``BasePPOExp.get_generator``
(docs/trainers.md#skyrl).

SkyRL hands the generator a whole ``GeneratorInput`` (every prompt already
repeated per sample, with ``trajectory_ids``) and requires the output "in the
same order as the input batch" (``skyrl/train/generators/base.py``,
NovaSky-AI/SkyRL@a956457); ``validate_generator_output``
(``skyrl/train/utils/trainer_utils.py``) checks one row per prompt. The batch
is one RolloutJob: an instance's repetitions are one task's samples.
"""

from __future__ import annotations

from typing import Any

from skyrl.train.generators.base import GeneratorInterface

from ._fields import skyrl_output, skyrl_tasks
from ._settings import HeddleSettings
from ._shared import rollouts_for

__all__ = ["HeddleGenerator"]


class HeddleGenerator(GeneratorInterface):  # type: ignore[misc]
    def __init__(self, settings: HeddleSettings | None = None, **given: Any) -> None:
        self.heddle = settings or HeddleSettings.from_env(**given)

    async def generate(self, input_batch: Any) -> Any:
        prompts = input_batch["prompts"]
        extras = input_batch.get("env_extras")
        ids = input_batch.get("trajectory_ids")
        rollouts = rollouts_for(self.heddle)
        grouped = skyrl_tasks(prompts, extras, ids)
        if grouped is not None:
            tasks, samples, slots = grouped
            by_key = {(r["task_id"], r["sample"]): r for r in await rollouts.run(tasks, samples)}
            records = [by_key[(f"{t:06d}", s)] for t, s in slots]
        else:  # no ids, or uneven groups: each row is a task of its own
            tasks = [
                {"prompt": p, **(dict(extras[i]) if extras else {})} for i, p in enumerate(prompts)
            ]
            records = await rollouts.run(tasks, 1)
        out = skyrl_output(records)
        out["trajectory_ids"] = ids
        return out
