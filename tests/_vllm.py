"""The one rule for tests that need vLLM: skip without it locally, fail without it in CI."""

from __future__ import annotations

import os

import pytest


def require_vllm() -> None:
    """Call at module level. `make test` (CI) installs vLLM, so under CI it must be there."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip("vLLM's CPU build is not installed (make setup)", allow_module_level=True)
