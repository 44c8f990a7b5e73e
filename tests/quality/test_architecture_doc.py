"""docs/architecture.md lists every module of every package, and only modules that exist."""

from __future__ import annotations

import re

import pytest

from ._tree import ROOT

pytestmark = pytest.mark.quality

FOLDERS = (
    "scheduler",
    "scheduler/sim",
    "worker",
    "api",
    "rollout",
    "operator/heddle_operator",
    "heddle",
    "heddle/bench",
    "heddle/cli",
    "integrations",
)


def _listed(text: str) -> set[str]:
    """Module paths in the first column of the tables under ``## Modules``."""
    section = text.split("\n## Modules\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([\w/]+\.py)` \|", section, flags=re.MULTILINE))


def _on_disk() -> set[str]:
    return {
        f"{folder}/{path.name}"
        for folder in FOLDERS
        for path in (ROOT / folder).glob("*.py")
        if path.name != "__init__.py"
    }


def test_the_module_list_matches_the_tree() -> None:
    listed = _listed((ROOT / "docs" / "architecture.md").read_text(encoding="utf-8"))
    on_disk = _on_disk()
    assert not on_disk - listed, f"add to docs/architecture.md: {sorted(on_disk - listed)}"
    assert not listed - on_disk, f"gone from the tree: {sorted(listed - on_disk)}"


def test_the_check_reads_the_tables() -> None:
    """A made-up page: the parser finds its rows and nothing from other sections."""
    page = "## A\n| `x/_a.py` | a |\n\n## Modules\n\n| `x/_b.py` | b |\n\n## After\n| `x/_c.py` |"
    assert _listed(page) == {"x/_b.py"}
