"""The output record: one JSON line per finished trajectory, as a typed contract.

The session writes it (:meth:`TrajectoryRun.record`), ``heddle export`` and the
trainer's client read it, and docs/rollouts.md ("Output") documents each field;
a test keeps the three in step. It plays the part slime's ``Sample`` and verl's
agent-loop output play in those frameworks.
"""

# No `from __future__ import annotations`: NotRequired must be seen at class creation for
# OutputRecord.__required_keys__ to be right (tests read it).
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, NotRequired, TypedDict

__all__ = [
    "OutputRecord",
    "RecordPlacement",
    "RecordSegment",
    "RecordSpeculation",
    "RecordTimings",
    "RecordTokens",
    "RecordTrace",
    "TrajectoryStatus",
]


class TrajectoryStatus(StrEnum):
    """``status`` of a record (``RUNNING`` only while the session holds it)."""

    RUNNING = "running"
    DONE = "done"  # the model stopped, or the environment ended the episode
    TRUNCATED = "truncated"  # a limit ended it: finish_reason says which
    FAILED = "failed"  # error says why


class RecordTokens(TypedDict):
    prompt: int
    response: int  # len(response_token_ids)
    generated: int  # tokens the model produced (response_mask == 1)
    tool: int  # tokens the environment added between turns


class RecordTimings(TypedDict):
    started_at: float  # Unix seconds
    finished_at: float
    duration_s: float
    queue_s: float  # waiting for a worker's batch
    generate_s: float
    engine_s: float  # of generate_s, in the engine core (queue, prefill, decode)
    tool_s: float


class RecordPlacement(TypedDict):
    steps: list[str]  # the instance each step ran on
    migrations: list[dict[str, Any]]  # {"from", "to", "after_turn"}
    recomputes: int  # prefills of the whole context after a move without its KV


class RecordTrace(TypedDict):
    """What ``heddle bench --workload OUTPUT.jsonl`` replays."""

    turn_tokens: list[int]
    tool_latency_s: list[float]
    tool_output_tokens: list[int]


class RecordSegment(TypedDict):
    """The tokens one step generated, and the weights that generated them."""

    weight_version: str | None  # the version the step named (the worker refuses others)
    response_start: int  # [start, end) in response_token_ids (and response_logprobs)
    response_end: int


class RecordSpeculation(TypedDict):
    """Speculative decoding over the trajectory's steps (where its workers speculated)."""

    drafted_tokens: int  # draft tokens proposed
    accepted_tokens: int  # of those, accepted by the model
    decode_steps: int  # engine steps that produced its tokens (generated - accepted)
    tokens_per_decode_step: float  # generated tokens / decode_steps (1.0: no gain)


class OutputRecord(TypedDict):
    task_id: str
    sample: int
    trajectory_id: str
    status: TrajectoryStatus
    finish_reason: str
    error: str | None
    messages: list[Mapping[str, Any]]  # OpenAI chat format
    prompt_token_ids: list[int]
    response_token_ids: list[int]
    response_mask: list[int]  # 1 exactly on tokens the model generated
    response_logprobs: NotRequired[list[float | None]]  # with sampling.logprobs
    turns: int
    tool_calls: int
    tool_errors: int
    tokens: RecordTokens
    timings: RecordTimings
    placement: RecordPlacement
    trace: RecordTrace
    policy: str
    # The version of the first generated segment: the job's spec.weights.version unless
    # the weights changed under the trajectory (then `segments` tells each step's).
    weight_version: str | None
    weight_versions: list[str]  # the distinct versions, oldest first (none: no spec.weights)
    segments: list[RecordSegment]  # one per step, in order
    past_bound_restarts: int  # spec.asynchrony: restarts past the staleness bound
    metadata: dict[str, Any]
    task_index: int  # the task's place in the task set
    task_fields: dict[str, Any]  # a trainer row's own fields
    reward: float | None
    reward_info: dict[str, Any] | None
    reward_error: str | None
    # environment.type external: the gateway's episode id, how often it was handed out,
    # and why earlier hand-outs were abandoned (docs/gateway.md).
    episode: NotRequired[dict[str, Any]]
    # Where the pool speculates (docs/speculation.md).
    speculation: NotRequired[RecordSpeculation]
