"""The live asynchronous rollout (issue #27): the real model on vLLM's CPU build, three
iterations, weights pushed mid-rollout over the trainer API.

examples/async/stream_groups.py with one SmolLM2-135M-Instruct worker: 6 GRPO groups
of 2, a quota of 2 groups an iteration with overSample 0.5 (a third group runs beside
each batch and carries over), 8 tokens a turn, up to 3 turns with tool gaps. A push
loads a checkpoint in place through the worker's ``POST /v1/weights``: versions 1 and
2 are folders of links to the same weights (the worker API reloads whatever the
folder holds; new numbers on the same weights keep the test small).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .._vllm import require_vllm

pytestmark = pytest.mark.slow  # a real engine on a real model

require_vllm()

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "async" / "stream_groups.py"


def test_three_iterations_with_pushes_on_the_real_model(tmp_path: Path) -> None:
    pytest.importorskip("gguf", reason="make setup installs gguf (requirements/smollm2-deps.txt)")
    from heddle.worker import ensure_smollm2

    ensure_smollm2(install=False)
    summary = tmp_path / "summary.json"
    cmd = [sys.executable, str(EXAMPLE), "--engine", "vllm", "--model", "smollm2",
           "--max-tokens", "8", "--train-s", "0.2",
           "--out", str(tmp_path / "out"), "--summary", str(summary)]  # fmt: skip
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    got = json.loads(summary.read_text())
    print(proc.stdout, f"whole run {time.monotonic() - started:.1f} s")
    # Nothing lost or duplicated; every segment on a version served then; the bound held.
    assert got["wrong"] == []
    assert got["records"] == 12 and got["pushes"] == 2
    assert [b["weight_version"] for b in got["batches"]] == ["0", "1", "2"]
    assert [len(b["groups"]) for b in got["batches"]] == [2, 2, 2]
    assert max(s for b in got["batches"] for s in b["staleness"]) <= 1
    # The pushes came mid-rollout: groups were still open when each batch was taken.
    assert all(b["open_after_take"] > 0 for b in got["batches"][:2])
    lengths = got["lengths"]
    assert lengths["trained"] == lengths["started"] == 12
