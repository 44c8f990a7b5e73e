"""The trainers' batch contract: one row per input, in input order, with whole groups.

verl unions a rollout's output with its batch by ``uid`` and row position,
SkyRL asserts "outputs in the same order as the input batch", slime reshapes
rewards by ``n_samples_per_prompt`` (and treats a short group as one group).
So a rollout never leaves a hole: every (task, sample) of the batch gets a
row, at its place (task index, then sample). A failed trajectory, or one with
no record at all (the run stopped before it finished), becomes a
*placeholder*: its tokens as far as they went, a response mask of zeros (no
token trains), reward null, and ``placeholder.reason`` saying why
(docs/rollouts.md, "Export to a trainer"). ``failed="drop"`` leaves them out
instead (groups then come short), ``failed="keep"`` keeps failed records as
written (a missing one still becomes a placeholder).

A placeholder's reward is null in the record; a trainer's numeric reward field
gets ``placeholder.reward_fill``, the mean of its scored siblings, so the
group's mean, the GRPO baseline, does not move (null when no sibling has one).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from heddle.exceptions import OutputError

__all__ = ["FAILED_ROWS", "is_placeholder", "order_rows", "placeholder_record"]

Row = dict[str, Any]

FAILED_ROWS = ("placeholder", "drop", "keep")  # what a failed trajectory becomes


def is_placeholder(rec: Mapping[str, Any]) -> bool:
    return isinstance(rec.get("placeholder"), Mapping)


def placeholder_record(
    task_id: str,
    sample: int,
    task_index: int,
    reason: str,
    *,
    failed: Mapping[str, Any] | None = None,
    sibling: Mapping[str, Any] | None = None,
) -> Row:
    """The row of a trajectory that produced nothing to train on.

    ``failed`` is its record when one was written (its tokens are kept, so lengths
    stay real), ``sibling`` another sample of the task, for the prompt and the
    task's fields when there is no record.
    """
    if failed is not None:
        rec: Row = dict(failed)
    else:
        src = sibling or {}
        prompt = list(src.get("prompt_token_ids") or [])
        messages = list(src.get("messages") or [])
        first = next(
            (i for i, m in enumerate(messages) if m.get("role") == "assistant"), len(messages)
        )
        rec = {
            "task_id": task_id,
            "sample": sample,
            "trajectory_id": None,
            "status": "failed",
            "finish_reason": "missing",
            "error": reason,
            "messages": messages[:first],
            "prompt_token_ids": prompt,
            "response_token_ids": [],
            "response_mask": [],
            "turns": 0,
            "tool_calls": 0,
            "tool_errors": 0,
            "policy": src.get("policy"),
            "weight_version": src.get("weight_version"),
            "metadata": dict(src.get("metadata") or {}),
            "task_fields": dict(src.get("task_fields") or {}),
            "reward_info": None,
            "reward_error": None,
        }
        if "response_logprobs" in src:
            rec["response_logprobs"] = []
    rec["task_index"] = task_index
    rec["response_mask"] = [0] * len(rec["response_token_ids"])
    rec["reward"] = None
    rec["placeholder"] = {"reason": reason, "reward_fill": None}
    return rec


def _reason(rec: Mapping[str, Any]) -> str:
    why = rec.get("error") or rec.get("reward_error") or rec.get("finish_reason") or "failed"
    return str(why)


def order_rows(
    records: Iterable[Row],
    *,
    failed: str = "placeholder",
    tasks: Sequence[str] | None = None,
    samples: int | None = None,
) -> list[Row]:
    """``records`` in batch order, with a placeholder wherever a row would be missing.

    ``tasks`` (task ids in input order) and ``samples`` give the batch when the caller
    knows it (an adapter does); otherwise it is the tasks that have records, in task
    order, and as many samples as the largest sample number seen.
    """
    if failed not in FAILED_ROWS:
        raise OutputError(f"failed={failed!r} is not one of {', '.join(FAILED_ROWS)}")
    by_task: dict[str, dict[int, Row]] = {}
    order: dict[str, int] = {}
    for rec in records:
        task_id, sample = rec["task_id"], rec["sample"]
        index = rec.get("task_index")
        order.setdefault(task_id, index if isinstance(index, int) else len(order))
        by_task.setdefault(task_id, {})[sample] = rec
    if tasks is None:
        tasks = sorted(by_task, key=lambda t: order[t])
        positions = {t: order[t] for t in tasks}
    else:
        positions = {t: i for i, t in enumerate(tasks)}
    width = (
        samples
        if samples is not None
        else max((s + 1 for group in by_task.values() for s in group), default=0)
    )
    rows: list[Row] = []
    for task_id in tasks:
        group = by_task.get(task_id, {})
        sibling = next((r for r in group.values() if r.get("status") != "failed"), None)
        sibling = sibling or next(iter(group.values()), None)
        made: list[Row] = []
        for sample in range(max(width, max(group, default=-1) + 1)):
            got = group.get(sample)
            if got is not None and (got.get("status") != "failed" or failed == "keep"):
                made.append(got)
            elif failed == "placeholder" or (got is None and failed == "keep"):
                reason = (
                    _reason(got)
                    if got is not None
                    else "no record was written: the run ended before this trajectory finished"
                )
                made.append(
                    placeholder_record(
                        task_id, sample, positions[task_id], reason, failed=got, sibling=sibling
                    )
                )
        scored = [
            float(r["reward"])
            for r in made
            if not is_placeholder(r) and isinstance(r.get("reward"), int | float)
        ]
        fill = sum(scored) / len(scored) if scored else None
        for r in made:
            if is_placeholder(r):
                r["placeholder"]["reward_fill"] = fill
        rows += made
    return rows
