"""A link farm that lays the source folders out as the installed ``heddle`` package.

mypy and import-linter discover packages on disk; the editable install maps
``scheduler/`` to ``heddle.scheduler`` through an import hook they cannot
see. Symlinks give them the real layout without copying anything.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUBPACKAGES = {
    "scheduler": "scheduler",
    "worker": "worker",
    "api": "api",
    "rollout": "rollout",
    "operator": "operator/heddle_operator",
    "integrations": "integrations",
}


def link_farm(base: Path) -> Path:
    """Create ``base/heddle`` mirroring the package; return ``base``."""
    pkg = base / "heddle"
    pkg.mkdir(parents=True, exist_ok=True)
    for source in (ROOT / "heddle").iterdir():
        if source.suffix in (".py", ".typed") or (source / "__init__.py").exists():
            (pkg / source.name).symlink_to(source)
    for name, folder in SUBPACKAGES.items():
        (pkg / name).symlink_to(ROOT / folder, target_is_directory=True)
    return base
