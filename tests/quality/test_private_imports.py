"""No package reaches into another's private modules: each goes through the other's front.

``heddle.scheduler.sim`` counts as part of the scheduler, the CLI and the benchmarks as
packages of their own, and ``heddle/*.py`` (the client, the exceptions) as the top package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ._tree import ROOT

pytestmark = pytest.mark.quality

PACKAGES = {  # folder -> the import it is
    "scheduler": "heddle.scheduler",
    "worker": "heddle.worker",
    "api": "heddle.api",
    "rollout": "heddle.rollout",
    "operator/heddle_operator": "heddle.operator",
    "heddle/bench": "heddle.bench",
    "heddle/cli": "heddle.cli",
}


def _crossings(module: str, source: str) -> list[str]:
    """Imports in ``source`` (of package ``module``) of another package's ``_private`` module."""
    out = []
    for node in ast.walk(ast.parse(source)):
        names = []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            private = next((i for i, p in enumerate(parts) if p.startswith("_")), None)
            if parts[0] != "heddle" or private is None or private < 1:
                continue
            owner = ".".join(parts[:private])
            if not (module == owner or module.startswith(owner + ".")):
                out.append(name)
    return out


def _package_of(path: Path) -> str:
    rel = path.relative_to(ROOT).as_posix()
    for folder, package in sorted(PACKAGES.items(), key=lambda kv: -len(kv[0])):
        if rel.startswith(folder + "/"):
            return package
    return "heddle"


@pytest.mark.slow
def test_no_package_imports_another_ones_private_modules() -> None:
    found = []
    for folder in [*PACKAGES, "scheduler/sim", "heddle"]:
        for path in sorted((ROOT / folder).glob("*.py")):
            for name in _crossings(_package_of(path), path.read_text(encoding="utf-8")):
                found.append(f"{path.relative_to(ROOT)}: {name}")
    assert not found, "import these through the package's front:\n" + "\n".join(found)


def test_the_check_finds_a_crossing() -> None:
    source = "from heddle.rollout._run import x\nfrom heddle.operator import y\n"
    assert _crossings("heddle.operator", source) == ["heddle.rollout._run"]
    assert _crossings("heddle.rollout", source) == []  # its own private module
