"""The batch contract: one row per (task, sample), in input order, whole groups.

A failed trajectory inside a group becomes a placeholder at its place (mask all
zero, reward null, the reason); a missing one too; ``failed="drop"`` leaves it
out. Every trainer's row keeps the placeholder untrainable.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from heddle.cli._export import _FAILED, _TRAINERS
from heddle.cli._main import main
from heddle.exceptions import OutputError
from heddle.export import FAILED_ROWS, TRAINERS, order_rows, read_rollouts


def _rec(task: int, sample: int, status: str = "done", **extra: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "task_id": f"t{task}",
        "sample": sample,
        "trajectory_id": f"t{task}-{sample}",
        "status": status,
        "finish_reason": "stop" if status == "done" else "failed",
        "error": None if status == "done" else "the reward endpoint refused the call (400)",
        "messages": [
            {"role": "user", "content": f"q{task}"},
            {"role": "assistant", "content": "a"},
        ],
        "prompt_token_ids": [100 + task, 101],
        "response_token_ids": [5, 6, 7],
        "response_mask": [1, 1, 1],
        "response_logprobs": [-0.5, -0.25, -1.0],
        "turns": 1,
        "task_index": task,
        "task_fields": {"label": str(task)},
        "metadata": {},
        "weight_version": "3",
        "reward": {0: 1.0, 1: 0.0, 2: 0.5}[sample] if status == "done" else None,
        "reward_info": None,
        "reward_error": None,
    }
    rec.update(extra)
    return rec


# Finish order: task 1's sample 1 failed, task 0's sample 2 never got a record.
RECORDS = [_rec(1, 2), _rec(0, 1), _rec(1, 1, "failed"), _rec(1, 0), _rec(0, 0)]


def test_a_failed_trajectory_in_a_group_is_a_placeholder_in_its_place() -> None:
    rows = order_rows([dict(r) for r in RECORDS])
    assert [(r["task_id"], r["sample"]) for r in rows] == [
        ("t0", 0), ("t0", 1), ("t0", 2), ("t1", 0), ("t1", 1), ("t1", 2),
    ]  # fmt: skip
    failed, missing = rows[4], rows[2]
    assert failed["placeholder"]["reason"] == "the reward endpoint refused the call (400)"
    assert failed["response_token_ids"] == [5, 6, 7] and failed["response_mask"] == [0, 0, 0]
    assert failed["reward"] is None and failed["status"] == "failed"
    # its group's mean (1.0 and 0.5): the GRPO baseline of the group does not move
    assert failed["placeholder"]["reward_fill"] == pytest.approx(0.75)
    assert missing["placeholder"]["reason"].startswith("no record was written")
    assert missing["prompt_token_ids"] == [100, 101] and missing["response_mask"] == []
    assert missing["task_fields"] == {"label": "0"} and missing["task_index"] == 0
    assert missing["placeholder"]["reward_fill"] == pytest.approx(0.5)
    assert all("placeholder" not in r for i, r in enumerate(rows) if i not in (2, 4))


def test_the_batch_the_caller_names_is_the_batch_returned() -> None:
    rows = order_rows([dict(r) for r in RECORDS], tasks=["t1", "t9", "t0"], samples=2)
    assert [(r["task_id"], r["sample"]) for r in rows] == [
        ("t1", 0), ("t1", 1), ("t1", 2), ("t9", 0), ("t9", 1), ("t0", 0), ("t0", 1),
    ]  # fmt: skip
    assert rows[3]["task_index"] == 1 and rows[3]["placeholder"]["reward_fill"] is None


def test_drop_and_keep_are_the_documented_alternatives() -> None:
    dropped = order_rows([dict(r) for r in RECORDS], failed="drop")
    assert [(r["task_id"], r["sample"]) for r in dropped] == [
        ("t0", 0), ("t0", 1), ("t1", 0), ("t1", 2),
    ]  # fmt: skip
    kept = order_rows([dict(r) for r in RECORDS], failed="keep")
    assert kept[4]["response_mask"] == [1, 1, 1] and "placeholder" not in kept[4]
    assert "placeholder" in kept[2]  # a missing record has nothing to keep
    with pytest.raises(OutputError, match="not one of placeholder, drop, keep"):
        order_rows([], failed="skip")


@pytest.fixture
def output(tmp_path: Path) -> Path:
    path = tmp_path / "out.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    return path


def _trainable(trainer: str, row: dict[str, Any]) -> int:
    """How many tokens of ``row`` the trainer would train on, read as it reads them."""
    if trainer == "verl":
        return sum(row["batch"]["response_mask"])
    if trainer == "slime":
        return 0 if row["remove_sample"] else sum(row["loss_mask"])
    if trainer == "skyrl":
        return sum(row["loss_masks"])
    if trainer == "openrlhf":
        return sum(end - start for start, end in row["action_ranges"])
    if trainer == "areal":
        return sum(row["loss_mask"])
    return sum(row["batch"]["response_mask"])  # roll


@pytest.mark.parametrize("trainer", sorted(TRAINERS))
def test_every_trainers_rows_keep_the_groups_and_train_nothing_of_a_placeholder(
    output: Path, trainer: str
) -> None:
    rows = read_rollouts(output, trainer)
    assert len(rows) == 6
    assert [_trainable(trainer, r) for r in rows] == [3, 3, 0, 3, 0, 3]


def test_openrlhf_rows_are_what_its_agent_path_reads(output: Path) -> None:
    """``_process_response_into_experience``: action_mask from action_ranges over the
    observation, then both it and the logprobs lose their first position (T-1)."""
    row = read_rollouts(output, "openrlhf")[0]
    tokens = row["observation_tokens"]
    assert tokens == [100, 101, 5, 6, 7]
    assert [tuple(span) for span in row["action_ranges"]] == [(2, 5)]
    action_mask = [0] * len(tokens)
    for start, end in row["action_ranges"]:
        action_mask[start:end] = [1] * (end - start)
    shifted_mask, shifted_lp = action_mask[1:], row["rollout_log_probs"][1:]
    assert len(shifted_lp) == len(shifted_mask) == len(tokens) - 1
    assert [lp for lp, m in zip(shifted_lp, shifted_mask, strict=True) if m] == [-0.5, -0.25, -1.0]
    assert row["reward"] == 1.0 and row["label"] == "0" and row["truncated"] is False


def test_areal_and_roll_rows_have_their_documented_fields(output: Path) -> None:
    areal = read_rollouts(output, "areal")[0]
    assert set(areal) >= {"input_ids", "attention_mask", "loss_mask", "logprobs", "versions"}
    assert areal["versions"] == [-1, -1, 3, 3, 3] and areal["loss_mask"] == [0, 0, 1, 1, 1]
    assert areal["logprobs"] == [0.0, 0.0, -0.5, -0.25, -1.0] and areal["rewards"] == 1.0
    roll = read_rollouts(output, "roll")[0]
    batch = roll["batch"]
    assert batch["prompt_mask"] == [1, 1, 0, 0, 0] and batch["scores"] == [0, 0, 0, 0, 1.0]
    assert batch["infer_logprobs"] == [0.0, -0.5, -0.25, -1.0]  # ROLL shifts them by one
    assert roll["non_tensor_batch"]["traj_group_id"] == "t0"


def test_cli_lists_all_six_trainers_and_the_failed_choices(
    output: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        sorted(_TRAINERS)
        == sorted(TRAINERS)
        == sorted(["verl", "slime", "skyrl", "openrlhf", "areal", "roll"])
    )
    assert _FAILED == FAILED_ROWS
    target = tmp_path / "areal.jsonl"
    assert main(["export", "--to", "areal", "--failed", "drop", str(output), str(target)]) == 0
    assert len(target.read_text().splitlines()) == 4
    assert "wrote 4 areal rows" in capsys.readouterr().err
