"""Request and response bodies of the worker API (docs/worker-api.md).

The valid ranges of sampling fields live here, once: pydantic enforces them,
the OpenAPI schema shows them, and the API's error sentences quote them
(:data:`FIELD_RANGES`), so a manifest validator can share them too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from heddle.scheduler import SAMPLING_DEFAULTS, SAMPLING_LIMITS

from ._chat import TOOL_PARSERS, tool_schema_error

__all__ = [
    "FIELD_RANGES",
    "TOKEN_ID_FIELDS",
    "ChatMessage",
    "ErrorResponse",
    "ExportResponse",
    "FunctionCall",
    "GenerateRequest",
    "GenerateResponse",
    "HealthResponse",
    "ImportRequest",
    "ImportResponse",
    "PurgeResponse",
    "Range",
    "ReadyResponse",
    "SamplingParams",
    "StateResponse",
    "Timings",
    "ToolCall",
    "WeightsRequest",
    "WeightsResponse",
]


@dataclass(frozen=True)
class Range:
    """A numeric range of one request field; ``None`` leaves that side open."""

    low: int | float | None = None
    high: int | float | None = None
    low_exclusive: bool = False
    finite: bool = False  # floats: reject Infinity and NaN

    def __str__(self) -> str:
        low = "(-inf" if self.low is None else f"{'(' if self.low_exclusive else '['}{self.low}"
        high = "inf)" if self.high is None else f"{self.high}]"
        return f"{low}, {high}"

    def field(self, default: Any, description: str) -> Any:
        """A pydantic ``Field`` enforcing this range, its description naming it."""
        bounds: dict[str, Any] = {"le": self.high}
        bounds["gt" if self.low_exclusive else "ge"] = self.low
        if self.finite:
            bounds["allow_inf_nan"] = False
        return Field(default, description=f"{description}; in {self}", **bounds)


# vLLM's own limits (SamplingParams, the int64 fields of its engine-core messages); the
# numbers a RolloutJob may ask for are written once, in heddle.scheduler.SAMPLING_LIMITS.
_L = SAMPLING_LIMITS
_D = SAMPLING_DEFAULTS
MAX_TOKENS = Range(_L.max_tokens_min)
TEMPERATURE = Range(_L.temperature_min, _L.temperature_max, finite=True)
TOP_P = Range(_L.top_p_exclusive_min, _L.top_p_max, low_exclusive=True, finite=True)
# Wider than a job's seed (int64): the engine's generator takes any unsigned 64-bit seed.
SEED = Range(_L.seed_min, 2**64 - 1)
PRIORITY = Range(-(2**63), 2**63 - 1)

FIELD_RANGES: dict[str, Range] = {
    "sampling.max_tokens": MAX_TOKENS,
    "sampling.temperature": TEMPERATURE,
    "sampling.top_p": TOP_P,
    "sampling.seed": SEED,
    "priority": PRIORITY,
}
"""Where a range applies (the field's dotted path in a generate request) -> the range."""


TOKEN_ID_FIELDS = ("append_token_ids", "sampling.stop_token_ids", "token_ids")
"""Lists of token ids: each in [0, the engine's vocab_size), which only the running worker knows."""

TokenId = Annotated[int, Field(ge=0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FunctionCall(_Strict):
    name: str
    arguments: str = Field(description="the arguments as a JSON string (OpenAI's format)")


class ToolCall(_Strict):
    """One tool call in OpenAI's format."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: list[ToolCall] | None = Field(
        None, description="an assistant message's tool calls (OpenAI format)"
    )
    tool_call_id: str | None = Field(None, description="a tool message: the call it answers")


class SamplingParams(_Strict):
    max_tokens: int = MAX_TOKENS.field(_D.max_tokens_per_request, "tokens to generate at most")
    temperature: float = TEMPERATURE.field(_D.temperature, "sampling temperature")
    top_p: float = TOP_P.field(_D.top_p, "nucleus sampling mass")
    seed: int | None = SEED.field(None, "per-request sampling seed")
    ignore_eos: bool = False
    logprobs: bool = False
    stop_token_ids: list[TokenId] = Field(
        default_factory=list, description="token ids that end the turn; in the model's vocabulary"
    )


class GenerateRequest(_Strict):
    """Append tokens or chat messages to the trajectory, then generate one turn."""

    append_token_ids: list[TokenId] | None = Field(
        None, description="raw token ids to append; in the model's vocabulary"
    )
    messages: list[ChatMessage] | None = Field(
        None,
        min_length=1,
        description="chat messages to append, rendered with the model's chat template",
    )
    tools: list[dict[str, Any]] | None = Field(
        None,
        description="tool schemas (OpenAI function format) handed to the chat template "
        "with messages",
    )
    tool_parser: str | None = Field(
        None,
        description="a vLLM tool parser's name (hermes, qwen3_coder, ...): the reply then "
        "carries the turn's parsed tool_calls and content",
    )
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    priority: int = PRIORITY.field(0, "lower runs first (vLLM priority scheduling)")
    reset: bool = Field(
        False, description="start the context afresh from what this request appends"
    )
    weight_version: str | None = Field(
        None, description="refuse the step (421) unless the worker serves this weights version"
    )

    @field_validator("tools")
    @classmethod
    def _valid_tools(cls, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for i, tool in enumerate(tools or ()):
            if (error := tool_schema_error(tool, f"tools[{i}]")) is not None:
                raise PydanticCustomError("heddle", error)
        return tools

    @field_validator("tool_parser")
    @classmethod
    def _known_parser(cls, name: str | None) -> str | None:
        if name is not None and name not in TOOL_PARSERS:
            raise PydanticCustomError(
                "heddle",
                f"tool_parser={name!r} is not one of vLLM's tool parsers; "
                f"use one of {', '.join(TOOL_PARSERS)}",
            )
        return name

    @model_validator(mode="after")
    def _one_source(self) -> GenerateRequest:
        if self.append_token_ids is not None and self.messages is not None:
            raise ValueError("give append_token_ids or messages, not both")
        return self


class Timings(_Strict):
    queue_s: float = Field(description="in the engine's waiting queue before it was scheduled")
    prefill_s: float = Field(description="from scheduled to the first token (engine's clock)")
    decode_s: float = Field(description="from the first token to the last (engine's clock)")
    total_s: float = Field(description="the worker's call into the engine, end to end")
    handle_s: float = Field(
        0.0,
        description="the worker's whole handling of the step: total_s plus chat rendering, "
        "tokenizing, detokenizing and tool parsing",
    )


class StepSpeculation(_Strict):
    """Speculative decoding in this step, vLLM's own per-request counts."""

    drafted_tokens: int = Field(description="draft tokens proposed for this step")
    accepted_tokens: int = Field(description="of those, accepted by the model")
    draft_steps: int = Field(description="engine steps that verified a draft of this step")
    decode_steps: int = Field(
        description="engine steps that produced this step's tokens: tokens - accepted_tokens"
    )


class GenerateResponse(_Strict):
    trajectory_id: str
    appended_token_ids: list[int] = Field(
        default_factory=list, description="the tokens this request appended before generating"
    )
    token_ids: list[int]
    text: str
    finish_reason: str
    prompt_tokens: int
    cached_tokens: int
    context_tokens: int
    logprobs: list[float] | None = None
    tool_calls: list[ToolCall] | None = Field(
        None, description="with tool_parser: the turn's tool calls, parsed by vLLM's parser"
    )
    content: str | None = Field(
        None, description="with tool_parser: the turn's text without its tool-call markup"
    )
    timings: Timings
    speculation: StepSpeculation | None = Field(
        None, description="drafted and accepted tokens; null where the worker does not speculate"
    )


class ImportRequest(_Strict):
    token_ids: list[TokenId] = Field(
        min_length=1, description="the whole context; in the model's vocabulary"
    )
    warm: bool = Field(False, description="prefill now so the next step hits the cache")


class ImportResponse(_Strict):
    trajectory_id: str
    context_tokens: int
    warmed: bool


class ExportResponse(_Strict):
    trajectory_id: str
    token_ids: list[int]


class MeasuredKState(_Strict):
    """What an ``auto`` suffix engine's K table was last built on (heddle.scheduler's
    MeasuredKTable): the acceptance it measures, not one it assumes."""

    format: str = Field(description="heddle.k-table/v1")
    by_batch_size: list[list[int]] = Field(description="[first, last, K] now (K 0: off)")
    alpha: float | None = Field(
        description="per-draft acceptance the table was last built on; null: not rebuilt yet "
        "(the start-up table, on the pessimistic preset)"
    )
    rebuilds: int = Field(description="tables built from measurements since start")
    measured_steps: int = Field(
        description="request-steps asked for K > 0 drafts and counted (an empty draft counts)"
    )
    measured_tokens_per_step: float | None = Field(
        description="tokens those request-steps gave, per step (null: none yet)"
    )


class SpeculationState(_Strict):
    method: str = Field(description="off, ngram or suffix (auto resolved at start-up)")
    num_speculative_tokens: int = Field(description="K, or the largest K of the table")
    by_batch_size: list[list[int]] = Field(
        description="[first, last, K] by running batch size, as drafted now; empty: K fixed"
    )
    measured: MeasuredKState | None = Field(
        None, description="K rebuilt from measured acceptance (auto with suffix); else null"
    )
    drafted_tokens: int = Field(description="draft tokens proposed since start, engine-wide")
    accepted_tokens: int = Field(description="of those, accepted")
    draft_steps: int = Field(description="drafts verified (one per sequence and engine step)")
    acceptance_rate: float = Field(description="accepted_tokens / drafted_tokens (0 if none)")


class StateResponse(_Strict):
    engine: str
    model: str
    tp: int
    max_model_len: int
    vocab_size: int = Field(description="token ids run from 0 to vocab_size - 1")
    ready: bool
    draining: bool
    running: int
    waiting: int
    kv_usage: float
    resident_trajectories: int
    max_resident: int = Field(description="the cap on resident contexts (--max-resident)")
    resident_ttl_s: float = Field(
        description="an idle context is dropped after this many seconds (--resident-ttl)"
    )
    dropped_contexts: dict[str, int] = Field(
        description="contexts dropped since start, by reason: cap, ttl, purge"
    )
    generated_tokens: int
    tokens_per_s: float
    weight_version: str | None = Field(
        None, description="the version last loaded with POST /v1/weights; null: start-up weights"
    )
    weights_path: str | None = Field(None, description="where the served weights came from")
    speculation: SpeculationState | None = Field(
        None, description="how the engine drafts and its counts; null: it does not speculate"
    )


class SeedDraftsRequest(_Strict):
    """Texts for the engine's suffix cache to draft from (siblings', earlier iterations')."""

    texts: list[list[TokenId]] = Field(
        min_length=1, max_length=256, description="token ids of each text; in the vocabulary"
    )
    job: str = Field(min_length=1, max_length=253, description="the RolloutJob they belong to")
    task_id: str = Field(
        min_length=1, max_length=253, description="the texts' task: history is kept per task"
    )


class SeedDraftsResponse(_Strict):
    seeded: int = Field(description="texts added to the engine's suffix cache by this call")
    held: int = Field(description="texts of the job's task inserted so far (bounded history)")


class PurgeResponse(_Strict):
    job: str
    released: int = Field(description="resident contexts of the job dropped")


class WeightsRequest(_Strict):
    """Load a checkpoint in place (no restart, the KV cache stays allocated)."""

    path: str = Field(min_length=1, description="checkpoint directory (config.json, *.safetensors)")
    version: str = Field(
        min_length=1, max_length=253, description="the version to report (e.g. the RL step)"
    )
    mode: Literal["drain", "keep"] = Field(
        "drain",
        description="drain: steps in flight finish within the grace or are aborted (503), then "
        "the load; keep: the engine pauses with them inside (their KV kept), loads, and "
        "resumes them, so nothing is aborted and the stall is the load alone",
    )


class WeightsResponse(_Strict):
    path: str
    version: str
    loaded: bool = Field(description="false when this path and version were already loaded")
    load_s: float = Field(description="seconds the engine took to load, after steps drained")
    drained_s: float = Field(description="seconds spent waiting for steps in flight to finish")
    mode: Literal["drain", "keep"] = "drain"
    kept: int = Field(0, description="steps in flight that the load paused and resumed (keep)")


class ErrorResponse(_Strict):
    """Every error the API answers: one sentence saying what is wrong and what to do."""

    error: str


class HealthResponse(_Strict):
    status: Literal["ok"]


class ReadyResponse(_Strict):
    ready: bool
    reason: str | None = Field(None, description="why not, when not ready")
