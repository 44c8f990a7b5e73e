"""The adapters on the trainers' own classes, where the trainer imports here.

None of the six trainers is a dependency of Heddle (docs/trainers.md, "What is
tested where"): each test is skipped unless its trainer imports. Where one does,
the adapter subclasses the real base class, runs a batch on sim workers through
heddle.client, and its output goes through the trainer's own post-processing:
OpenRLHF's ``_process_response_into_experience``, AReaL's ``concat_padded_tensors``,
verl's ``AgentLoopOutput`` validation and ``DataProto``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from .test_rollouts_sim import FAILING, PROMPTS, _settings, reward_url  # noqa: F401

pytestmark = pytest.mark.slow  # worker processes (sim engine)


def test_openrlhf_executor_output_goes_through_its_experience_maker(
    tmp_path: Path,
    reward_url: str,  # noqa: F811
) -> None:
    pytest.importorskip("openrlhf.trainer.ppo_utils.samples_generator")
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator
    from openrlhf.utils.agent import AgentExecutorBase

    from heddle.integrations.openrlhf import AgentExecutor

    executor = AgentExecutor(_settings(tmp_path, reward_url, batch_window_s=0.2))
    assert isinstance(executor, AgentExecutorBase)
    prompts = ["question 0", "question 1"]

    async def main() -> list[dict[str, Any]]:
        calls = [executor.execute(prompts[i // 2], None, None, 2048, None, None) for i in range(4)]
        return list(await asyncio.gather(*calls))

    results = asyncio.run(main())
    for i, result in enumerate(results):
        exp = SamplesGenerator._process_response_into_experience(None, result, max_len=2048)
        n = len(result["observation_tokens"])
        assert exp.sequences.shape == (1, n) and exp.action_mask.shape == (1, n - 1)
        assert exp.rollout_log_probs.shape == (1, n - 1)
        trained = int(exp.action_mask.sum())
        if (f"{i // 2:06d}", i % 2) == FAILING:
            assert trained == 0  # the placeholder trains nothing
        else:
            assert trained > 0 and exp.rewards.item() == (i % 2) / 4


def test_areal_workflow_episodes_concatenate_as_a_group(
    tmp_path: Path,
    reward_url: str,  # noqa: F811
) -> None:
    pytest.importorskip("areal.utils.data")
    from areal.api.workflow_api import RolloutWorkflow
    from areal.utils.data import concat_padded_tensors

    from heddle.integrations.areal import HeddleWorkflow

    workflow = HeddleWorkflow(_settings(tmp_path, reward_url, batch_window_s=0.2))
    assert isinstance(workflow, RolloutWorkflow)
    data = [{"messages": p} for p in PROMPTS[:2]]

    async def main() -> list[dict[str, Any]]:  # AReaL's grouped rollout: group_size calls
        calls = [workflow.arun_episode(None, data[i // 2]) for i in range(4)]
        return list(await asyncio.gather(*calls))

    episodes = asyncio.run(main())
    batch = concat_padded_tensors(episodes)
    assert batch["input_ids"].shape[0] == 4
    assert batch["loss_mask"][3].sum() == 0  # task 1, sample 1: the placeholder
    assert all(batch["loss_mask"][i].sum() > 0 for i in range(3))
    assert (batch["versions"][0][batch["loss_mask"][0].bool()] == -1).all()  # no version set


def test_verl_agent_loop_is_registered_and_its_output_is_a_dataproto(
    tmp_path: Path,
    reward_url: str,  # noqa: F811
) -> None:
    pytest.importorskip("verl.experimental.agent_loop.agent_loop")
    import torch
    from verl.experimental.agent_loop.agent_loop import (
        AgentLoopBase,
        AgentLoopMetrics,
        AgentLoopOutput,
        _agent_loop_registry,
    )
    from verl.protocol import DataProto

    from heddle.export import collate_verl, convert_records
    from heddle.integrations import HeddleRollouts, verl_output_fields
    from heddle.integrations.verl import HeddleAgentLoop

    assert issubclass(HeddleAgentLoop, AgentLoopBase)
    assert _agent_loop_registry["heddle"] == {
        "_target_": "heddle.integrations.verl.HeddleAgentLoop"
    }
    rollouts = HeddleRollouts(_settings(tmp_path, reward_url))
    records = asyncio.run(rollouts.run([{"prompt": p} for p in PROMPTS[:2]], 2))
    for record in records:  # pydantic validates every field as verl declares it
        fields = verl_output_fields(record)
        metrics = AgentLoopMetrics(generate_sequences=fields.pop("generate_s"),
                                   tool_calls=fields.pop("tool_s"))  # fmt: skip
        out = AgentLoopOutput(metrics=metrics, **fields)
        assert len(out.response_mask) == len(out.response_ids)
    tensors, non_tensors = collate_verl(convert_records(records, "verl"))
    proto = DataProto.from_dict(
        tensors={k: torch.from_numpy(v) for k, v in tensors.items()}, non_tensors=non_tensors
    )
    assert len(proto) == 4 and proto.batch["response_mask"][3].sum() == 0
