"""A broken environment is named in one sentence with its fix, before any engine starts.

The broken environments are made the way pip makes them: a ``*.dist-info`` folder
on the path says torchcodec is installed (what `heddle doctor`'s fast check
reads), and a ``vllm`` package that fails to import stands in for vLLM dying on
a library that does not load beside the CPU torch (what its import probe sees).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests._vllm import require_vllm

pytestmark = pytest.mark.slow  # real processes or engines; `-m 'not slow'` skips them

require_vllm()

QUICK = Path(__file__).resolve().parents[2] / "examples" / "synthetic"


def heddle(*args: str, path: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(path))
    return subprocess.run(
        [sys.executable, "-m", "heddle", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture
def torchcodec_installed(tmp_path: Path) -> Path:
    """What `pip install torchcodec` leaves in site-packages, metadata only."""
    info = tmp_path / "torchcodec-0.17.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torchcodec\nVersion: 0.17.0\n")
    return tmp_path


def test_doctor_names_torchcodec_beside_cpu_torch_and_the_fix(torchcodec_installed: Path) -> None:
    done = heddle("doctor", "--quick", path=torchcodec_installed)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "FAIL  cpu-torch-companions   torchcodec 0.17.0 is installed beside" in done.stdout
    assert f"fix: {sys.executable} -m pip uninstall -y torchcodec" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr


@pytest.mark.parametrize(
    "command",
    [
        ("worker", "--engine", "vllm", "--model", "unused"),
        ("run", str(QUICK / "job.yaml"), "--pool", str(QUICK / "pool.yaml")),
    ],
    ids=["worker", "run"],
)
def test_engines_refuse_to_start_in_one_sentence(
    torchcodec_installed: Path, command: tuple[str, ...]
) -> None:
    done = heddle(*command, path=torchcodec_installed)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("heddle: error: torchcodec 0.17.0 is installed beside the CPU")
    assert "make setup" in lines[0]


def test_doctor_reports_the_import_failure_of_a_broken_vllm(tmp_path: Path) -> None:
    broken = tmp_path / "vllm"
    broken.mkdir()
    (broken / "__init__.py").write_text(
        "raise OSError('Could not load this library: libtorchcodec_image.so')\n"
    )
    done = heddle("doctor", path=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert (
        "FAIL  vllm-import            importing vLLM fails: OSError: Could not load this "
        "library: libtorchcodec_image.so"
    ) in done.stdout


def test_doctor_passes_here() -> None:
    done = heddle("doctor", path=Path("/nonexistent"), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ready for the vLLM engine" in done.stdout


def test_a_worker_that_dies_while_starting_is_one_sentence_with_its_cause(tmp_path: Path) -> None:
    """vLLM refuses a model directory whose config names no model type."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["Nope"]}')
    output = tmp_path / "out" / "rollout.jsonl"
    done = heddle(
        "run", str(QUICK / "job.yaml"), "--pool", str(QUICK / "pool.yaml"),
        "--model", str(model), "--output", str(output), "--quiet",
        path=Path("/nonexistent"), timeout=300,
    )  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    # Both workers load the same model; whichever exits first is reported, with its own log.
    found = re.match(r"heddle: error: local worker (worker-[01]-tp1) exited with code", lines[0])
    assert found, lines[0]
    assert "ValidationError" in lines[0] and "model_type" in lines[0]
    assert str(output.parent / "logs" / f"{found.group(1)}.log") in lines[0]
