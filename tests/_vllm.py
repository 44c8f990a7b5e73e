"""The one rule for tests that need vLLM: skip without it locally, fail without it in CI."""

from __future__ import annotations

import importlib.util
import os

import pytest


def require_vllm() -> None:
    """Call at module level. `make test` (CI) installs vLLM, so under CI it must be there.

    It looks the package up without importing it: importing vLLM (and torch) takes seconds,
    and every pytest process collects these modules, ``-m 'not slow'`` runs included.
    """
    if importlib.util.find_spec("vllm") is not None:
        return
    if os.environ.get("CI"):
        raise ImportError("vLLM's CPU build is not installed: run `make setup`")
    pytest.skip("vLLM's CPU build is not installed (make setup)", allow_module_level=True)


def _suffix_available() -> bool:
    from heddle.worker import suffix_available

    return suffix_available()


# vLLM's suffix decoding needs arctic-inference, which `make setup` builds: skipped without
# it locally, run (and so failing) without it in CI, as require_vllm does.
needs_suffix = pytest.mark.skipif(
    not os.environ.get("CI") and not _suffix_available(),
    reason="arctic-inference is not installed (make setup builds it)",
)
