"""``reward: {type: code}``: the model's code and the task's tests in a sandboxed subprocess,
whose limits hold (a loop or a memory bomb gets reward 0 with the reason), and the shipped
code task set, whose reference solutions pass."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from heddle.api import RewardSpec
from heddle.rollout import CodeReward, SandboxLimits, extract_code, read_tasks, run_python

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "examples" / "tasks"
LIMITS = SandboxLimits(time_s=1.0, memory_mib=128, output_kib=64)


def _record(answer: str, tests: str = "assert add(2, 3) == 5") -> dict[str, Any]:
    return {
        "task_id": "code-add",
        "sample": 0,
        "messages": [{"role": "assistant", "content": answer}],
        "metadata": {"tests": tests},
    }


def _score(answer: str, tests: str = "assert add(2, 3) == 5") -> Any:
    scorer = CodeReward(RewardSpec("code", timeout_s=1.0, memory_mib=128))
    return asyncio.run(scorer.score(_record(answer, tests)))


def test_passing_and_failing_code() -> None:
    good = _score("Here:\n```python\ndef add(a, b):\n    return a + b\n```\nDone.")
    assert good.reward == 1.0 and good.info["reason"] == "passed"
    bad = _score("```python\ndef add(a, b):\n    return a - b\n```")
    assert bad.reward == 0.0 and bad.info["reason"] == "failed: AssertionError"
    broken = _score("```python\ndef add(a, b)\n    return a + b\n```")
    assert broken.reward == 0.0 and broken.info["reason"].startswith("failed: SyntaxError")
    none = _score("I would add them.")
    assert none.reward == 0.0 and none.info["reason"] == "no code block in the answer"
    missing = _score("```python\npass\n```", tests="")
    assert missing.reward is None and "has no metadata.tests" in missing.error


def test_extract_code_takes_the_last_block_and_an_unclosed_one() -> None:
    assert extract_code("```python\na = 1\n```\ntext\n```\nb = 2\n```") == "b = 2\n"
    assert extract_code("```py\nc = 3\n") == "c = 3\n"  # cut off by the token limit
    assert extract_code("no code") is None


@pytest.mark.slow
def test_a_loop_that_never_ends_gets_zero_with_the_time_limit() -> None:
    loop = _score("```python\ndef add(a, b):\n    while True:\n        pass\n```")
    assert loop.reward == 0.0 and loop.info["reason"].startswith("time limit")
    sleeper = _score("```python\nimport time\ntime.sleep(60)\n```")
    assert sleeper.reward == 0.0
    assert sleeper.info["reason"].startswith("time limit: still running after 3 s")
    assert sleeper.seconds < 10


def test_memory_output_and_environment_limits(tmp_path: Path) -> None:
    hog = _score("```python\nblob = bytearray(1024 * 2**20)\n```")
    assert hog.reward == 0.0 and hog.info["reason"] == "memory limit: 128 MiB"
    chatty = asyncio.run(run_python("while True:\n    print('x' * 1000)\n", LIMITS))
    assert not chatty.passed and chatty.reason == "output limit: 64 KiB"
    # No inherited environment, no site-packages, a fresh working directory.
    probe = (
        "import os, sys\n"
        "assert 'PATH' not in os.environ and 'HOME' not in os.environ, dict(os.environ)\n"
        "assert not any('site-packages' in p for p in sys.path), sys.path\n"
        "assert sorted(os.listdir('.')) == ['launch.py', 'main.py', 'stderr', 'stdout']\n"
        "import resource\n"
        "assert resource.getrlimit(resource.RLIMIT_AS)[1] == 128 * 2**20\n"
    )
    clean = asyncio.run(run_python(probe, LIMITS))
    assert clean.passed, clean.stderr_tail
    # A child it leaves behind dies with it (its process group is killed).
    tmp_path.chmod(0o777)  # where the child says who it is, whoever the sandbox runs it as
    pid_file = tmp_path / "child.pid"
    fork = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        f"    open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        "    time.sleep(60)\n"
        "time.sleep(0.5)\n"
    )
    assert asyncio.run(run_python(fork, LIMITS)).passed
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie is dead, waiting to be reaped


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, TASKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_code_tasks_are_what_the_script_writes_and_their_references_pass() -> None:
    make = _load("make_code")
    assert (TASKS / "code.jsonl").read_text(encoding="utf-8") == make.jsonl(make.tasks()), (
        "run python examples/tasks/make_code.py"
    )
    parsed = read_tasks(path=TASKS / "code.jsonl")
    assert not parsed.errors and 20 <= len(parsed.tasks) <= 40
    references = make.references()

    scorer = CodeReward(RewardSpec("code", timeout_s=5.0))

    async def score(task_id: str, metadata: dict[str, Any], code: str) -> float | None:
        answer = {"role": "assistant", "content": f"```python\n{code}\n```"}
        record = {"task_id": task_id, "messages": [answer], "metadata": metadata}
        return (await scorer.score(record)).reward

    for task in parsed.tasks:
        assert asyncio.run(score(task.id, dict(task.metadata), references[task.id])) == 1.0
    for task in parsed.tasks[:3]:  # and the tests bite: a function that does nothing fails
        empty = f"def {task.metadata['entry_point']}(*args):\n    return None"
        assert asyncio.run(score(task.id, dict(task.metadata), empty)) == 0.0, task.id
