"""A trainer that only wants HTTP imports ``heddle.client`` without kopf or the Kubernetes client.

Checked in a fresh interpreter, where ``sys.modules`` shows everything the import loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ._tree import ROOT

pytestmark = pytest.mark.quality

HEAVY = ("kopf", "kubernetes")


def _heavy_after(module: str) -> list[str]:
    """Which of HEAVY a fresh interpreter has loaded after ``import module``."""
    code = (
        f"import json, sys, {module}\n"
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout.splitlines()[-1]))


@pytest.mark.slow
def test_the_client_loads_neither_kopf_nor_the_kubernetes_client() -> None:
    assert _heavy_after("heddle.client") == []


@pytest.mark.slow
def test_the_check_sees_a_heavy_import() -> None:
    """The operator's front loads kopf, and the probe says so: the check above can fail."""
    assert "kopf" in _heavy_after("heddle.operator")
