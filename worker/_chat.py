"""Chat messages to tokens the way the model's chat template would render the whole conversation.

A trajectory's context lives on the worker as tokens; each step appends only
the new messages (tool results, the next user turn). Rendering those messages
on their own is wrong for most templates: Qwen's inserts its default system
prompt (and the tool schemas) before any conversation that does not start
with a system message, and the newline a template writes after the model's
end-of-turn token is never generated. :func:`chat_delta` renders the new
messages behind a fixed dummy exchange and keeps only what follows it, plus
whatever closes the model's last turn, so the context grows by exactly the
tokens a full re-render of the conversation would add (tests/worker/test_chat.py
checks this over random conversations).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["TOOL_PARSERS", "Render", "chat_delta", "tool_schema_error"]

Render = Callable[[list[dict[str, Any]], bool], str]
"""(messages, add_generation_prompt) -> the template's text, tools already bound."""

# The names vLLM 0.32's ToolParserManager registers (tests/worker/test_vllm_chat.py keeps
# them equal); written here so a RolloutJob is checked at apply time without importing vLLM.
TOOL_PARSERS = (
    "apertus", "cohere_command3", "cohere_command4", "deepseek_v3", "deepseek_v31",
    "deepseek_v32", "deepseek_v4", "deepseek_v41", "dots", "ernie45", "functiongemma",
    "gemma4", "gigachat3", "glm45", "glm47", "granite", "granite-20b-fc", "granite4",
    "hermes", "hf", "hunyuan_a13b", "hy_v3", "hy_v4", "inkling", "internlm", "jamba",
    "k2_horizon", "kimi_k2", "kimi_k3", "lfm2", "ling3", "llama3_json", "llama4_json",
    "llama4_pythonic", "longcat", "mimo", "minicpm5", "minimax_m2", "minimax_m3", "mistral",
    "muse_glimmer", "olmo3", "openai", "phi4_mini_json", "plamo3", "poolside_v1", "pythonic",
    "qwen3_coder", "qwen3_json", "qwen3_xml", "seed_oss", "step3", "step3p5", "xlam",
)  # fmt: skip

# Stands in for the conversation so far: its rendering is cut off the front.
_DUMMY_CONTENT = "heddle-dummy-turn"
_DUMMY: list[dict[str, Any]] = [
    {"role": "user", "content": _DUMMY_CONTENT},
    {"role": "assistant", "content": _DUMMY_CONTENT},
]


def chat_delta(
    render: Render,
    encode: Callable[[str], list[int]],
    messages: Sequence[Mapping[str, Any]],
    last_token: int | None,
) -> list[int]:
    """The tokens that append ``messages`` and the generation prompt to a context.

    ``last_token`` is the context's last token, ``None`` for a new context (then
    the whole conversation is ``messages``). A context holds whole model turns,
    so it ends where the model stopped: on the template's end-of-turn token, or
    cut short (max tokens), in which case the turn is closed as the template
    closes it.
    """
    new = [dict(m) for m in messages]
    if last_token is None:
        return encode(render(new, True))
    asked = render(_DUMMY[:1], True)
    answered = render(_DUMMY, False)
    extended = render([*_DUMMY, *new], True)
    turn = answered[len(asked) :]
    if not (
        answered.startswith(asked) and extended.startswith(answered) and _DUMMY_CONTENT in turn
    ):
        raise ValueError(
            "the model's chat template does not render a conversation as a prefix of its "
            "continuation; send append_token_ids instead of messages"
        )
    # What the template writes after an assistant turn's content: its end-of-turn marks.
    closing = encode(turn[turn.rindex(_DUMMY_CONTENT) + len(_DUMMY_CONTENT) :])
    if closing and closing[0] == last_token:
        closing = closing[1:]  # the model generated the end-of-turn token itself
    return [*closing, *encode(extended[len(answered) :])]


_FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_JSON_TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}


def tool_schema_error(tool: Any, where: str) -> str | None:
    """Why ``tool`` is not an OpenAI function tool, in one sentence naming ``where``; or None.

    The shape is OpenAI's: ``{"type": "function", "function": {"name", "description",
    "parameters"}}`` with ``parameters`` a JSON Schema of type ``object``.
    """
    example = (
        '; write {"type": "function", "function": {"name": "search", "description": "...", '
        '"parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}}'
    )
    if not isinstance(tool, Mapping) or tool.get("type") != "function":
        return f"{where} must be an OpenAI function tool with type 'function'{example}"
    unknown = set(tool) - {"type", "function"}
    if unknown:
        return f"{where} has unknown field(s) {sorted(unknown)}{example}"
    function = tool.get("function")
    if not isinstance(function, Mapping):
        return f"{where}.function must be an object{example}"
    name = function.get("name")
    if not isinstance(name, str) or not _FUNCTION_NAME.fullmatch(name):
        return (
            f"{where}.function.name={name!r} must be 1 to 64 letters, digits, '_' or '-' "
            "(OpenAI's rule for function names)"
        )
    if not isinstance(function.get("description", ""), str):
        return f"{where}.function.description must be a string"
    unknown = set(function) - {"name", "description", "parameters", "strict"}
    if unknown:
        return (
            f"{where}.function has unknown field(s) {sorted(unknown)}; "
            "use name, description, parameters, strict"
        )
    if "parameters" not in function:
        return None
    parameters = function["parameters"]
    if not isinstance(parameters, Mapping) or parameters.get("type") != "object":
        return f'{where}.function.parameters must be a JSON Schema with "type": "object"{example}'
    return _schema_error(parameters, f"{where}.function.parameters")


def _schema_error(schema: Any, where: str) -> str | None:
    """The first thing that makes ``schema`` an invalid JSON Schema (the parts tools use)."""
    if isinstance(schema, bool):
        return None  # true/false are schemas too
    if not isinstance(schema, Mapping):
        return f"{where} must be a JSON Schema object, not {type(schema).__name__}"
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    for k in kinds:
        if k not in _JSON_TYPES:
            return f"{where}.type={k!r} is not a JSON Schema type; use one of {sorted(_JSON_TYPES)}"
    properties = schema.get("properties", {})
    if not isinstance(properties, Mapping):
        return f"{where}.properties must map property names to schemas"
    for name, sub in properties.items():
        if (error := _schema_error(sub, f"{where}.properties.{name}")) is not None:
            return error
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        return f"{where}.required must be a list of property names"
    missing = [r for r in required if r not in properties]
    if missing and properties:
        return f"{where}.required names {missing}, which are not in its properties"
    if "items" in schema and (error := _schema_error(schema["items"], f"{where}.items")):
        return error
    if "enum" in schema and not isinstance(schema["enum"], list):
        return f"{where}.enum must be a list of values"
    return None
