"""The engine interface a worker serves, and the plain data it passes around."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from heddle.exceptions import CheckpointError, EngineError
from heddle.scheduler import SAMPLING_DEFAULTS

from ._speculation import NO_SPECULATION, Speculation
from ._weights import CheckpointLayout, LoadedWeights

__all__ = ["Engine", "EngineError", "EngineStats", "ParsedTurn", "Sampling", "StepOutput"]


@dataclass(frozen=True)
class Sampling:
    """Sampling of one LLM step (vLLM's names and meanings)."""

    max_tokens: int = SAMPLING_DEFAULTS.max_tokens_per_request
    temperature: float = SAMPLING_DEFAULTS.temperature
    top_p: float = SAMPLING_DEFAULTS.top_p
    seed: int | None = None
    ignore_eos: bool = False
    logprobs: bool = False
    stop_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class StepOutput:
    """What one step produced. Times in seconds."""

    token_ids: list[int]
    finish_reason: str  # "stop" | "length" | "abort"
    prompt_tokens: int  # context the step started from
    cached_tokens: int  # of those, served from the prefix cache
    logprobs: list[float] | None = None
    queue_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    # Speculative decoding, this step's own counts (vLLM's per-request metrics): draft
    # tokens proposed, of those accepted, and engine steps that verified a draft.
    # ``None``: the engine does not speculate.
    drafted_tokens: int | None = None
    accepted_tokens: int | None = None
    draft_steps: int | None = None


@dataclass(frozen=True)
class ParsedTurn:
    """A turn's text split by a tool parser: the prose, and each call as (id, name, JSON args)."""

    content: str
    tool_calls: list[tuple[str, str, str]]


@dataclass(frozen=True)
class EngineStats:
    running: int
    waiting: int
    kv_usage: float  # fraction of the KV cache in use, 0..1
    generated_tokens: int = 0
    extra: dict[str, float] = field(default_factory=dict)
    # Speculative decoding since start, engine-wide (vLLM's scheduler stats, every request
    # including aborted ones): draft tokens proposed and accepted, drafts verified.
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    draft_steps: int = 0


class Engine(ABC):
    """An LLM engine serving trajectory steps.

    ``context`` is the trajectory's whole token history; the engine keeps
    what it can in its prefix cache, so a step whose context extends the
    previous one only prefills the new tokens.
    """

    name: str
    model: str
    tp: int
    max_model_len: int
    vocab_size: int  # token ids run from 0 to vocab_size - 1; known once started
    weights: LoadedWeights | None = None  # what it serves; set by start() and load_weights()
    last_push: Mapping[str, Any] = MappingProxyType(
        {}
    )  # the last receive_weights' figures (bytes, receive_s, kept)
    speculation: Speculation = NO_SPECULATION  # how it drafts (resolved: never 'auto')

    @property
    @abstractmethod
    def ready(self) -> bool: ...

    @abstractmethod
    async def start(self) -> None:
        """Load the model; ``ready`` turns true when this returns."""

    @abstractmethod
    async def step(
        self, trajectory_id: str, context: list[int], sampling: Sampling, priority: int
    ) -> StepOutput:
        """Generate one turn after ``context``; lower ``priority`` runs first.

        Cancelling the call drops the step from the engine (the client went away).
        Raises :class:`~heddle.exceptions.EngineInputError` for input the engine
        refuses, :class:`EngineError` when the engine itself failed.
        """

    @abstractmethod
    async def warm(self, trajectory_id: str, context: list[int]) -> None:
        """Prefill ``context`` into the prefix cache ahead of its next step."""

    @abstractmethod
    def release(self, trajectory_id: str) -> None:
        """Forget a trajectory's cached context."""

    @abstractmethod
    def stats(self) -> EngineStats: ...

    @abstractmethod
    async def abort_all(self) -> None:
        """Finish every in-flight step now with ``finish_reason="abort"``."""

    @abstractmethod
    async def shutdown(self) -> None: ...

    async def load_weights(self, path: str, version: str, *, keep: bool = False) -> LoadedWeights:
        """Swap in the checkpoint at ``path`` without a restart, keeping the KV cache.

        The caller drains steps first, unless ``keep``: then the engine pauses with its
        steps inside (their KV kept), loads, and resumes them. Raises
        :class:`~heddle.exceptions.CheckpointError` for a checkpoint that does not fit
        (the old weights keep serving),
        :class:`EngineError` when the engine broke while loading.
        """
        raise CheckpointError(f"the {self.name} engine cannot load weights in place")

    def push_layout(self) -> CheckpointLayout | None:
        """What pushed tensors must match (names, shapes); None: anything (no weights).

        Raises :class:`~heddle.exceptions.CheckpointError` where the engine cannot
        receive pushed weights, saying why.
        """
        raise CheckpointError(f"the {self.name} engine cannot receive pushed weights")

    async def fused_modules(self) -> Mapping[str, Sequence[str]]:
        """Modules the engine loads from several checkpoint tensors (``qkv_proj``: q, k, v)."""
        return {}

    async def receive_weights(self, spec: Mapping[str, Any], *, delta: bool) -> LoadedWeights:
        """Join the trainer's group, receive the plan's tensors and load them in place
        (:mod:`._weights_push`); :attr:`last_push` then holds the receipt's figures.

        ``delta``: received while steps run, then a pause (steps kept) for the load;
        else streamed into the paused engine. The prefix cache is reset. Raises
        :class:`~heddle.exceptions.CheckpointError` when nothing was loaded (the old
        weights keep serving), :class:`EngineError` when the engine broke while loading.
        """
        raise CheckpointError(f"the {self.name} engine cannot receive pushed weights")

    async def seed_drafts(self, key: str, token_ids: list[int]) -> bool:
        """Add a text the engine may draft from (vLLM's suffix cache); False: it cannot."""
        return False

    async def k_table(self) -> dict[str, Any] | None:
        """The K table the engine drafts by now, rebuilt from measured acceptance
        (heddle.scheduler.MeasuredKTable.state); None: K is not measured."""
        return None

    def encode(self, text: str) -> list[int]:
        """Text to token ids (the engine's tokenizer)."""
        raise NotImplementedError

    def decode(self, token_ids: list[int]) -> str:
        raise NotImplementedError

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        """Chat messages to text with the model's chat template, ``tools`` handed to it."""
        raise NotImplementedError

    def parse_tool_calls(
        self, text: str, parser: str, tools: Sequence[Mapping[str, Any]] | None
    ) -> ParsedTurn | None:
        """The turn's tool calls as the named vLLM parser reads them; ``None`` when this
        engine has no such parser (the caller parses the text itself)."""
        return None
