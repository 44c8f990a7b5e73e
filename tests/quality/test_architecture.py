"""Architecture rules, the linter and the type checker, run as tests so CI and developers agree."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ._tree import ROOT, link_farm

pytestmark = pytest.mark.quality

# The scheduler may import the standard library, numpy, itself and the shared
# exceptions module; nothing else (DESIGN.md: "heddle.scheduler is pure").
ALLOWED_THIRD_PARTY = {"numpy"}
ALLOWED_HEDDLE = ("heddle.scheduler", "heddle.exceptions")


def imports_of(path: Path, package: str) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: stays inside the package it is in
                found.append((node.lineno, package))
            elif node.module:
                found.append((node.lineno, node.module))
    return found


def violations(folder: Path, package: str) -> list[str]:
    bad = []
    for path in sorted(folder.rglob("*.py")):
        for line, module in imports_of(path, package):
            top = module.split(".")[0]
            if top in sys.stdlib_module_names or top in ALLOWED_THIRD_PARTY:
                continue
            if module == package or module.startswith(ALLOWED_HEDDLE):
                continue
            bad.append(f"{path.relative_to(folder)}:{line}: imports {module}")
    return bad


def test_scheduler_imports_only_stdlib_numpy_and_itself() -> None:
    assert violations(ROOT / "scheduler", "heddle.scheduler") == []


def test_the_purity_check_catches_a_forbidden_import(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text("import kopf\nfrom httpx import Client\nimport numpy\n")
    assert len(violations(tmp_path, "heddle.scheduler")) == 2


def test_exceptions_module_is_stdlib_only() -> None:
    path = ROOT / "heddle" / "exceptions.py"
    modules = [m for _, m in imports_of(path, "heddle")]
    assert all(m.split(".")[0] in sys.stdlib_module_names for m in modules), modules


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{output}"


def _tool(name: str) -> str:
    path = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed; run: pip install -e '.[dev]'")
    return path


def test_ruff_lint_is_clean() -> None:
    _run([_tool("ruff"), "check", "."], ROOT)


def test_ruff_format_is_clean() -> None:
    _run([_tool("ruff"), "format", "--check", "."], ROOT)


# docs/trainers.md: a trainer's package is imported only by its own adapter module, so
# Heddle installs and imports without any of them.
TRAINER_PACKAGES = ("verl", "slime", "skyrl", "openrlhf", "areal", "roll")  # = adapter modules


def test_a_trainers_package_is_imported_only_by_its_adapter() -> None:
    folders = [ROOT / "heddle", ROOT / "scheduler", ROOT / "worker", ROOT / "api",
               ROOT / "rollout", ROOT / "operator", ROOT / "integrations"]  # fmt: skip
    seen: dict[str, set[str]] = {name: set() for name in TRAINER_PACKAGES}
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            for _, module in imports_of(path, "heddle"):
                top = module.split(".")[0]
                if top in seen:
                    seen[top].add(str(path.relative_to(ROOT)))
    for package in TRAINER_PACKAGES:
        assert seen[package] == {f"integrations/{package}.py"}, (package, seen[package])


def test_mypy_strict_is_clean(tmp_path: Path) -> None:
    farm = link_farm(tmp_path)
    cache = ROOT / ".mypy_cache"
    _run(
        [
            _tool("mypy"),
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(cache),
            "-p",
            "heddle",
        ],
        farm,
    )


def test_import_layers_hold(tmp_path: Path) -> None:
    farm = link_farm(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(farm)}
    _run([_tool("lint-imports"), "--config", str(ROOT / "pyproject.toml"), "--no-cache"], farm, env)
