"""Heddle records in each trainer's own field names, without importing the trainer.

The adapters wrap these in their trainer's types; the tests check them against
each trainer's documented fields even where the trainer does not install here.
Each starts from ``heddle.export``'s converter for that trainer, so the export
and the adapters write the same thing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from heddle.export import convert_records, is_placeholder

from ._rollouts import plain

__all__ = [
    "areal_fields",
    "openrlhf_result",
    "roll_fields",
    "skyrl_output",
    "skyrl_tasks",
    "slime_fields",
    "slime_task",
    "verl_output_fields",
    "verl_task",
]

Record = Mapping[str, Any]


def _row(record: Record, trainer: str) -> dict[str, Any]:
    return convert_records([dict(record)], trainer)[0]


# --- verl -------------------------------------------------------------------------------


def verl_task(row: Mapping[str, Any]) -> dict[str, Any]:
    """A verl dataset row (``RLHFDataset``: ``raw_prompt`` messages, ``data_source``,
    ``reward_model``, ``extra_info``, ...) as a Heddle task."""
    task: dict[str, Any] = {"prompt": plain(row.get("raw_prompt") or row.get("prompt") or [])}
    for key in ("data_source", "reward_model", "extra_info", "ability", "tools_kwargs"):
        if key in row:
            task[key] = plain(row[key])
    return task


def verl_output_fields(record: Record) -> dict[str, Any]:
    """``AgentLoopOutput``'s fields (plus ``generate_s``/``tool_s`` for its metrics)."""
    row = _row(record, "verl")
    batch = row["batch"]
    timings = record.get("timings") or {}
    return {
        "prompt_ids": batch["prompts"],
        "response_ids": batch["responses"],
        "response_mask": batch["response_mask"],
        "response_logprobs": batch.get("rollout_log_probs"),
        "reward_score": batch["rm_scores"][-1] if "rm_scores" in batch else None,
        "num_turns": row["non_tensor_batch"]["__num_turns__"],
        "extra_fields": {
            "heddle_placeholder": row["non_tensor_batch"]["heddle_placeholder"],
            "heddle_trajectory_id": record.get("trajectory_id"),
            "heddle_weight_version": record.get("weight_version"),
        },
        "generate_s": float(timings.get("generate_s") or 0.0),
        "tool_s": float(timings.get("tool_s") or 0.0),
    }


# --- slime ------------------------------------------------------------------------------

# Sample's fields a rollout function fills (slime/utils/types.py; the rest are slime's own).
SLIME_FILLED = (
    "tokens",
    "response",
    "response_length",
    "reward",
    "loss_mask",
    "weight_versions",
    "rollout_log_probs",
    "status",
    "remove_sample",
)


def slime_task(prompt: Any, label: Any, metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    """A slime ``Sample``'s input (``prompt`` text or messages, ``label``, ``metadata``)."""
    task: dict[str, Any] = {"prompt": plain(prompt)}
    if label is not None:
        task["label"] = plain(label)
    if metadata:
        task["metadata"] = plain(metadata)
    return task


def slime_fields(record: Record) -> dict[str, Any]:
    """The ``Sample`` fields a rollout function sets (``status`` as the enum's value)."""
    row = _row(record, "slime")
    return {name: row[name] for name in SLIME_FILLED} | {"heddle": row["metadata"]["heddle"]}


# --- SkyRL ------------------------------------------------------------------------------


def skyrl_tasks(
    prompts: Sequence[Any],
    env_extras: Sequence[Mapping[str, Any]] | None,
    trajectory_ids: Sequence[Any] | None,
) -> tuple[list[dict[str, Any]], int, list[tuple[int, int]]] | None:
    """(one task per instance, samples per instance, each input row's (task, sample)) when
    ``GeneratorInput`` repeats every instance the same number of times; else None."""
    if trajectory_ids is None:
        return None
    order: dict[str, int] = {}
    slots: list[tuple[int, int]] = []
    counts: dict[int, int] = {}
    tasks: list[dict[str, Any]] = []
    for i, tid in enumerate(trajectory_ids):
        instance = str(getattr(tid, "instance_id", tid))
        if instance not in order:
            order[instance] = len(order)
            extras = dict(env_extras[i]) if env_extras else {}
            tasks.append({"prompt": plain(prompts[i]), **plain(extras)})
        t = order[instance]
        slots.append((t, counts.get(t, 0)))
        counts[t] = counts.get(t, 0) + 1
    if len(set(counts.values())) != 1:
        return None
    return tasks, next(iter(counts.values())), slots


def skyrl_output(records: Sequence[Record]) -> dict[str, Any]:
    """``GeneratorOutput`` (skyrl/train/generators/base.py) for rows in input order."""
    rows = convert_records([dict(r) for r in records], "skyrl")
    logprobs = [r["rollout_logprobs"] for r in rows]
    timings = [r.get("timings") or {} for r in records]
    return {
        "prompt_token_ids": [r["prompt_token_ids"] for r in rows],
        "response_ids": [r["response_ids"] for r in rows],
        # SkyRL wants a number per row; a placeholder's mask is zero, so its 0.0 trains nothing
        "rewards": [0.0 if r["rewards"] is None else r["rewards"] for r in rows],
        "loss_masks": [r["loss_masks"] for r in rows],
        "stop_reasons": [r["stop_reasons"] for r in rows],
        "rollout_metrics": None,
        "rollout_logprobs": None if any(lp is None for lp in logprobs) else logprobs,
        "trajectory_ids": None,  # the adapter puts the input's TrajectoryID objects back
        "trajectory_generation_times": [float(t.get("duration_s") or 0.0) for t in timings],
        "trajectory_time_splits": {
            "llm": [float(t.get("generate_s") or 0.0) for t in timings],
            "env": [float(t.get("tool_s") or 0.0) for t in timings],
        },
        "rollout_expert_indices": None,  # vLLM's CPU build returns no routed experts
        "is_last_step": None,
        "env_metrics": None,
        "pixel_values": None,
        "image_grid_thw": None,
    }


# --- OpenRLHF, AReaL, ROLL --------------------------------------------------------------


def openrlhf_result(record: Record, prompt: Any, label: Any) -> dict[str, Any]:
    """What ``AgentExecutor.execute`` returns (openrlhf/utils/agent.py) for one sample."""
    row = _row(record, "openrlhf")
    return {
        "prompt": prompt,
        "label": label,
        "images": None,
        "mm_train_inputs": None,
        "reward": row["reward"],
        "scores": row["scores"],
        "observation_tokens": row["observation_tokens"],
        "action_ranges": row["action_ranges"],
        "rollout_log_probs": row["rollout_log_probs"],
        "truncated": row["truncated"],
        "extra_logs": {**row["extra_logs"], "heddle_placeholder": float(is_placeholder(record))},
    }


def areal_fields(record: Record) -> dict[str, Any]:
    """AReaL's per-sequence lists (the adapter makes them ``[1, seq_len]`` tensors)."""
    return _row(record, "areal")


def roll_fields(record: Record) -> dict[str, Any]:
    """The ``batch`` and ``non_tensor_batch`` of ROLL's rollout ``DataProto``, unpadded."""
    return _row(record, "roll")
