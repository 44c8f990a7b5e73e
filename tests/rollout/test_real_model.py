"""The real model (SmolLM2-135M-Instruct, `heddle model smollm2`) on real vLLM workers:
the quickstart as README runs it, with rewards that mean something, and the code tasks
scored in the sandbox. CI converts the model once in `make setup` and reuses it here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from heddle.worker import ensure_smollm2

from .._rollout_fixtures import assert_consistent, read_records
from .._vllm import require_vllm

pytestmark = pytest.mark.slow  # real engines on a real model

require_vllm()

ROOT = Path(__file__).resolve().parents[2]
QUICK = ROOT / "examples" / "quickstart"


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "heddle", "run", *args, "--quiet"]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=900, check=False)


@pytest.fixture(scope="module")
def smollm2() -> Path:
    pytest.importorskip("gguf", reason="make setup installs gguf (requirements/smollm2-deps.txt)")
    return ensure_smollm2(install=False)


def test_quickstart_on_the_real_model(tmp_path: Path, smollm2: Path) -> None:
    output = tmp_path / "rollout.jsonl"
    job, pool = str(QUICK / "job.yaml"), str(QUICK / "pool.yaml")
    proc = _run([job, "--pool", pool, "--output", str(output), "--plot"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = read_records(output)
    tasks = [json.loads(line) for line in (QUICK / "tasks.jsonl").read_text().splitlines()]
    assert len(records) == 8 * len(tasks)
    for record in records:
        assert_consistent(record)
        assert record["status"] == "done" and record["reward"] in (0.0, 1.0)
        assert record["reward_info"]["expected"] == record["metadata"]["answer"]
        # The model's own chat template: SmolLM2's default system prompt, ChatML turns.
        assert record["messages"][-1]["role"] == "assistant"
    text = " ".join(r["messages"][-1]["content"] for r in records)
    assert sum(word in text.lower() for word in (" the ", " is ", "answer")) == 3  # English
    rewards = [r["reward"] for r in records]
    # A real model gets some right and some wrong: the rewards carry a signal for GRPO.
    assert 0.0 < sum(rewards) / len(rewards) < 1.0
    summary = json.loads(output.with_name(output.name + ".summary.json").read_text())
    stats = summary["rewards"]
    assert stats["scored"] == len(records) and stats["groups"] == len(tasks)
    assert stats["mean"] == pytest.approx(sum(rewards) / len(rewards))
    assert f"rewards: mean {stats['mean']:.3f} over {len(records)} scored" in proc.stdout
    assert output.with_suffix(".png").stat().st_size > 10_000


def test_code_tasks_scored_in_the_sandbox(tmp_path: Path, smollm2: Path) -> None:
    lines = (ROOT / "examples" / "tasks" / "code.jsonl").read_text().splitlines()[:4]
    (tmp_path / "tasks.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "job.yaml").write_text(
        "apiVersion: heddle.dev/v1alpha1\nkind: RolloutJob\nmetadata: {name: code}\n"
        "spec:\n  enginePool: quickstart\n  tasks: {path: tasks.jsonl}\n  samplesPerTask: 2\n"
        "  environment:\n    type: tools\n    tools: {endpoints: []}\n"
        "    reward: {type: code, timeoutSeconds: 5}\n"
        "  sampling: {temperature: 0.7, maxTokensPerTurn: 192, maxTotalTokens: 512}\n"
        "  maxTurns: 1\n  output: {path: out.jsonl}\n"
    )
    proc = _run([str(tmp_path / "job.yaml"), "--pool", str(QUICK / "pool.yaml")], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = read_records(tmp_path / "out.jsonl")
    assert len(records) == 8
    for record in records:
        assert record["reward"] in (0.0, 1.0), record["reward_error"]
        reason = record["reward_info"]["reason"]
        assert (record["reward"] == 1.0) == (reason == "passed"), reason
