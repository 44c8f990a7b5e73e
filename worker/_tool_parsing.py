"""Tool calls read from a turn's text by vLLM's own parsers, chosen by name.

The parsers need the model's tokenizer (some look up their tags' token ids), so
they run on the worker; the session's Hermes regex is the fallback for engines
without one (the sim engine).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from heddle.exceptions import EngineInputError

from ._engine import ParsedTurn

__all__ = ["VLLMToolParsers"]

# Parsers built per (name, tool schemas): building one reads the tokenizer's vocabulary.
_CACHED = 16


class VLLMToolParsers:
    """vLLM's tool parsers over one tokenizer, as its OpenAI server runs them on a full turn."""

    def __init__(self, tokenizer: Any, model: str) -> None:
        self._tokenizer = tokenizer
        self._model = model
        self._built: dict[tuple[str, str], Any] = {}

    def parse(
        self, text: str, parser: str, tools: Sequence[Mapping[str, Any]] | None
    ) -> ParsedTurn:
        from vllm.entrypoints.openai.chat_completion.protocol import (  # noqa: PLC0415
            ChatCompletionRequest,
        )

        request = ChatCompletionRequest(
            messages=[], model=self._model, tools=list(tools) if tools else None
        )
        key = (parser, json.dumps(tools, sort_keys=True))
        instance = self._built.get(key)
        if instance is None:
            instance = self._build(parser, request.tools)
            if len(self._built) >= _CACHED:
                self._built.pop(next(iter(self._built)))
            self._built[key] = instance
        info = instance.extract_tool_calls(text, request)
        calls = [(c.id, c.function.name, c.function.arguments) for c in info.tool_calls]
        return ParsedTurn(content=info.content or "", tool_calls=calls)

    def _build(self, parser: str, tools: Any) -> Any:
        from vllm.tool_parsers import ToolParserManager  # noqa: PLC0415 - optional extra

        try:
            cls = ToolParserManager.get_tool_parser(parser)
        except KeyError:
            raise EngineInputError(
                f"tool_parser={parser!r} is not in this vLLM; use one of "
                f"{', '.join(ToolParserManager.list_registered())}"
            ) from None
        try:
            return cls(self._tokenizer, tools)
        except (KeyError, ValueError, RuntimeError) as exc:
            # Parsers check at build time that the tokenizer has their tags.
            raise EngineInputError(
                f"tool_parser={parser!r} does not fit this model's tokenizer ({exc}); "
                "choose the parser of the model's family"
            ) from None
