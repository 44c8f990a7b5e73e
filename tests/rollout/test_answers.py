"""The exact-answer checker (``reward: {type: answer}``) and the shipped math task set."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from heddle.api import RewardSpec
from heddle.rollout import (
    AnswerReward,
    expected_answer,
    extract_answer,
    read_tasks,
    reward_stats,
    same_answer,
)

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "examples" / "tasks"


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("17 + 42 = 59. The answer is 59.", "59"),
        ("First 3, then 4. The answer is: 12 apples", "12"),
        ("We get \\boxed{42}, though 7 was tempting; 8", "42"),
        ("so \\boxed{\\frac{1}{2}} in the end", "\\frac{1}{2}"),
        ("Final answer: -3", "-3"),
        ("He pays $1,250 in total", "1,250"),
        ("It is 2.5 hours, or 150 minutes", "150"),
        ("The answer is Paris.", "Paris"),
        ("I do not know.", None),
        ("Five pens.", "5"),
        ("Twenty-one? No: twelve.", "12"),
        ("Seven, or 8", "8"),  # digits first
        ("cut off at \\boxed{12", "12"),  # an unclosed box is no box: the last number
    ],
)
def test_extract_answer(text: str, answer: str | None) -> None:
    assert extract_answer(text) == answer


@pytest.mark.parametrize(
    ("got", "expected", "same"),
    [
        ("59", "59", True),
        ("59.0", "59", True),
        ("1,250", "1250", True),
        ("$12", "12", True),
        ("12.", "12", True),
        ("3/4", "0.75", True),
        ("58", "59", False),
        ("Paris", "paris", True),
        ("Lyon", "Paris", False),
        (None, "1", False),
        ("1e3", "1000", False),  # not a number we read: compared as text
    ],
)
def test_same_answer(got: str | None, expected: str, same: bool) -> None:
    assert same_answer(got, expected) is same


def _record(text: str, metadata: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "task_id": "t",
        "sample": 0,
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": text}],
        "metadata": metadata or {},
        **extra,
    }


def test_answer_reward_scores_the_last_assistant_message() -> None:
    scorer = AnswerReward(RewardSpec("answer"))
    right = asyncio.run(scorer.score(_record("6 * 7 = 42. The answer is 42.", {"answer": "42"})))
    assert right.reward == 1.0 and right.info == {"answer": "42", "expected": "42"}
    wrong = asyncio.run(scorer.score(_record("The answer is 41.", {"answer": 42})))
    assert wrong.reward == 0.0 and wrong.error is None
    verl = _record("\\boxed{7}", task_fields={"reward_model": {"ground_truth": "7"}})
    assert expected_answer(verl) == "7"
    assert asyncio.run(scorer.score(verl)).reward == 1.0
    missing = asyncio.run(scorer.score(_record("The answer is 1.")))
    assert missing.reward is None and "has no metadata.answer" in (missing.error or "")


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, TASKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_math_tasks_are_what_the_seeded_script_writes() -> None:
    make = _load("make_math")
    rows = make.tasks()
    assert (TASKS / "math.jsonl").read_text(encoding="utf-8") == make.jsonl(rows), (
        "run python examples/tasks/make_math.py"
    )
    quick = ROOT / "examples" / "quickstart" / "tasks.jsonl"
    assert quick.read_text(encoding="utf-8") == make.jsonl(make.quickstart(rows))
    assert make.tasks(seed=1) != rows  # the seed matters
    parsed = read_tasks(path=TASKS / "math.jsonl")
    assert not parsed.errors and len(parsed.tasks) == make.COUNT >= 200
    assert {t.metadata["kind"] for t in parsed.tasks[: make.QUICKSTART]} == set(make.KINDS)
    for row in rows:  # each answer is the one its own wording asks for
        text = str(row["prompt"])
        answer = str(row["metadata"]["answer"])  # type: ignore[index]
        if text.startswith("What is "):
            expression = text.removeprefix("What is ").split("?")[0]
            assert str(eval(expression)) == answer, text  # our own digits
        assert same_answer(extract_answer(f"The answer is {answer}."), answer)


def test_reward_stats_per_group() -> None:
    def rec(task: str, reward: float | None, tokens: int = 10) -> dict[str, Any]:
        return {
            "task_id": task,
            "status": "done",
            "reward": reward,
            "tokens": {"generated": tokens},
        }

    records = [rec("a", 1.0, 30), rec("a", 0.0), rec("b", 1.0, 50), rec("b", 1.0, 70)]
    records += [rec("c", 0.0), rec("c", 0.0), rec("d", None)]
    stats = reward_stats(records)
    assert stats is not None
    assert stats["scored"] == 6 and stats["unscored"] == 1 and stats["groups"] == 3
    assert stats["mean"] == pytest.approx(0.5)
    assert (stats["groups_with_spread"], stats["groups_all_best"], stats["groups_all_zero"]) == (
        1,
        1,
        1,
    )
    assert stats["mean_group_std"] == pytest.approx(0.5 / 3)
    assert stats["mean_tokens_rewarded"] == pytest.approx(50.0)
    assert reward_stats([{"task_id": "a", "status": "done"}]) is None
    json.dumps(stats)  # goes into summary.json as is
