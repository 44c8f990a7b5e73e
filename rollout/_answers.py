"""The exact-answer checker of ``reward: {type: answer}`` (docs/rollouts.md, "Rewards").

A model's final answer is taken, in this order, from the last ``\\boxed{...}``,
else the last "answer is X" / "Answer: X", else the last number in the text,
else (no digits at all) the last number word ("five", "twelve", up to "twenty",
and the tens to "ninety").
Two answers are equal when both read as numbers (commas, a dollar or percent
sign, a trailing full stop and ``x/y`` fractions allowed) and agree to 1e-6,
or else when they are the same text after case and space folding.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

__all__ = ["expected_answer", "extract_answer", "same_answer"]

_NUMBER = r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+"
_NUMBER_RE = re.compile(_NUMBER)
_WORDS = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
    "twenty",
]
_TENS = {"thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80}
_NUMBER_WORDS = {**{w: i for i, w in enumerate(_WORDS)}, **_TENS, "ninety": 90}
_NUMBER_WORD_RE = re.compile(r"\b(" + "|".join(_NUMBER_WORDS) + r")\b", re.I)
_ANSWER_IS = re.compile(
    r"(?:final answer|the answer|answer)\s*(?:is|:|=)\s*:?\s*\**\s*\$?\s*([^\n]*)", re.I
)


def _boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}``, braces balanced."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j].strip()
    return None  # cut off before the brace closed: no answer


def extract_answer(text: str) -> str | None:
    """The final answer in a completion, or None if it gives none."""
    boxed = _boxed(text)
    if boxed:
        return boxed
    said = _ANSWER_IS.findall(text)
    if said:
        phrase = str(said[-1]).strip()
        number = _NUMBER_RE.search(phrase)
        # "The answer is 42 apples." -> 42; "The answer is Paris." -> Paris
        if number:
            return number.group(0)
        if phrase:
            return phrase.rstrip(" .")
    numbers = _NUMBER_RE.findall(text)
    if numbers:
        return str(numbers[-1])
    words = _NUMBER_WORD_RE.findall(text)  # "Five pens."
    return str(_NUMBER_WORDS[words[-1].lower()]) if words else None


def _as_number(text: str) -> Fraction | None:
    cleaned = text.strip().strip("$").removesuffix("%").rstrip(".").replace(",", "").strip()
    cleaned = cleaned.removeprefix("\\$").strip()
    if not re.fullmatch(_NUMBER, cleaned):
        return None
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def same_answer(got: str | None, expected: str) -> bool:
    """Whether an extracted answer equals the expected one (numbers by value, text folded)."""
    if got is None:
        return False
    a, b = _as_number(got), _as_number(expected)
    if a is not None and b is not None:
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-6)
    fold = " ".join(got.lower().split()).strip(" ."), " ".join(expected.lower().split())
    return fold[0] == fold[1].strip(" .")


def expected_answer(record: Mapping[str, Any]) -> str | None:
    """The task's answer: ``metadata.answer``, else a trainer row's ``ground_truth``."""
    metadata = record.get("metadata") or {}
    if "answer" in metadata:
        return str(metadata["answer"])
    fields = record.get("task_fields") or {}
    for key in ("reward_model", "reward_spec"):  # verl, SkyRL (_formats.py)
        block = fields.get(key)
        if isinstance(block, Mapping) and block.get("ground_truth") is not None:
            return str(block["ground_truth"])
    return None
