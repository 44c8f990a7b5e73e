"""The one rule for tests that need vLLM: skip without it locally, fail without it in CI."""

from __future__ import annotations

import os

import pytest


def require_vllm() -> None:
    """Call at module level. `.ci/run` installs the extra, so a missing vLLM under CI fails."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip(
            "the vllm extra is not installed (pip install -e '.[vllm]')", allow_module_level=True
        )
