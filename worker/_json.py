"""Fast JSON for the session's hot path: step requests and replies, output records.

The session encodes and decodes a trajectory's tokens and logprobs at every
step and writes each finished record whole; with the standard library that was
most of the control loop's CPU (``heddle bench control-loop``). orjson does the
same work several times faster. Anything orjson refuses (integers past 64 bits,
the non-standard ``NaN`` token) falls back to the standard library, so what is
accepted and what is written stay as before.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

__all__ = ["dumps", "loads"]

_OPTIONS = orjson.OPT_NON_STR_KEYS


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON (non-ASCII kept as is, NaN and infinities as null)."""
    try:
        return orjson.dumps(value, option=_OPTIONS)
    except TypeError:  # orjson.JSONEncodeError: a type or an integer orjson does not take
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def loads(data: bytes | str) -> Any:
    """Parse JSON; raises ValueError when it is not JSON."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)  # accepts NaN/Infinity as Python's json always did
