"""What a rollout's rewards say, from its output records: ``summary.json``'s ``rewards``.

Per GRPO group (the samples of one task): its mean and spread. A group whose
rewards all agree gives GRPO no signal (every advantage is zero), so the share
of groups with a spread is the number a trainer watches beside the mean.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["read_output_records", "reward_stats"]


def read_output_records(path: Path) -> list[dict[str, Any]]:
    """The records of an output JSONL ("\\n"-separated; a torn last line is skipped)."""
    records = []
    for line in path.read_text(encoding="utf-8").split("\n"):
        if line.strip():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue  # a line cut short by a crash: the resume logic drops it too
    return records


def _std(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def reward_stats(records: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Mean reward and per-group figures; None when no record carries a reward field."""
    groups: dict[str, list[float]] = defaultdict(list)
    scored = unscored = 0
    lengths: list[tuple[int, float]] = []
    seen = False
    for record in records:
        if "reward" not in record or record.get("status") != "done":
            continue
        seen = True
        reward = record.get("reward")
        if reward is None:
            unscored += 1
            continue
        scored += 1
        groups[str(record["task_id"])].append(float(reward))
        lengths.append((int(record["tokens"]["generated"]), float(reward)))
    if not seen or (scored == 0 and unscored == 0):
        return None
    values = [v for group in groups.values() for v in group]
    means = [sum(g) / len(g) for g in groups.values()]
    spreads = [_std(g) for g in groups.values()]
    return {
        "scored": scored,
        "unscored": unscored,  # reward null: see each record's reward_error
        "mean": sum(values) / len(values) if values else None,
        "groups": len(groups),
        "groups_with_spread": sum(1 for s in spreads if s > 0),  # where GRPO has a signal
        "groups_all_best": sum(1 for g in groups.values() if len(set(g)) == 1 and g[0] > 0),
        "groups_all_zero": sum(1 for g in groups.values() if set(g) == {0.0}),
        "mean_group_std": sum(spreads) / len(spreads) if spreads else None,
        "best_group_mean": max(means) if means else None,
        "worst_group_mean": min(means) if means else None,
        "mean_tokens_rewarded": _mean_tokens(lengths, lambda r: r > 0),
        "mean_tokens_unrewarded": _mean_tokens(lengths, lambda r: r <= 0),
    }


def _mean_tokens(lengths: list[tuple[int, float]], keep: Any) -> float | None:
    picked = [n for n, r in lengths if keep(r)]
    return sum(picked) / len(picked) if picked else None
