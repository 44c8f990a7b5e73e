"""Packaging: the Dockerfile lints clean and ships every package folder."""

from __future__ import annotations

import re
import subprocess
import tomllib

import pytest

from ._tree import ROOT
from .test_architecture import _tool

pytestmark = pytest.mark.quality


def test_dockerfile_passes_hadolint() -> None:
    result = subprocess.run(
        [_tool("hadolint"), str(ROOT / "Dockerfile")], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_worker_image_copies_every_package_folder() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders = set(config["tool"]["setuptools"]["package-dir"].values())
    copied = set(re.findall(r"^COPY (\S+) \./", (ROOT / "Dockerfile").read_text(), re.M))
    assert folders <= copied, f"Dockerfile misses {sorted(folders - copied)}"
