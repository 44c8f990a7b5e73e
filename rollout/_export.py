"""Output records in the shapes trainers take (docs/rollouts.md, "Export to a trainer").

One row per trajectory, in the trainer's batch order: by task index (the
task's place in the task set), then sample, so GRPO siblings sit together.
Keys are the trainer's own field names; batch types (verl's ``DataProto``,
SkyRL's ``GeneratorOutput``) are built from the rows by :func:`collate_verl`
and :func:`collate_skyrl`. A failed or missing trajectory is a placeholder row
(``_contract.py``) unless ``failed="drop"``: trainers want whole groups.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from heddle.api import read_text
from heddle.exceptions import OutputError

from ._contract import FAILED_ROWS, is_placeholder, order_rows

__all__ = [
    "FAILED_ROWS",
    "TRAINERS",
    "check_record",
    "collate_skyrl",
    "collate_verl",
    "convert_records",
    "export_rows",
    "read_records",
    "write_export",
]

Row = dict[str, Any]


def read_records(path: Path, *, failed: str = "placeholder") -> list[Row]:
    """The records of a Heddle output, checked, in batch order (``_contract.order_rows``)."""
    text = read_text(path, "rollout output", "give a Heddle output file")
    records: list[Row] = []
    where_of: dict[tuple[str, int], int] = {}
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{path} line {number}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise OutputError(
                f"{where} is not JSON ({exc.msg}); give a Heddle output file"
            ) from None
        check_record(rec, where)
        key = (rec["task_id"], rec["sample"])
        if key in where_of:
            raise OutputError(
                f"{where} repeats task {key[0]!r} sample {key[1]} of line {where_of[key]}; "
                "a Heddle output holds each once, so the file was concatenated or edited"
            )
        where_of[key] = number
        records.append(rec)
    return order_rows(records, failed=failed)


def check_record(rec: Any, where: str) -> None:
    """The fields every converter reads, with one sentence per fault."""
    if not isinstance(rec, dict) or not isinstance(rec.get("task_id"), str):
        raise OutputError(f"{where} is not a Heddle record (no task_id); give a Heddle output file")
    for name, kind, what in (
        ("sample", int, "an integer"),
        ("status", str, "a string"),
        ("messages", list, "a list"),
    ):
        if not isinstance(rec.get(name), kind) or isinstance(rec.get(name), bool):
            raise OutputError(f"{where}: {name} must be {what}")
    for name in ("prompt_token_ids", "response_token_ids", "response_mask"):
        value = rec.get(name)
        if not isinstance(value, list) or not all(isinstance(t, int) for t in value):
            raise OutputError(f"{where}: {name} must be a list of integers")
    response = len(rec["response_token_ids"])
    for name in ("response_mask", "response_logprobs"):
        if name in rec and len(rec[name]) != response:
            raise OutputError(
                f"{where}: {name} has {len(rec[name])} entries but response_token_ids has "
                f"{response}; they must align one to one"
            )
    reward = rec.get("reward")
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, int | float)):
        raise OutputError(f"{where}: reward must be a number or null")
    if not all(isinstance(m, dict) for m in rec["messages"]):
        raise OutputError(f"{where}: messages must be a list of objects")
    for name in ("task_fields", "metadata"):
        if not isinstance(rec.get(name) or {}, dict):
            raise OutputError(f"{where}: {name} must be an object")


def _split_messages(rec: Row) -> tuple[list[Any], list[Any]]:
    """(prompt messages, the rest): the prompt ends at the first assistant message."""
    messages = rec["messages"]
    first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))
    return messages[:first], messages[first:]


def _label(fields: Mapping[str, Any]) -> str | None:
    """The ground truth under the name each trainer gives it (slime, verl, SkyRL)."""
    for value in (
        fields.get("label"),
        _field(fields, "reward_model").get("ground_truth"),
        _field(fields, "reward_spec").get("ground_truth"),
    ):
        if value is not None:
            return value if isinstance(value, str) else json.dumps(value)
    return None


def _field(fields: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """A trainer's object field, or {} when absent or not an object (a row may hold anything)."""
    value = fields.get(name)
    return value if isinstance(value, Mapping) else {}


def _reward(rec: Row) -> float | None:
    """The reward a trainer's numeric field gets: a placeholder's is its group's mean."""
    reward = rec.get("reward")
    if reward is None and is_placeholder(rec):
        reward = rec["placeholder"].get("reward_fill")
    return None if reward is None else float(reward)


def _text(messages: Iterable[Mapping[str, Any]]) -> str:
    return "\n".join(str(m.get("content") or "") for m in messages)


def to_verl(rec: Row, position: int) -> Row:
    """verl ``DataProto`` row: ``batch`` (tensor fields) and ``non_tensor_batch``."""
    prompt, response, mask = (
        rec["prompt_token_ids"],
        rec["response_token_ids"],
        rec["response_mask"],
    )
    fields = rec.get("task_fields") or {}
    batch: Row = {
        "prompts": prompt,
        "responses": response,
        "response_mask": mask,
        "input_ids": prompt + response,
        "attention_mask": [1] * (len(prompt) + len(response)),
        "position_ids": list(range(len(prompt) + len(response))),
    }
    if "response_logprobs" in rec:
        batch["rollout_log_probs"] = rec["response_logprobs"]
    reward = _reward(rec)
    if reward is not None and response:  # verl: the score sits on the last response token
        batch["rm_scores"] = [0.0] * (len(response) - 1) + [reward]
    extra = _field(fields, "extra_info")
    non_tensor: Row = {
        **fields,
        "data_source": fields.get("data_source", "heddle"),
        "reward_model": fields.get("reward_model", {}),
        "extra_info": fields.get("extra_info", {}),
        "uid": rec["task_id"],  # verl groups GRPO samples by uid
        "index": extra.get("index", rec.get("task_index", position)),
        "raw_prompt": _split_messages(rec)[0],
        "__num_turns__": len(rec["messages"]),
        "weight_versions": _step_versions(rec),  # per step: off-policy correction per segment
        "heddle_placeholder": rec["placeholder"]["reason"] if is_placeholder(rec) else None,
    }
    return {"batch": batch, "non_tensor_batch": non_tensor}


_SLIME_STATUS = {"done": "completed", "truncated": "truncated", "failed": "failed"}


def _step_versions(rec: Row) -> list[str]:
    """The weight version of each step (slime appends one per generate call), else the
    record's one version (records written before segments were recorded)."""
    segments = rec.get("segments")
    if segments:
        return [str(s["weight_version"]) for s in segments if s["weight_version"] is not None]
    version = rec.get("weight_version")
    return [] if version is None else [str(version)]


def to_slime(rec: Row, position: int) -> Row:
    """slime ``Sample`` fields."""
    prompt_messages, rest = _split_messages(rec)
    response = rec["response_token_ids"]
    return {
        "group_index": rec.get("task_index", position),
        "index": position,
        "prompt": prompt_messages,
        "tokens": rec["prompt_token_ids"] + response,
        "response": _text(rest),
        "response_length": len(response),
        "label": _label(rec.get("task_fields") or {}),
        "reward": _reward(rec),
        "loss_mask": rec["response_mask"],
        "weight_versions": _step_versions(rec),
        "rollout_log_probs": rec.get("response_logprobs"),
        "status": _SLIME_STATUS.get(rec["status"], "failed"),
        "remove_sample": is_placeholder(rec),  # slime keeps the row, trains on none of it
        "metadata": {**(rec.get("metadata") or {}), "heddle": _identity(rec)},
    }


def to_skyrl(rec: Row, position: int) -> Row:
    """One entry of each list of SkyRL's ``GeneratorOutput``."""
    stop = {"done": "stop", "truncated": "length"}.get(rec["status"], rec["status"])
    return {
        "prompt_token_ids": rec["prompt_token_ids"],
        "response_ids": rec["response_token_ids"],
        "rewards": _reward(rec),
        "loss_masks": rec["response_mask"],
        "stop_reasons": stop,
        "rollout_logprobs": rec.get("response_logprobs"),
        "trajectory_ids": {"instance_id": rec["task_id"], "repetition_id": rec["sample"]},
    }


def action_ranges(prompt_len: int, mask: Sequence[int]) -> list[tuple[int, int]]:
    """The [start, end) spans of generated tokens in prompt + response (OpenRLHF's
    ``action_ranges``): one per run of 1s in ``mask``, offset by the prompt."""
    spans: list[tuple[int, int]] = []
    start: int | None = None
    for i, bit in enumerate([*mask, 0]):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            spans.append((prompt_len + start, prompt_len + i))
            start = None
    return spans


def _full_logprobs(rec: Row) -> list[float] | None:
    """Logprobs over prompt + response, 0.0 off the generated tokens (null ones too)."""
    lps = rec.get("response_logprobs")
    if lps is None:
        return None
    return [0.0] * len(rec["prompt_token_ids"]) + [0.0 if x is None else float(x) for x in lps]


def to_openrlhf(rec: Row, position: int) -> Row:
    """What OpenRLHF's agent path reads from an ``AgentExecutor.execute`` result
    (``openrlhf/trainer/ppo_utils/samples_generator.py``, ``_process_response_into_experience``):
    ``observation_tokens`` is prompt + response, ``action_ranges`` the generated spans in it,
    ``rollout_log_probs`` one per observation token (OpenRLHF drops the first: T-1, shifted)."""
    tokens = rec["prompt_token_ids"] + rec["response_token_ids"]
    reward = _reward(rec)
    fields = rec.get("task_fields") or {}
    return {
        "prompt": _text(_split_messages(rec)[0]),
        "label": _label(fields),
        "observation_tokens": tokens,
        "action_ranges": action_ranges(len(rec["prompt_token_ids"]), rec["response_mask"]),
        "rollout_log_probs": _full_logprobs(rec),
        "truncated": rec["status"] == "truncated" or rec.get("finish_reason") == "length",
        "reward": reward,
        "scores": reward,
        "extra_logs": {"turns": rec.get("turns", 0)},
        "index": rec.get("task_index", position),
        "info": {**_identity(rec), "weight_versions": _step_versions(rec)},  # per step
    }


def _int_version(rec: Row) -> int:
    """AReaL counts weight versions as integers; -1 when the record's is not one."""
    version = rec.get("weight_version")
    try:
        return int(version) if version is not None else -1
    except (TypeError, ValueError):
        return -1


def _token_versions(rec: Row) -> list[int]:
    """AReaL's ``versions`` over the response: each generated token's step version (the
    record's ``segments``), else the record's one version; -1 on tool and prompt tokens."""
    mask = rec["response_mask"]
    versions = [_int_version(rec) if bit else -1 for bit in mask]
    for segment in rec.get("segments") or ():
        version = _int_version({"weight_version": segment["weight_version"]})
        for i in range(segment["response_start"], min(segment["response_end"], len(mask))):
            versions[i] = version if mask[i] else -1
    return versions


def to_areal(rec: Row, position: int) -> Row:
    """One row of AReaL's trajectory dict (``docs/en/reference/rollout_workflow.md``,
    "Tensor Dictionary Format"; ``areal/api/workflow_api.py`` ``arun_episode``):
    per-token lists over prompt + response, the reward per sequence."""
    prompt, response = rec["prompt_token_ids"], rec["response_token_ids"]
    mask = rec["response_mask"]
    versions = _token_versions(rec)
    reward = _reward(rec)
    return {
        "input_ids": prompt + response,
        "attention_mask": [1] * (len(prompt) + len(response)),
        "loss_mask": [0] * len(prompt) + list(mask),
        "logprobs": _full_logprobs(rec) or [0.0] * (len(prompt) + len(response)),
        "versions": [-1] * len(prompt) + versions,
        "rewards": 0.0 if reward is None else reward,
        "info": _identity(rec),
    }


def to_roll(rec: Row, position: int) -> Row:
    """One row of the ``DataProto`` a ROLL env manager emits
    (``roll/pipeline/agentic/env_manager/traj_env_manager.py``, ``formulate_rollouts``),
    unpadded: ROLL pads to ``sequence_length`` itself."""
    prompt, response = rec["prompt_token_ids"], rec["response_token_ids"]
    mask = list(rec["response_mask"])
    n = len(prompt) + len(response)
    reward = _reward(rec)
    score = 0.0 if reward is None else reward
    full = _full_logprobs(rec)
    first = next((i for i, bit in enumerate(mask) if bit), len(mask))
    return {
        "batch": {
            "input_ids": prompt + response,
            "attention_mask": [1] * n,
            "position_ids": list(range(n)),
            "response_mask": [0] * len(prompt) + mask,
            "prompt_mask": [1] * (len(prompt) + first) + [0] * (len(response) - first),
            "scores": [0.0] * (n - 1) + [score] if n else [],
            **({"infer_logprobs": full[1:]} if full is not None else {}),
        },
        "non_tensor_batch": {
            "env_ids": rec["sample"],
            "group_ids": rec.get("task_index", position),
            "tags": str((rec.get("task_fields") or {}).get("tag", "heddle")),
            "step_scores": [score],
            "episode_scores": score,
            "traj_group_id": rec["task_id"],
            "traj_id": f"{rec['task_id']}_{rec['sample']}",
        },
    }


def _identity(rec: Row) -> Row:
    return {
        "task_id": rec["task_id"],
        "sample": rec["sample"],
        "trajectory_id": rec.get("trajectory_id"),
        "finish_reason": rec.get("finish_reason"),
        "reward_info": rec.get("reward_info"),
        "placeholder": (rec["placeholder"]["reason"] if is_placeholder(rec) else None),
    }


TRAINERS: dict[str, Callable[[Row, int], Row]] = {
    "verl": to_verl,
    "slime": to_slime,
    "skyrl": to_skyrl,
    "openrlhf": to_openrlhf,
    "areal": to_areal,
    "roll": to_roll,
}


def convert_records(records: Sequence[Row], trainer: str) -> list[Row]:
    """Records already in batch order (``order_rows``) as ``trainer``'s rows."""
    if trainer not in TRAINERS:
        raise OutputError(f"unknown trainer {trainer!r}; choose one of {sorted(TRAINERS)}")
    convert = TRAINERS[trainer]
    return [convert(rec, i) for i, rec in enumerate(records)]


def export_rows(path: Path, trainer: str, *, failed: str = "placeholder") -> list[Row]:
    """The output at ``path`` as ``trainer``'s rows, in (task index, sample) order."""
    if trainer not in TRAINERS:
        raise OutputError(f"unknown trainer {trainer!r}; choose one of {sorted(TRAINERS)}")
    return convert_records(read_records(path, failed=failed), trainer)


def write_export(source: Path, target: Path, trainer: str, *, failed: str = "placeholder") -> int:
    """Write ``trainer``'s rows as JSONL; returns how many. Refuses to overwrite ``source``."""
    if target.resolve() == source.resolve():
        raise OutputError(f"{target} is the input; write the export to another file")
    rows = export_rows(source, trainer, failed=failed)
    tmp = target.with_name(target.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as out:  # whole or not at all: renamed when complete
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")
    tmp.replace(target)
    return len(rows)


def collate_verl(
    rows: Sequence[Row], pad_token_id: int = 0
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(tensors, non_tensors) for ``DataProto.from_dict``: prompts left-padded, responses right.

    ``attention_mask`` is 0 on padding and ``position_ids`` count the real tokens
    only, as verl's rollouts lay them out (``agent_loop.py``).
    """
    if not rows:
        raise OutputError("no rows to collate; the export is empty")
    p_len = max(len(r["batch"]["prompts"]) for r in rows)
    r_len = max(len(r["batch"]["responses"]) for r in rows)
    n = len(rows)
    prompts = np.full((n, p_len), pad_token_id, dtype=np.int64)
    responses = np.full((n, r_len), pad_token_id, dtype=np.int64)
    response_mask = np.zeros((n, r_len), dtype=np.int64)
    attention = np.zeros((n, p_len + r_len), dtype=np.int64)
    # A placeholder without tokens has no last token to score: zeros, as its mask is.
    scored = any("rm_scores" in r["batch"] for r in rows) and all(
        "rm_scores" in r["batch"] or r["non_tensor_batch"].get("heddle_placeholder") for r in rows
    )
    logprobs = all("rollout_log_probs" in r["batch"] for r in rows)
    rm_scores = np.zeros((n, r_len), dtype=np.float32)
    rollout_lp = np.zeros((n, r_len), dtype=np.float32)
    for i, row in enumerate(rows):
        b = row["batch"]
        p, r = len(b["prompts"]), len(b["responses"])
        prompts[i, p_len - p :] = b["prompts"]
        responses[i, :r] = b["responses"]
        response_mask[i, :r] = b["response_mask"]
        attention[i, p_len - p : p_len + r] = 1
        if scored and "rm_scores" in b:
            rm_scores[i, :r] = b["rm_scores"]
        if logprobs:
            rollout_lp[i, :r] = b["rollout_log_probs"]
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "response_mask": response_mask,
        "input_ids": np.concatenate([prompts, responses], axis=1),
        "attention_mask": attention,
        "position_ids": np.clip(np.cumsum(attention, axis=1) - 1, 0, None),
    }
    if scored:
        tensors["rm_scores"] = rm_scores
    if logprobs:
        tensors["rollout_log_probs"] = rollout_lp
    keys = set().union(*(r["non_tensor_batch"] for r in rows))
    non_tensors = {}
    for key in sorted(keys):
        column = np.empty(n, dtype=object)  # object arrays keep dicts and lists whole
        column[:] = [r["non_tensor_batch"].get(key) for r in rows]
        non_tensors[key] = column
    return tensors, non_tensors


def collate_skyrl(rows: Sequence[Row]) -> Row:
    """SkyRL's ``GeneratorOutput``: one list per field, rows in order."""
    out: Row = {
        key: [r[key] for r in rows]
        for key in (
            "prompt_token_ids",
            "response_ids",
            "rewards",
            "loss_masks",
            "stop_reasons",
            "trajectory_ids",
        )
    }
    logprobs = [r["rollout_logprobs"] for r in rows]
    out["rollout_logprobs"] = None if any(lp is None for lp in logprobs) else logprobs
    out["rollout_metrics"] = None
    out["is_last_step"] = None  # step-wise training only
    out["sampling_masks"] = None
    return out
