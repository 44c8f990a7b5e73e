"""Request and response bodies of the worker API (docs/worker-api.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "ChatMessage",
    "ExportResponse",
    "GenerateRequest",
    "GenerateResponse",
    "ImportRequest",
    "ImportResponse",
    "SamplingParams",
    "StateResponse",
    "Timings",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "tool"]
    content: str


class SamplingParams(_Strict):
    max_tokens: int = Field(256, ge=1, description="tokens to generate at most")
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = None
    ignore_eos: bool = False
    logprobs: bool = False
    stop_token_ids: list[int] = Field(default_factory=list)


class GenerateRequest(_Strict):
    """Append tokens or chat messages to the trajectory, then generate one turn."""

    append_token_ids: list[int] | None = Field(None, description="raw token ids to append")
    messages: list[ChatMessage] | None = Field(
        None, description="chat messages to append, rendered with the model's chat template"
    )
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    priority: int = Field(0, description="lower runs first (vLLM priority scheduling)")
    reset: bool = Field(
        False, description="start the context afresh from what this request appends"
    )

    @model_validator(mode="after")
    def _one_source(self) -> GenerateRequest:
        if self.append_token_ids is not None and self.messages is not None:
            raise ValueError("give append_token_ids or messages, not both")
        return self


class Timings(_Strict):
    queue_s: float
    prefill_s: float
    decode_s: float
    total_s: float


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
    timings: Timings


class ImportRequest(_Strict):
    token_ids: list[int]
    warm: bool = Field(False, description="prefill now so the next step hits the cache")


class ImportResponse(_Strict):
    trajectory_id: str
    context_tokens: int
    warmed: bool


class ExportResponse(_Strict):
    trajectory_id: str
    token_ids: list[int]


class StateResponse(_Strict):
    engine: str
    model: str
    tp: int
    max_model_len: int
    ready: bool
    draining: bool
    running: int
    waiting: int
    kv_usage: float
    resident_trajectories: int
    generated_tokens: int
    tokens_per_s: float
