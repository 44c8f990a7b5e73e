"""ROLL: an env manager whose episodes run on Heddle (docs/trainers.md#roll).

ROLL's agentic pipeline runs one env manager per environment, each looping in
``run_rollout_loop(data)`` until told to stop and putting one ``DataProto`` per
episode on its ``GroupQueueManager`` (``roll/pipeline/agentic/env_manager/
traj_env_manager.py``, alibaba/ROLL@8eb27cc). This one takes the episode's
first observation from its ``gem`` environment (``env.reset(seed)``, seeded per
group as ROLL does, so a group's environments share it), runs the episode as a
Heddle trajectory (turns, tools and reward from the Heddle job) and emits the
fields ``formulate_rollouts`` does: ``input_ids``, ``attention_mask``,
``position_ids``, ``response_mask``, ``prompt_mask``, ``scores``,
``infer_logprobs`` (shifted by one), padded to ``sequence_length``, and
``env_ids``, ``group_ids``, ``tags``, ``step_scores``, ``episode_scores``,
``traj_group_id``, ``traj_id``. Name it in an env manager's config as
``env_manager_cls: heddle.integrations.roll.HeddleEnvManager``.
"""

from __future__ import annotations

from typing import Any

import gem
import numpy as np
import ray
import torch
from roll.distributed.scheduler.protocol import DataProto
from roll.pipeline.agentic.env_manager.base_env_manager import BaseEnvManager
from tensordict import TensorDict

from ._fields import roll_fields
from ._settings import HeddleSettings
from ._shared import submit_from_thread

__all__ = ["HeddleEnvManager", "roll_data_proto"]

_PADS = {  # tensor -> (dtype, pad value; None: the tokenizer's pad id)
    "input_ids": (torch.long, None),
    "attention_mask": (torch.long, 0),
    "position_ids": (torch.long, 0),
    "response_mask": (torch.bool, 0),
    "prompt_mask": (torch.bool, 0),
    "scores": (torch.float, 0),
    "infer_logprobs": (torch.float, 0),
}


def roll_data_proto(record: dict[str, Any], sequence_length: int, pad_token_id: int) -> Any:
    fields = roll_fields(record)
    tensors = {}
    for name, values in fields["batch"].items():
        dtype, pad = _PADS[name]
        row = list(values)[:sequence_length]
        fill = pad_token_id if pad is None else pad
        tensors[name] = torch.tensor([row + [fill] * (sequence_length - len(row))], dtype=dtype)
    proto = DataProto()
    proto.batch = TensorDict(tensors, batch_size=1)
    proto.non_tensor_batch.update(
        {k: np.array([v], dtype=object) for k, v in fields["non_tensor_batch"].items()}
    )
    return proto


class HeddleEnvManager(BaseEnvManager):  # type: ignore[misc]
    def __init__(
        self,
        worker_config: Any,
        pipeline_config: Any,
        env_config: Any,
        tokenizer: Any,
        generate_scheduler: Any,
        output_queue: Any,
        thread_lock: Any,
        mode: str = "train",
        *args: Any,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        self.pipeline_config, self.env_config = pipeline_config, env_config
        self.tokenizer, self.output_queue, self.mode = tokenizer, output_queue, mode
        self.env = gem.make(env_id=env_config["env_type"], **env_config["config"])
        self.template = pipeline_config.custom_envs[env_config["tag"]]
        self.heddle = HeddleSettings.from_env(**dict(env_config.get("heddle") or {}))

    def run_rollout_loop(self, data: Any) -> None:
        self.running = True
        group, env = self.env_config["group_id"], self.env_config["env_id"]
        group_seed = data.meta_info["seed"] + self.env_config["group_seed"]
        episode = None
        while self.running:
            start_step = self.current_step
            episode = ray.get(self.output_queue.get_episode_id.remote(group, env))
            if episode is None:
                break
            observation, _ = self.env.reset(seed=group_seed + episode)
            if observation is None:
                break
            task = {
                "system": self.template["agent_system_template"],
                "prompt": str(observation),
                "metadata": {"tag": self.env_config["tag"]},
            }
            key = (self.env_config["tag"], group, episode, group_seed)
            record = submit_from_thread(self.heddle, task, group=key)
            proto = roll_data_proto(
                record, self.pipeline_config.sequence_length, self.tokenizer.pad_token_id
            )
            proto.non_tensor_batch["env_ids"] = np.array([env], dtype=object)
            proto.non_tensor_batch["group_ids"] = np.array([group], dtype=object)
            ray.get(self.output_queue.put.remote(group, episode, start_step, proto, env))
        ray.get(self.output_queue.put.remote(group, episode, self.current_step, None, env))
