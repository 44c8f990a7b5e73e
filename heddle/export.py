"""Read a Heddle rollout output as a trainer's samples (docs/rollouts.md, "Export to a trainer").

>>> from heddle.export import read_rollouts, collate_verl
>>> rows = read_rollouts("rollout.jsonl", "verl")        # doctest: +SKIP
>>> tensors, non_tensors = collate_verl(rows)            # doctest: +SKIP

``read_rollouts(path, trainer)`` gives one row per (task, sample), ordered by
task index then sample, in the field names of ``trainer`` (``verl``, ``slime``,
``skyrl``, ``openrlhf``, ``areal``, ``roll``), a failed or missing trajectory as a
placeholder row (mask all zero) unless ``failed="drop"``; ``collate_verl`` pads
verl rows into the arrays of a ``DataProto``; ``collate_skyrl`` lists SkyRL rows
into a ``GeneratorOutput``. ``order_rows`` and ``convert_records`` do the same for
records in hand (the trainer adapters in ``heddle.integrations`` use them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from heddle.rollout import (
    FAILED_ROWS,
    TRAINERS,
    OutputRecord,
    action_ranges,
    collate_skyrl,
    collate_verl,
    convert_records,
    export_rows,
    is_placeholder,
    order_rows,
)

__all__ = [
    "FAILED_ROWS",
    "TRAINERS",
    "OutputRecord",
    "action_ranges",
    "collate_skyrl",
    "collate_verl",
    "convert_records",
    "is_placeholder",
    "order_rows",
    "read_rollouts",
]


def read_rollouts(
    path: str | Path, trainer: str, *, failed: str = "placeholder"
) -> list[dict[str, Any]]:
    """A Heddle output as ``trainer``'s rows, one per (task, sample), in batch order.

    ``failed``: ``placeholder`` (a row with its mask all zero and reward null, the
    default), ``drop`` (left out: groups come short) or ``keep`` (as written).
    """
    return export_rows(Path(path), trainer, failed=failed)
