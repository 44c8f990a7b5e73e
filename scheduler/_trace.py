"""Workloads for the benchmark: drawn from a synthetic spec, or replayed from a trace.

A trace is one JSON object per trajectory (docs/workloads.md): its GRPO group,
prompt tokens, output tokens per turn, and the latency and reply tokens of
each tool call between turns. A Heddle output file is a trace too: every
record carries the same facts under ``trace``, so a user can ask "would
Heddle help on my rollouts?" by replaying what their framework produced.
A Heddle *token trace* (``heddle run --trace``; :data:`TRACE_FORMAT` version
:data:`TRACE_VERSION`) holds each step's token ids and timings as well; the
generated ids stay on the script for replaying drafts against them.

Errors name the line and the field; they never quote the line (a trace may
be any file a user points at).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from heddle.exceptions import WorkloadError

from ._evaluation import history_of
from ._types import FinishedTrajectory
from ._workload import TrajectoryScript, WorkloadSpec, generate

__all__ = [
    "TRACE_FORMAT",
    "TRACE_VERSION",
    "BenchWorkload",
    "scripts_from_trace",
    "synthetic_bench",
    "trace_bench",
]

# A token trace line says what it is: {"task_id", "sample", "format": TRACE_FORMAT,
# "version": TRACE_VERSION, ..., "steps": [...]} (docs/workloads.md, "Token traces").
TRACE_FORMAT = "heddle-trace"
TRACE_VERSION = 1

# History for the predictor comes from another draw of the same distribution,
# as the previous RL iteration's rollout would (other prompts, same task mix).
HISTORY_SEED_OFFSET = 1000


@dataclass(frozen=True)
class BenchWorkload:
    """What a benchmark simulates: the scripts, the predictor's history, mean tool latencies."""

    name: str
    scripts: tuple[TrajectoryScript, ...]
    history: tuple[FinishedTrajectory, ...]
    tool_means_s: Mapping[str, float]
    source: str = "synthetic"  # or "trace"


def synthetic_bench(spec: WorkloadSpec, seed: int) -> BenchWorkload:
    means = {t.name: t.latency_s.median * math.exp(0.5 * t.latency_s.sigma**2) for t in spec.tools}
    return BenchWorkload(
        spec.name,
        tuple(generate(spec, seed)),
        tuple(history_of(generate(spec, seed + HISTORY_SEED_OFFSET))),
        means,
    )


def trace_bench(name: str, scripts: Sequence[TrajectoryScript]) -> BenchWorkload:
    """A replay: no history (nothing from the trace may leak into the predictor's prior)."""
    by_tool: dict[str, list[float]] = defaultdict(list)
    for s in scripts:
        for tool, latency in zip(s.tool_names, s.tool_latency_s, strict=True):
            by_tool[tool].append(latency)
    means = {tool: sum(v) / len(v) for tool, v in by_tool.items()}
    return BenchWorkload(name, tuple(scripts), (), means, source="trace")


def _ints(value: Any, where: str, field: str, *, minimum: int) -> list[int]:
    if not isinstance(value, list) or not all(
        isinstance(x, int) and not isinstance(x, bool) and x >= minimum for x in value
    ):
        raise WorkloadError(f"{where}: '{field}' must be a list of integers >= {minimum}")
    return list(value)


def _floats(value: Any, where: str, field: str) -> list[float]:
    if not isinstance(value, list) or not all(
        isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x >= 0
        for x in value
    ):
        raise WorkloadError(f"{where}: '{field}' must be a list of non-negative seconds")
    return [float(x) for x in value]


def _token_script(row: Mapping[str, Any], where: str, index: int) -> TrajectoryScript:
    """A token-trace line: step lengths from the ids, tool gaps from each step's ``tool_s``."""
    version = row.get("version")
    if version != TRACE_VERSION:
        raise WorkloadError(
            f"{where}: {TRACE_FORMAT} version {version!r} is not one this Heddle reads "
            f"({TRACE_VERSION}); re-record it with this version's heddle run --trace"
        )
    group, sample = row.get("group"), row.get("sample", 0)
    if not isinstance(group, str) or not group:
        raise WorkloadError(f"{where}: the trajectory's 'group' is missing")
    if not isinstance(sample, int) or isinstance(sample, bool) or sample < 0:
        raise WorkloadError(f"{where}: 'sample' must be an integer >= 0")
    steps = row.get("steps")
    if not isinstance(steps, list) or not steps or not all(isinstance(s, Mapping) for s in steps):
        raise WorkloadError(f"{where}: 'steps' must be a non-empty list of step objects")
    inputs = [_ints(s.get("input_token_ids"), where, "input_token_ids", minimum=0) for s in steps]
    outputs = [
        _ints(s.get("output_token_ids"), where, "output_token_ids", minimum=0) for s in steps
    ]
    if not inputs[0]:
        raise WorkloadError(f"{where}: the first step's 'input_token_ids' (the prompt) is empty")
    gaps = [s.get("tool_s") for s in steps[:-1]]
    if not all(
        isinstance(g, int | float) and not isinstance(g, bool) and math.isfinite(g) and g >= 0
        for g in gaps
    ):
        raise WorkloadError(f"{where}: every step but the last needs 'tool_s' (seconds >= 0)")
    names = [s.get("tools") or ["tool"] for s in steps[:-1]]
    if not all(isinstance(n, list) and all(isinstance(x, str) for x in n) for n in names):
        raise WorkloadError(f"{where}: a step's 'tools' must be a list of tool names")
    return TrajectoryScript(
        id=f"{group}-s{sample:02d}-{index}",
        group_id=group,
        sample=sample,
        prompt_tokens=len(inputs[0]),
        # A step that generated nothing (an empty turn) still costs one step: at least 1.
        turn_tokens=tuple(max(1, len(o)) for o in outputs),
        tool_names=tuple(",".join(n) for n in names),
        tool_latency_s=tuple(float(g) for g in gaps),
        tool_output_tokens=tuple(len(i) for i in inputs[1:]),
        step_token_ids=tuple(tuple(o) for o in outputs),
    )


def _script(row: Any, where: str, index: int) -> TrajectoryScript:
    if not isinstance(row, Mapping):
        raise WorkloadError(f"{where}: expected a JSON object per line")
    if row.get("format") == TRACE_FORMAT:
        return _token_script(row, where, index)
    if "trace" in row:  # a Heddle output record
        facts = row["trace"]
        if not isinstance(facts, Mapping):
            raise WorkloadError(f"{where}: 'trace' must be an object")
        tokens = row.get("tokens")
        prompt = tokens.get("prompt") if isinstance(tokens, Mapping) else None
        group = row.get("task_id")
        sample = row.get("sample", 0)
    else:
        facts = row
        prompt = row.get("prompt_tokens")
        group = row.get("group")
        sample = row.get("sample", 0)
    if not isinstance(group, str) or not group:
        raise WorkloadError(f"{where}: the trajectory's group ('group', or 'task_id') is missing")
    if not isinstance(prompt, int) or isinstance(prompt, bool) or prompt < 1:
        raise WorkloadError(f"{where}: prompt tokens must be an integer >= 1")
    if not isinstance(sample, int) or isinstance(sample, bool) or sample < 0:
        raise WorkloadError(f"{where}: 'sample' must be an integer >= 0")
    turns = _ints(facts.get("turn_tokens"), where, "turn_tokens", minimum=1)
    if not turns:
        raise WorkloadError(f"{where}: 'turn_tokens' is empty; a trajectory has at least one turn")
    latency = _floats(facts.get("tool_latency_s", []), where, "tool_latency_s")
    replies = _ints(facts.get("tool_output_tokens", []), where, "tool_output_tokens", minimum=0)
    calls = len(turns) - 1
    if len(latency) < calls or len(replies) < calls:
        raise WorkloadError(
            f"{where}: {len(turns)} turns need {calls} tool calls between them, but "
            f"'tool_latency_s' has {len(latency)} and 'tool_output_tokens' {len(replies)}"
        )
    names = facts.get("tool_names", ["tool"] * calls)
    if (
        not isinstance(names, list)
        or len(names) < calls
        or not all(isinstance(n, str) for n in names)
    ):
        raise WorkloadError(f"{where}: 'tool_names' must name each of the {calls} tool calls")
    return TrajectoryScript(
        id=f"{group}-s{sample:02d}-{index}",
        group_id=group,
        sample=sample,
        prompt_tokens=prompt,
        turn_tokens=tuple(turns),
        tool_names=tuple(names[:calls]),
        tool_latency_s=tuple(latency[:calls]),
        tool_output_tokens=tuple(replies[:calls]),
    )


def scripts_from_trace(rows: Iterable[tuple[str, Any]]) -> list[TrajectoryScript]:
    """Scripts from ``(where, parsed JSON)`` pairs; unfinished Heddle records are skipped."""
    scripts: list[TrajectoryScript] = []
    for where, row in rows:
        heddle = isinstance(row, Mapping) and ("trace" in row or row.get("format") == TRACE_FORMAT)
        if heddle and row.get("status") not in (None, "done"):
            continue  # failed or truncated: its length is not the trajectory's own
        scripts.append(_script(row, where, len(scripts)))
    if not scripts:
        raise WorkloadError("the trace holds no finished trajectory")
    return scripts
