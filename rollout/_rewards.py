"""Rewards: a score for each finished trajectory (docs/rollouts.md, "Rewards").

``http``: ``POST <url>`` with the trajectory's output record (without the
reward fields); the endpoint answers 200 with ``{"reward": <finite number>,
"info": {...}}`` (``info`` optional). The call is the tools' exchange
(``_replies.post_json``): one deadline per attempt from connect to last byte, a reply
capped at :data:`~heddle.rollout._replies.MAX_REPLY_BYTES`, timeouts, broken
connections, 5xx and non-JSON bodies retried with backoff; a 4xx, a redirect,
an oversized reply, or a JSON reply whose ``reward`` is not a finite number is
not (the endpoint would answer the same again). ``scripted``: 1.0 for a
seeded share of the (task, sample) pairs and 0.0 for the rest, the same on
every run, for load tests that need a reward column. ``answer``: 1.0 when the
last assistant message's final answer equals the task's (``_answers.py``).
``code``: 1.0 when the last assistant message's code passes the task's tests in
a sandboxed subprocess (``_sandbox.py``); why not goes in ``reward_info``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from heddle.api import RewardSpec
from heddle.exceptions import ToolError

from ._answers import expected_answer, extract_answer, same_answer
from ._hosts import LOCAL_DEFAULT, HostAllowList, guarded_client
from ._replies import MAX_REPLY_BYTES, RetryableError, post_json, retry_delay_s
from ._sandbox import SandboxLimits, run_python

__all__ = [
    "AnswerReward",
    "CodeReward",
    "HttpReward",
    "RewardResult",
    "RewardScorer",
    "ScriptedReward",
    "extract_code",
    "make_scorer",
]


@dataclass(frozen=True)
class RewardResult:
    reward: float | None  # None when the call failed
    info: Mapping[str, Any] | None = None  # the endpoint's ``info``, as given
    error: str | None = None  # why there is no reward
    seconds: float = 0.0


class RewardScorer(ABC):
    def __init__(self, spec: RewardSpec) -> None:
        self.spec = spec

    @abstractmethod
    async def score(self, record: Mapping[str, Any]) -> RewardResult:
        """The score of one finished trajectory's record; never raises for a bad endpoint."""

    async def close(self) -> None:
        return None


class ScriptedReward(RewardScorer):
    async def score(self, record: Mapping[str, Any]) -> RewardResult:
        # sha256, not hash(): Python salts str hashes per process, and the score must not move.
        key = f"{self.spec.seed}\x00{record['task_id']}\x00{record['sample']}".encode()
        draw = int.from_bytes(hashlib.sha256(key).digest()[:8], "big") / 2**64
        return RewardResult(1.0 if draw < self.spec.success_rate else 0.0, {"scripted": True})


def _final_text(record: Mapping[str, Any]) -> str:
    """What the model said last: the content of the last assistant message."""
    for message in reversed(record.get("messages") or []):
        if message.get("role") == "assistant":
            return str(message.get("content") or "")
    return ""


class AnswerReward(RewardScorer):
    async def score(self, record: Mapping[str, Any]) -> RewardResult:
        expected = expected_answer(record)
        if expected is None:
            return RewardResult(
                None,
                None,
                f"task {record.get('task_id')!r} has no metadata.answer for reward type answer",
            )
        got = extract_answer(_final_text(record))
        right = same_answer(got, expected)
        return RewardResult(1.0 if right else 0.0, {"answer": got, "expected": expected})


_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)(?:```|\Z)", re.S | re.I)


def extract_code(text: str) -> str | None:
    """The last fenced code block (an unclosed one runs to the end), else None."""
    blocks = [b for b in _FENCE.findall(text) if b.strip()]
    return blocks[-1] if blocks else None


class CodeReward(RewardScorer):
    """The task's ``metadata.tests`` (Python asserts) run after the model's code."""

    def __init__(self, spec: RewardSpec) -> None:
        super().__init__(spec)
        self.limits = SandboxLimits(time_s=spec.timeout_s, memory_mib=spec.memory_mib)
        # One sandbox per core at a time: scoring must not starve the engines.
        self._slots = asyncio.Semaphore(max(1, (os.cpu_count() or 2) // 2))

    async def score(self, record: Mapping[str, Any]) -> RewardResult:
        tests = (record.get("metadata") or {}).get("tests")
        if not isinstance(tests, str) or not tests.strip():
            return RewardResult(
                None,
                None,
                f"task {record.get('task_id')!r} has no metadata.tests for reward type code",
            )
        code = extract_code(_final_text(record))
        if code is None:
            return RewardResult(0.0, {"passed": False, "reason": "no code block in the answer"})
        async with self._slots:
            result = await run_python(f"{code}\n\n{tests}\n", self.limits)
        return RewardResult(1.0 if result.passed else 0.0, result.info(), None, result.seconds)


class HttpReward(RewardScorer):
    def __init__(
        self,
        spec: RewardSpec,
        *,
        allowed: HostAllowList | None = None,  # None: loopback only (LOCAL_DEFAULT)
        max_reply_bytes: int = MAX_REPLY_BYTES,
    ) -> None:
        super().__init__(spec)
        self.max_reply_bytes = max_reply_bytes
        # Each connection is checked against the list (docs/security.md, "Egress").
        self._client = guarded_client(allowed or HostAllowList.parse(LOCAL_DEFAULT))

    async def score(self, record: Mapping[str, Any]) -> RewardResult:
        started = time.monotonic()
        last = ""
        for attempt in range(self.spec.retries + 1):
            if attempt:  # the tools' backoff
                await asyncio.sleep(retry_delay_s(attempt))
            try:
                reward, info = await self._attempt(record)
                return RewardResult(reward, info, None, time.monotonic() - started)
            except RetryableError as exc:
                last = str(exc)
            except ToolError as exc:
                return RewardResult(None, None, str(exc), time.monotonic() - started)
        error = f"reward endpoint failed after {self.spec.retries + 1} attempts: {last}"
        return RewardResult(None, None, error, time.monotonic() - started)

    async def _attempt(self, record: Mapping[str, Any]) -> tuple[float, Mapping[str, Any] | None]:
        raw, text = await post_json(
            self._client,
            self.spec.url,
            dict(record),
            timeout_s=self.spec.timeout_s,
            cap=self.max_reply_bytes,
            who="reward endpoint",
            server="reward server",
            url_field="spec.environment.reward.url",
            refused="the trajectory",
        )
        try:
            data = json.loads(raw)
        except ValueError:
            raise RetryableError(
                f'reply is not JSON {{"reward": number}}: {text[:200]!r}'
            ) from None
        return _parse_reply(data, text)

    async def close(self) -> None:
        await self._client.aclose()


def _parse_reply(data: Any, text: str) -> tuple[float, Mapping[str, Any] | None]:
    """``{"reward": finite number, "info": object?}``; anything else is a :class:`ToolError`."""
    if not isinstance(data, dict) or "reward" not in data:
        raise ToolError(f'reward endpoint replied without a "reward" field: {text[:200]!r}')
    value = data["reward"]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ToolError(
            f"reward endpoint replied reward={json.dumps(value)[:50]}; it must be a finite "
            'number, e.g. {"reward": 1.0}'
        )
    info = data.get("info")
    if info is not None and not isinstance(info, dict):
        raise ToolError(f"reward endpoint replied info={json.dumps(info)[:50]}; give an object")
    return float(value), info


def make_scorer(
    spec: RewardSpec | None, allowed: HostAllowList | None = None
) -> RewardScorer | None:
    """The job's scorer; an http one connects only where ``allowed`` lets it."""
    if spec is None:
        return None
    if spec.type == "http":
        return HttpReward(spec, allowed=allowed)
    kinds: dict[str, type[RewardScorer]] = {
        "scripted": ScriptedReward,
        "answer": AnswerReward,
        "code": CodeReward,
    }
    return kinds[spec.type](spec)
