"""Task sets: inline entries or a JSONL file, one task per line.

A task is ``{"id": ..., "messages": [{"role", "content"}, ...]}`` or
``{"id": ..., "prompt": "..."}`` (a single user message), with an optional
``system`` string, a free-form ``metadata`` object copied to the output, and
``tools``: OpenAI function schemas for this task, used instead of the job's.
Rows as verl, slime and SkyRL write them, and parquet files, are read too
(``_formats.py``). A malformed entry is reported with its line number and
skipped; the others go on (docs/rollouts.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from heddle.api import read_text
from heddle.exceptions import ManifestError, TaskError
from heddle.worker import tool_schema_error

from ._formats import parquet_rows, split_trainer_row

__all__ = ["Task", "TaskSet", "parse_task", "read_tasks"]

_ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class Task:
    id: str
    messages: tuple[Mapping[str, str], ...]
    metadata: Mapping[str, Any] = field(default_factory=dict)
    fields: Mapping[str, Any] = field(default_factory=dict)  # a trainer row's own (_formats.py)
    tools: tuple[Mapping[str, Any], ...] | None = None  # None: the job's tool schemas


@dataclass
class TaskSet:
    """The valid tasks, in order, and the errors of the entries that were not."""

    tasks: list[Task]
    errors: list[TaskError]


def parse_task(raw: Any, where: str, default_id: str) -> Task:
    """One task entry; raises :class:`TaskError` naming ``where`` and the fault."""
    raw, fields = split_trainer_row(raw, where)
    if not isinstance(raw, Mapping):
        raise TaskError(where, f"a task must be a JSON object, got {_kind(raw)}")
    unknown = set(raw) - {"id", "messages", "prompt", "system", "metadata", "tools"}
    if unknown:
        raise TaskError(
            where,
            f"{len(unknown)} unknown field(s); use id, messages|prompt, system, metadata, tools",
        )
    task_id = raw.get("id", default_id)
    if not isinstance(task_id, str | int) or isinstance(task_id, bool) or str(task_id) == "":
        raise TaskError(where, f"id must be a non-empty string or an integer, got {_kind(task_id)}")
    if ("messages" in raw) == ("prompt" in raw):
        raise TaskError(where, "give either messages (a list) or prompt (a string)")
    messages: list[Mapping[str, str]] = []
    system = raw.get("system")
    if system is not None:
        if not isinstance(system, str):
            raise TaskError(where, f"system must be a string, got {_kind(system)}")
        messages.append({"role": "system", "content": system})
    if "prompt" in raw:
        if not isinstance(raw["prompt"], str) or not raw["prompt"]:
            raise TaskError(where, "prompt must be a non-empty string")
        messages.append({"role": "user", "content": raw["prompt"]})
    else:
        listed = raw["messages"]
        if not isinstance(listed, list) or not listed:
            raise TaskError(where, "messages must be a non-empty list of {role, content}")
        for i, m in enumerate(listed):
            if not isinstance(m, Mapping) or set(m) != {"role", "content"}:
                raise TaskError(where, f"messages[{i}] must have exactly role and content")
            if m["role"] not in _ROLES or not isinstance(m["content"], str):
                raise TaskError(
                    where, f"messages[{i}]: role must be one of {list(_ROLES)} and content a string"
                )
            messages.append({"role": m["role"], "content": m["content"]})
    metadata = raw.get("metadata", {})
    if not isinstance(metadata, Mapping):
        raise TaskError(where, f"metadata must be an object, got {_kind(metadata)}")
    return Task(str(task_id), tuple(messages), dict(metadata), fields, _tools(raw, where))


def _tools(raw: Mapping[str, Any], where: str) -> tuple[Mapping[str, Any], ...] | None:
    if "tools" not in raw:
        return None
    tools = raw["tools"]
    if not isinstance(tools, list):
        raise TaskError(where, f"tools must be a list of OpenAI function tools, got {_kind(tools)}")
    for i, tool in enumerate(tools):
        if (error := tool_schema_error(tool, f"tools[{i}]")) is not None:
            raise TaskError(where, error)
    return tuple(tools)


def _kind(value: Any) -> str:
    # Values are never quoted: the file may not be a task file at all (docs/rollouts.md).
    return "null" if value is None else f"a {type(value).__name__}"


def _collect(entries: Iterable[tuple[str, str, Any]]) -> TaskSet:
    tasks: list[Task] = []
    errors: list[TaskError] = []
    seen: dict[str, str] = {}
    for where, default_id, raw in entries:
        try:
            task = parse_task(raw, where, default_id)
            if task.id in seen:
                raise TaskError(where, f"id {task.id!r} repeats the task at {seen[task.id]}")
        except TaskError as exc:
            errors.append(exc)
            continue
        seen[task.id] = where
        tasks.append(task)
    return TaskSet(tasks, errors)


def _lines(text: str, source: str) -> Iterable[tuple[str, str, Any]]:
    # JSONL lines end at "\n" only: splitlines() would also split at U+2028 or U+0085,
    # which JSON allows unescaped inside strings.
    for number, line in enumerate(text.removeprefix("\ufeff").split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{source} line {number}"
        try:
            raw: Any = json.loads(line)
        except json.JSONDecodeError as exc:
            raw = _Unparsable(f"not valid JSON ({exc.msg} at column {exc.colno})")
        yield where, f"line-{number}", raw


class _Unparsable:
    def __init__(self, reason: str) -> None:
        self.reason = reason


def read_tasks(
    *, inline: Sequence[Any] | None = None, path: Path | None = None, text: str | None = None
) -> TaskSet:
    """Tasks from inline entries, a JSONL file, or JSONL text (a ConfigMap's value)."""
    if inline is not None:
        return _collect((f"tasks.inline[{i}]", f"task-{i}", raw) for i, raw in enumerate(inline))
    source = "tasks"
    if path is not None and path.suffix == ".parquet":
        return _collect(parquet_rows(path))
    if path is not None:
        source = str(path)
        text = read_text(path, "task file", "fix spec.tasks.path", ManifestError)
    if text is None:
        raise ManifestError("no task source given")
    entries = list(_lines(text, source))
    result = _collect(
        (where, default_id, raw)
        for where, default_id, raw in entries
        if not isinstance(raw, _Unparsable)
    )
    bad = [TaskError(w, raw.reason) for w, _, raw in entries if isinstance(raw, _Unparsable)]
    result.errors = sorted([*result.errors, *bad], key=lambda e: _line_of(e.where))
    return result


def _line_of(where: str) -> int:
    tail = where.rsplit(" ", 1)[-1]
    return int(tail) if tail.isdigit() else 0
