"""Task rows as trainers write them: verl, slime and SkyRL, in JSONL or parquet.

A row in a trainer's format becomes a Heddle task; the fields Heddle does not
use (``data_source``, ``reward_model``, ``label``, ``env_class``, ...) are
kept whole as the task's ``fields`` and come back in every record as
``task_fields``, so the reward and the export see them (docs/rollouts.md,
"Trainers' task rows"). Sources, read for the field names:

- verl: ``examples/data_preprocess/gsm8k.py`` (``data_source``, ``prompt`` as
  chat messages, ``ability``, ``reward_model`` {style, ground_truth},
  ``extra_info`` {split, index, ...});
- slime: ``slime/utils/data.py`` (the prompt under ``--input-key``, ``text`` by
  default, often ``prompt``; ``label``; ``metadata``);
- SkyRL: ``skyrl-train/examples/gsm8k/gsm8k_dataset.py`` (``prompt``,
  ``env_class``, ``reward_spec`` {method, ground_truth}, ``extra_info``).
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import importlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from heddle.exceptions import ManifestError, TaskError

__all__ = ["TRAINER_KEYS", "parquet_rows", "split_trainer_row"]

# A row with any of these (or a prompt that is a list of messages) is a trainer's row.
TRAINER_KEYS = frozenset(
    {"data_source", "ability", "reward_model", "extra_info", "label", "env_class", "reward_spec"}
)
_HEDDLE_KEYS = frozenset({"id", "messages", "prompt", "system", "metadata", "tools"})


def split_trainer_row(raw: Any, where: str) -> tuple[Any, dict[str, Any]]:
    """(a Heddle task entry, the row's other fields) for a trainer's row; others pass unchanged."""
    if not isinstance(raw, Mapping):
        return raw, {}
    # slime reads its --input-key, "text" unless set; verl and SkyRL read "prompt".
    key = "prompt" if "prompt" in raw or "text" not in raw else "text"
    prompt = raw.get(key)
    if not (TRAINER_KEYS & set(raw) or isinstance(prompt, list)):
        return raw, {}
    if prompt is None and raw.get("messages") is None:
        raise TaskError(
            where,
            "this verl/slime/SkyRL row has neither prompt nor messages; give prompt (a list of "
            "{role, content} messages, or a string; slime's default text works too) or messages",
        )
    entry: dict[str, Any] = {
        k: raw[k] for k in ("id", "system", "metadata", "messages", "tools") if k in raw
    }
    if isinstance(prompt, list):
        if "messages" in raw:
            raise TaskError(where, "give either prompt or messages, not both")
        entry["messages"] = prompt
    elif prompt is not None:
        entry["prompt"] = prompt
    index = (
        raw.get("extra_info", {}).get("index")
        if isinstance(raw.get("extra_info"), Mapping)
        else None
    )
    if "id" not in entry and isinstance(index, int | str) and not isinstance(index, bool):
        entry["id"] = index  # verl and SkyRL number their rows in extra_info.index
    return entry, {k: v for k, v in raw.items() if k not in _HEDDLE_KEYS and k != key}


def parquet_rows(path: Path) -> Iterator[tuple[str, str, Any]]:
    """(where, default id, row) per row of a parquet file; needs pyarrow, which is optional."""
    try:
        parquet: Any = importlib.import_module("pyarrow.parquet")
    except ImportError:
        raise ManifestError(
            f"{path} is a parquet file and reading one needs pyarrow, which is not installed; "
            "pip install pyarrow, or give the tasks as JSONL"
        ) from None
    try:
        rows = parquet.read_table(path).to_pylist()
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise ManifestError(
            f"{path} is not a readable parquet file ({exc}); fix spec.tasks.path"
        ) from None
    for number, row in enumerate(rows, start=1):
        yield f"{path} row {number}", f"row-{number}", _without_nulls(row)


def _without_nulls(value: Any) -> Any:
    """Parquet gives every row every field of a struct column (null where a row had none):
    a message would gain ``tool_calls: null``, ``extra_info`` another row's keys. Values
    JSON has no type for (timestamps, decimals, bytes) become strings: the row is copied
    into records and sent to reward endpoints as JSON."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_without_nulls(v) for v in value]
    if isinstance(value, dt.date | dt.time):  # datetime is a date
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    return value
