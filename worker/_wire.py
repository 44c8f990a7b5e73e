"""The worker API's messages as the client sends and reads them: typed, checked against
the server's models.

The server validates with the pydantic models in :mod:`._schemas`; the session's
client, on the hot path (about a thousand steps a second), builds and reads plain
dicts with orjson instead. These ``TypedDict`` s give those dicts the server's
field names and types, so mypy checks the client, and
``tests/worker/test_wire.py`` checks every one against its model: a field renamed,
added or made required on either side fails there, not in a running rollout.
"""

from typing import Any, NotRequired, TypedDict

# No `from __future__ import annotations`: NotRequired must be seen at class creation
# (the test reads __required_keys__).

__all__ = [
    "GenerateBody",
    "GenerateReplyBody",
    "ImportBody",
    "SamplingBody",
    "StepSpeculationBody",
    "TimingsBody",
    "WeightsBody",
    "WeightsReplyBody",
]


class SamplingBody(TypedDict):
    """``SamplingParams``: every field has a server-side default."""

    max_tokens: NotRequired[int]
    temperature: NotRequired[float]
    top_p: NotRequired[float]
    seed: NotRequired[int | None]
    ignore_eos: NotRequired[bool]
    logprobs: NotRequired[bool]
    stop_token_ids: NotRequired[list[int]]


class GenerateBody(TypedDict):
    """``POST /v1/trajectories/{id}/generate`` (``GenerateRequest``)."""

    append_token_ids: NotRequired[list[int] | None]
    messages: NotRequired[list[dict[str, Any]] | None]
    tools: NotRequired[list[dict[str, Any]] | None]
    tool_parser: NotRequired[str | None]
    sampling: NotRequired[SamplingBody]
    priority: NotRequired[int]
    reset: NotRequired[bool]
    weight_version: NotRequired[str | None]


class TimingsBody(TypedDict):
    queue_s: float
    prefill_s: float
    decode_s: float
    total_s: float
    handle_s: NotRequired[float]  # total_s plus the worker's own handling


class StepSpeculationBody(TypedDict):
    """A step's drafted and accepted tokens (``StepSpeculation``)."""

    drafted_tokens: int
    accepted_tokens: int
    draft_steps: int
    decode_steps: int


class GenerateReplyBody(TypedDict):
    """The reply to a step (``GenerateResponse``)."""

    trajectory_id: str
    appended_token_ids: NotRequired[list[int]]
    token_ids: list[int]
    text: str
    finish_reason: str
    prompt_tokens: int
    cached_tokens: int
    context_tokens: int
    logprobs: NotRequired[list[float | None] | None]
    tool_calls: NotRequired[list[dict[str, Any]] | None]
    content: NotRequired[str | None]
    timings: TimingsBody
    speculation: NotRequired[StepSpeculationBody | None]


class ImportBody(TypedDict):
    """``PUT /v1/trajectories/{id}`` (``ImportRequest``)."""

    token_ids: list[int]
    warm: NotRequired[bool]


class WeightsBody(TypedDict):
    """``POST /v1/weights`` (``WeightsRequest``)."""

    path: str
    version: str
    mode: NotRequired[str]  # drain (the default) or keep


class WeightsReplyBody(TypedDict):
    """The reply to ``POST /v1/weights`` (``WeightsResponse``)."""

    path: str
    version: str
    loaded: bool
    load_s: float
    drained_s: float
    mode: NotRequired[str]
    kept: NotRequired[int]
