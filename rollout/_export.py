"""Output records in the shapes trainers take (docs/rollouts.md, "Export to a trainer").

One row per trajectory, in the trainer's batch order: by task index (the
task's place in the task set), then sample, so GRPO siblings sit together.
Keys are the trainer's own field names; batch types (verl's ``DataProto``,
SkyRL's ``GeneratorOutput``) are built from the rows by :func:`collate_verl`
and :func:`collate_skyrl`. Failed trajectories are left out unless asked for:
their token lists may stop mid-turn and they have no reward.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from heddle.api import read_text
from heddle.exceptions import OutputError

__all__ = [
    "TRAINERS",
    "check_record",
    "collate_skyrl",
    "collate_verl",
    "export_rows",
    "read_records",
    "write_export",
]

Row = dict[str, Any]


def read_records(path: Path, *, keep_failed: bool = False) -> list[Row]:
    """The records of a Heddle output, checked, in (task index, sample) order."""
    text = read_text(path, "rollout output", "give a Heddle output file")
    records: list[tuple[tuple[int, int], Row]] = []
    first_seen: dict[str, int] = {}  # task order for files written before task_index existed
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
        first_seen.setdefault(rec["task_id"], len(first_seen))
        if rec["status"] == "failed" and not keep_failed:
            continue
        index = rec.get("task_index")
        order = index if isinstance(index, int) else first_seen[rec["task_id"]]
        records.append(((order, rec["sample"]), rec))
    records.sort(key=lambda item: item[0])
    return [rec for _, rec in records]


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
    reward = rec.get("reward")
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


def to_openrlhf(rec: Row, position: int) -> Row:
    """One sample of OpenRLHF's ``Experience`` (as ``split_experience_batch`` gives it)."""
    sequences = rec["prompt_token_ids"] + rec["response_token_ids"]
    reward = _reward(rec)
    return {
        "sequences": sequences,
        "attention_mask": [1] * len(sequences),
        "action_mask": rec["response_mask"],  # over the last len(response) positions
        "rollout_log_probs": rec.get("response_logprobs"),
        "rewards": reward,
        "scores": reward,
        "response_length": sum(rec["response_mask"]),  # generated tokens, as OpenRLHF counts
        "truncated": rec["status"] == "truncated",
        "total_length": len(sequences),
        "index": rec.get("task_index", position),
        "prompts": _text(_split_messages(rec)[0]),
        "labels": _label(rec.get("task_fields") or {}),
        "info": {
            **_identity(rec),
            "turns": rec.get("turns", 0),
            "weight_versions": _step_versions(rec),
        },
    }


def _identity(rec: Row) -> Row:
    return {
        "task_id": rec["task_id"],
        "sample": rec["sample"],
        "trajectory_id": rec.get("trajectory_id"),
        "finish_reason": rec.get("finish_reason"),
        "reward_info": rec.get("reward_info"),
    }


TRAINERS: dict[str, Callable[[Row, int], Row]] = {
    "verl": to_verl,
    "slime": to_slime,
    "skyrl": to_skyrl,
    "openrlhf": to_openrlhf,
}


def export_rows(path: Path, trainer: str, *, keep_failed: bool = False) -> list[Row]:
    """The output at ``path`` as ``trainer``'s rows, in (task index, sample) order."""
    if trainer not in TRAINERS:
        raise OutputError(f"unknown trainer {trainer!r}; choose one of {sorted(TRAINERS)}")
    convert = TRAINERS[trainer]
    return [convert(rec, i) for i, rec in enumerate(read_records(path, keep_failed=keep_failed))]


def write_export(source: Path, target: Path, trainer: str, *, keep_failed: bool = False) -> int:
    """Write ``trainer``'s rows as JSONL; returns how many. Refuses to overwrite ``source``."""
    if target.resolve() == source.resolve():
        raise OutputError(f"{target} is the input; write the export to another file")
    rows = export_rows(source, trainer, keep_failed=keep_failed)
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
    scored = all("rm_scores" in r["batch"] for r in rows)
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
        if scored:
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
