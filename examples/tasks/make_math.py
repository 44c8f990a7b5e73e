"""Write math.jsonl (arithmetic and short word problems with exact answers) and the
quickstart's subset, from a seed: ``python examples/tasks/make_math.py``.

Each line is a Heddle task (docs/rollouts.md, "Task sets"): ``{"id", "prompt",
"metadata": {"answer", "kind"}}``; ``reward: {type: answer}`` scores a completion 1.0
when its final answer (the last \\boxed{}, else "the answer is X", else the last
number) equals ``metadata.answer``. The same seed writes the same files, byte for byte
(tests/rollout/test_answers.py checks the committed ones).
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEED = 2026
COUNT = 300  # tasks in math.jsonl
QUICKSTART = 24  # of them in examples/quickstart/tasks.jsonl, every kind represented
# Short answers: SmolLM2-135M writes "6 * 7 = 42" when asked for one sentence, and loses
# its way in long ones (the checker reads the last number, or "the answer is N").
INSTRUCTION = "Answer in one short sentence."

NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jo", "Kofi", "Lena"]
ITEMS = ["apple", "book", "marble", "pencil", "sticker", "cookie", "stamp", "shell", "card", "egg"]

Problem = tuple[str, int]  # the question, its answer


def _add(r: random.Random) -> Problem:
    a, b = r.randint(1, 20), r.randint(1, 20)
    return f"What is {a} + {b}?", a + b


def _sub(r: random.Random) -> Problem:
    a = r.randint(5, 30)
    b = r.randint(1, a - 1)
    return f"What is {a} - {b}?", a - b


def _mul(r: random.Random) -> Problem:
    a, b = r.randint(2, 9), r.randint(2, 9)
    return f"What is {a} * {b}?", a * b


def _two_step(r: random.Random) -> Problem:
    a, b, c = r.randint(2, 5), r.randint(2, 5), r.randint(1, 9)
    return f"What is {a} * {b} + {c}?", a * b + c


def _buys(r: random.Random) -> Problem:
    name, item = r.choice(NAMES), r.choice(ITEMS)
    a, b = r.randint(2, 15), r.randint(2, 15)
    return (
        f"{name} has {a} {item}s and gets {b} more. How many {item}s does {name} have now?",
        a + b,
    )


def _gives(r: random.Random) -> Problem:
    name, item = r.choice(NAMES), r.choice(ITEMS)
    a = r.randint(5, 20)
    b = r.randint(1, a - 1)
    return f"{name} has {a} {item}s and gives away {b}. How many {item}s are left?", a - b


def _boxes(r: random.Random) -> Problem:
    item = r.choice(ITEMS)
    a, b = r.randint(2, 6), r.randint(2, 5)
    return f"A box holds {a} {item}s. How many {item}s are in {b} boxes?", a * b


def _share(r: random.Random) -> Problem:
    item = r.choice(ITEMS)
    each, kids = r.randint(2, 5), r.randint(2, 4)
    return (
        f"{each * kids} {item}s are shared equally among {kids} children. "
        f"How many {item}s does each child get?",
        each,
    )


def _pay(r: random.Random) -> Problem:
    name = r.choice(NAMES)
    price, count = r.randint(2, 9), r.randint(2, 4)
    return f"A pen costs {price} dollars. {name} buys {count} pens. How many dollars is that?", (
        price * count
    )


def _speed(r: random.Random) -> Problem:
    speed, hours = r.choice([10, 20, 30, 40, 50]), r.randint(2, 3)
    return f"A car drives {speed} km each hour for {hours} hours. How many km does it drive?", (
        speed * hours
    )


KINDS: dict[str, Callable[[random.Random], Problem]] = {
    "add": _add,
    "sub": _sub,
    "mul": _mul,
    "two-step": _two_step,
    "word-add": _buys,
    "word-sub": _gives,
    "word-mul": _boxes,
    "word-div": _share,
    "word-price": _pay,
    "word-rate": _speed,
}


def tasks(seed: int = SEED, count: int = COUNT) -> list[dict[str, object]]:
    """The task set: kinds in turn, numbers drawn from ``seed``."""
    r = random.Random(seed)
    kinds = list(KINDS)
    out: list[dict[str, object]] = []
    for i in range(count):
        kind = kinds[i % len(kinds)]
        question, answer = KINDS[kind](r)
        out.append(
            {
                "id": f"math-{i:04d}",
                "prompt": f"{question} {INSTRUCTION}",
                "metadata": {"answer": str(answer), "kind": kind},
            }
        )
    return out


def quickstart(all_tasks: list[dict[str, object]]) -> list[dict[str, object]]:
    """The first QUICKSTART tasks: every kind, in turn."""
    return all_tasks[:QUICKSTART]


def jsonl(rows: list[dict[str, object]]) -> str:
    return "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows)


def main() -> int:
    rows = tasks()
    (HERE / "math.jsonl").write_text(jsonl(rows), encoding="utf-8")
    (HERE.parent / "quickstart" / "tasks.jsonl").write_text(jsonl(quickstart(rows)), "utf-8")
    print(f"wrote {len(rows)} tasks to {HERE / 'math.jsonl'}, {QUICKSTART} to the quickstart")
    return 0


if __name__ == "__main__":
    sys.exit(main())
