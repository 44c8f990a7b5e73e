"""Read a Heddle rollout output as a trainer's samples (docs/rollouts.md, "Export to a trainer").

>>> from heddle.export import read_rollouts, collate_verl
>>> rows = read_rollouts("rollout.jsonl", "verl")        # doctest: +SKIP
>>> tensors, non_tensors = collate_verl(rows)            # doctest: +SKIP

``read_rollouts(path, trainer)`` gives one row per trajectory, ordered by task
index then sample, in the field names of ``trainer`` (``verl``, ``slime``,
``skyrl``, ``openrlhf``); ``collate_verl`` pads verl rows into the arrays of a
``DataProto``; ``collate_skyrl`` lists SkyRL rows into a ``GeneratorOutput``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from heddle.rollout import TRAINERS, collate_skyrl, collate_verl, export_rows

__all__ = ["TRAINERS", "collate_skyrl", "collate_verl", "read_rollouts"]


def read_rollouts(
    path: str | Path, trainer: str, *, keep_failed: bool = False
) -> list[dict[str, Any]]:
    """The trajectories of a Heddle output as ``trainer``'s rows (failed ones left out)."""
    return export_rows(Path(path), trainer, keep_failed=keep_failed)
