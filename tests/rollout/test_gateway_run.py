"""``heddle run`` on an external job, with the example agent (``examples/gateway/agent.py``,
the ``openai`` SDK) as a separate process: sim workers, then the tiny model on vLLM."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from .._rollout_fixtures import assert_exactly_once, read_records

pytestmark = pytest.mark.slow  # real processes or engines; `-m 'not slow'` skips them

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "gateway"


def _call(a: int, b: int) -> str:
    return f'<tool_call>{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'


def _scripted_job(tmp: Path, tasks: int) -> Path:
    """The example job on sim workers whose turns are the prompt's <reply> blocks."""
    docs = list(yaml.safe_load_all((EXAMPLE / "job.yaml").read_text()))
    docs[1]["spec"]["environment"]["external"]["idleTimeoutSeconds"] = 20
    docs[1]["spec"]["sampling"]["maxTokensPerTurn"] = 200
    rows = [
        {"id": f"add-{i}", "metadata": {"answer": i + 3},
         "prompt": f"What is {i} + 3? <reply>{_call(i, 3)}</reply><reply>It is {i + 3}.</reply>"}
        for i in range(tasks)
    ]  # fmt: skip
    (tmp / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return path


def _start(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip


def _gateway(path: Path, proc: subprocess.Popen[str], wait_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + wait_s
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "heddle run wrote no gateway file"
        time.sleep(0.1)
    time.sleep(0.1)  # written whole right after creation
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _hang_up(gateway: dict[str, Any], slow: bool) -> str:
    """Take an episode, call the model and disconnect before the reply."""
    headers = {"Authorization": f"Bearer {gateway['token']}"}
    with httpx.Client(base_url=gateway["url"] + "/", headers=headers, timeout=30) as http:
        ep = http.post("episodes").json()
        prompt = "x" * (3000 if slow else 10)
        body = {"model": gateway["model"], "user": ep["id"],
                "messages": [{"role": "user", "content": prompt}]}  # fmt: skip
        with pytest.raises(httpx.ReadTimeout):
            http.post("chat/completions", json=body, timeout=0.05)
        return str(ep["task"]["id"])


def test_example_agent_runs_an_external_job_on_sim_workers_with_a_disconnect(
    tmp_path: Path,
) -> None:
    job = _scripted_job(tmp_path, tasks=8)
    run = _start("-m", "heddle", "run", str(job), "--engine", "sim", "--scripted-replies",
                 "--quiet", cwd=tmp_path)  # fmt: skip
    try:
        gateway = _gateway(tmp_path / "out" / "rollout.jsonl.gateway.json", run, 60)
        lost = _hang_up(gateway, slow=True)
        agent = subprocess.run(
            [sys.executable, str(EXAMPLE / "agent.py"), "--gateway",
             str(tmp_path / "out" / "rollout.jsonl.gateway.json"), "--concurrency", "6"],
            cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert agent.returncode == 0, agent.stderr
        assert "agent: 32 episodes, mean reward 1.00" in agent.stdout
        out, _ = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode == 0, out
    assert "gateway: http://127.0.0.1:" in out and "gateway token: " in out
    assert not (tmp_path / "out" / "rollout.jsonl.gateway.json").exists()
    records = read_records(tmp_path / "out" / "rollout.jsonl")
    assert_exactly_once(records, {(f"add-{i}", s) for i in range(8) for s in range(4)})
    for r in records:
        i = int(r["task_id"].split("-")[1])
        assert r["status"] == "done" and r["reward"] == 1.0 and r["turns"] == 2, r["error"]
        user, call, tool, answer = r["messages"]
        assert call["tool_calls"][0]["function"]["name"] == "add"
        assert tool == {"role": "tool", "content": str(i + 3),
                        "tool_call_id": call["tool_calls"][0]["id"]}  # fmt: skip
        assert answer == {"role": "assistant", "content": f"It is {i + 3}."}
        tokens = bytes(r["prompt_token_ids"] + r["response_token_ids"]).decode()
        assert tokens == (
            f"<|user|>\n{user['content']}\n<|assistant|>\n{_call(i, 3)}\n"
            f"<|tool|>\n{i + 3}\n<|assistant|>\nIt is {i + 3}."
        )  # the sim's template over the whole conversation: nothing re-tokenised
        assert r["response_mask"].count(1) == len(_call(i, 3)) + len(f"It is {i + 3}.")
    again = [r for r in records if r["episode"]["hand_outs"] == 2]
    assert [r["task_id"] for r in again] == [lost]
    assert again[0]["episode"]["abandoned"] == ["the agent disconnected during a model call"]
