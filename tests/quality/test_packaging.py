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


def test_every_image_copies_every_package_folder_and_runs_as_non_root() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders = set(config["tool"]["setuptools"]["package-dir"].values())
    stages = re.split(r"^FROM ", (ROOT / "Dockerfile").read_text(), flags=re.M)[1:]
    assert {s.split()[2] for s in stages} == {"worker", "operator"}
    for stage in stages:
        copied = set(re.findall(r"^COPY (\S+) \./", stage, re.M))
        assert folders <= copied, f"{stage.split()[2]} misses {sorted(folders - copied)}"
        assert re.search(r"^USER 10001$", stage, re.M), f"{stage.split()[2]} runs as root"
