"""Paths a RolloutJob names, confined to the operator's data root.

A job's creator must not read (or overwrite) what only the operator can, e.g.
its service-account token: every path a job names resolves inside the root,
and a path that leaves it (``..``, an absolute path elsewhere, a symlink out)
is refused after ``resolve()`` (docs/operator.md, "Files").
"""

from __future__ import annotations

from pathlib import Path

from heddle.exceptions import ManifestError

__all__ = ["DATA_ROOT", "confine"]

DATA_ROOT = Path("/data")  # the operator's default data root (--data-root)


def confine(value: str, root: Path, field: str) -> Path:
    """``value`` resolved under ``root`` (relative paths resolve inside it), or a refusal."""
    base = root.resolve()
    path = Path(value)
    resolved = (path if path.is_absolute() else base / path).resolve()
    if not resolved.is_relative_to(base):
        raise ManifestError(
            f"{field}={value!r} lies outside the operator's data root {base}; "
            "give a path inside it (relative paths resolve inside it)"
        )
    return resolved
