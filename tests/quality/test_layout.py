"""The top-level ``operator/`` folder must not shadow the standard library's ``operator``.

``operator/`` has no ``__init__.py`` and holds ``heddle_operator`` one level
down (docs/architecture.md). A bare ``operator/__init__.py`` would break
``python -m venv`` from the repository root on Python 3.12 and later, and a
PEP 420 mapping breaks editable installs (setuptools#4943); these tests run the
real interpreters from the repository root to show neither happens.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ._tree import ROOT

pytestmark = pytest.mark.quality

VERSIONS = ["3.11", "3.12", "3.13"]


def _interpreter(version: str) -> str:
    """``python3.X`` on PATH or under pyenv; the running one for its own version."""
    if sys.version.startswith(version + "."):
        return sys.executable
    # pyenv's shims answer "command not found" for a version not selected: use its folders.
    pyenv = Path.home() / ".pyenv" / "versions"
    candidates = sorted(pyenv.glob(f"{version}.*/bin/python{version}")) if pyenv.is_dir() else []
    found = str(candidates[-1]) if candidates else shutil.which(f"python{version}")
    if found is not None and "/shims/" in found:
        found = None
    if found is None:
        pytest.skip(f"no python{version} on this machine (the layout test needs the interpreter)")
    return found


def _clean_env() -> dict[str, str]:
    # No virtualenv or PYTHONPATH of the test run may leak into the interpreter under test.
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def test_operator_folder_has_no_init_and_holds_the_package() -> None:
    assert (ROOT / "operator").is_dir()
    assert not (ROOT / "operator" / "__init__.py").exists()
    assert (ROOT / "operator" / "heddle_operator" / "__init__.py").is_file()


@pytest.mark.parametrize("version", VERSIONS)
def test_the_standard_library_operator_wins_from_the_repository_root(version: str) -> None:
    python = _interpreter(version)
    result = subprocess.run(
        [
            python,
            "-c",
            "import operator, collections, sys; "
            "assert operator.itemgetter, operator.__file__; "
            "assert 'site-packages' not in (operator.__file__ or ''); print(operator.__file__)",
        ],
        cwd=ROOT,
        env=_clean_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert not result.stdout.strip().startswith(str(ROOT)), result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("version", VERSIONS)
def test_venv_and_an_editable_install_work_from_the_repository_root(
    version: str, tmp_path: Path
) -> None:
    python = _interpreter(version)
    venv = tmp_path / "venv"
    made = subprocess.run(
        [python, "-m", "venv", str(venv)],
        cwd=ROOT,
        env=_clean_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    venv_python = str(venv / "bin" / "python")
    installed = subprocess.run(
        [venv_python, "-m", "pip", "install", "-q", "--no-deps", "-e", str(ROOT)],
        cwd=ROOT,
        env=_clean_env(),
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    # find_spec resolves through the editable finder without importing kopf and friends.
    probe = (
        "import importlib.util as u, operator; "
        "assert operator.itemgetter; "
        "specs = [u.find_spec(n) for n in ('heddle.operator', 'heddle.rollout', 'heddle.api')]; "
        "print([s.origin for s in specs])"
    )
    found = subprocess.run(
        [venv_python, "-c", probe],
        cwd=tmp_path,
        env=_clean_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert found.returncode == 0, found.stderr
    assert str(ROOT / "operator" / "heddle_operator" / "__init__.py") in found.stdout
