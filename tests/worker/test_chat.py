"""Chat rendering: appending messages to a context gives the tokens of a full re-render.

The template is the tiny model's, shaped like Qwen2.5's (a default system prompt, tool
schemas in the system turn, consecutive tool results in one user turn); the tokenizer is
the tiny model's byte-level BPE, so no model weights are needed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from heddle.worker._chat import chat_delta, tool_schema_error
from heddle.worker._tiny_model import DEFAULT_SYSTEM_PROMPT

pytest.importorskip("transformers")

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from heddle.worker._tiny_model import tiny_tokenizer

    return tiny_tokenizer()


def renderer(tokenizer: Any, tools: list[dict[str, Any]] | None) -> Callable[..., str]:
    def render(messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        return str(
            tokenizer.apply_chat_template(
                messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
            )
        )

    return render


# No special-token text, no leading whitespace in an assistant turn: text the model could
# emit after "assistant\n" and that tokenises the same alone as in the whole render.
_text = st.text(alphabet='abcxyz019 .,:{}"_\n', min_size=1, max_size=24).map(lambda s: "t" + s)
_call = st.builds(
    lambda i, q: {
        "id": f"call_{i}",
        "type": "function",
        "function": {"name": "search", "arguments": f'{{"query": "{q}"}}'},
    },
    st.integers(0, 99),
    st.text(alphabet="abc xyz", max_size=8),
)
_assistant = st.builds(
    lambda content, calls: (
        {"role": "assistant", "content": content, "tool_calls": calls}
        if calls
        else {"role": "assistant", "content": content}
    ),
    st.one_of(st.just(""), _text),
    st.lists(_call, max_size=2),
).filter(lambda m: m["content"] or m.get("tool_calls"))
_tool = st.builds(
    lambda content, i: {"role": "tool", "content": content, "tool_call_id": f"call_{i}"},
    _text,
    st.integers(0, 99),
)
_user = st.builds(lambda content: {"role": "user", "content": content}, _text)
# What the session appends between two model turns: tool results, or the next user turn.
_group = st.one_of(st.lists(_tool, min_size=1, max_size=3), st.lists(_user, min_size=1, max_size=1))
_first = st.builds(
    lambda system, user: [*system, user],
    st.lists(st.builds(lambda c: {"role": "system", "content": c}, _text), max_size=1),
    _user,
)
_rounds = st.lists(st.tuples(_assistant, _group, st.booleans()), max_size=5)


@pytest.mark.slow
@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(first=_first, rounds=_rounds, with_tools=st.booleans())
def test_appending_messages_gives_the_tokens_of_a_full_rerender(
    tokenizer: Any,
    first: list[dict[str, Any]],
    rounds: list[tuple[dict[str, Any], list[dict[str, Any]], bool]],
    with_tools: bool,
) -> None:
    render = renderer(tokenizer, TOOLS if with_tools else None)

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    context = chat_delta(render, encode, first, None)
    history = list(first)
    for assistant, group, cut_short in rounds:
        # The model "generates" its turn as the template renders it, up to its stop token;
        # a turn cut at max tokens lacks that token.
        asked = encode(render(history, True))
        answered = encode(render([*history, assistant], False))
        assert answered[: len(asked)] == asked
        generated = answered[len(asked) :]
        generated = generated[: generated.index(end_of_turn) + (0 if cut_short else 1)]
        context += generated
        history.append(assistant)
        context += chat_delta(render, encode, group, context[-1])
        history += group
    assert context == encode(render(history, True))


def test_new_tool_messages_rendered_alone_would_repeat_the_system_prompt(tokenizer: Any) -> None:
    """Why chat_delta exists: this template prefixes any conversation with its system turn."""
    render = renderer(tokenizer, TOOLS)
    tool = {"role": "tool", "content": "42", "tool_call_id": "call_0"}
    assert DEFAULT_SYSTEM_PROMPT in render([tool], True)

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    delta = tokenizer.decode(chat_delta(render, encode, [tool], tokenizer.eos_token_id))
    assert delta == "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n" + (
        "<|im_start|>assistant\n"
    )


@pytest.mark.parametrize(
    ("tool", "where"),
    [
        ({"type": "function"}, "tools[0].function must be an object"),
        ({"function": {"name": "x"}}, "tools[0] must be an OpenAI function tool"),
        ({"type": "function", "function": {"name": "a b"}}, "tools[0].function.name='a b'"),
        (
            {"type": "function", "function": {"name": "x", "parameters": {"type": "string"}}},
            'tools[0].function.parameters must be a JSON Schema with "type": "object"',
        ),
        (
            {
                "type": "function",
                "function": {
                    "name": "x",
                    "parameters": {"type": "object", "properties": {"q": {"type": "text"}}},
                },
            },
            "tools[0].function.parameters.properties.q.type='text' is not a JSON Schema type",
        ),
        (
            {
                "type": "function",
                "function": {
                    "name": "x",
                    "parameters": {
                        "type": "object",
                        "properties": {"q": {"type": "string"}},
                        "required": ["query"],
                    },
                },
            },
            "tools[0].function.parameters.required names ['query']",
        ),
    ],
)
def test_an_invalid_tool_schema_is_named_with_its_field(tool: Any, where: str) -> None:
    error = tool_schema_error(tool, "tools[0]")
    assert error is not None and error.startswith(where), error


def test_a_valid_tool_schema_passes() -> None:
    assert tool_schema_error(TOOLS[0], "tools[0]") is None
    assert tool_schema_error({"type": "function", "function": {"name": "now"}}, "t") is None


def test_a_template_that_rewrites_earlier_turns_is_refused_in_a_sentence() -> None:
    def render(messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        # Numbers every turn from the end: appending a turn changes all earlier ones.
        n = len(messages)
        return "".join(f"[{n - i}]{m['content']}" for i, m in enumerate(messages))

    with pytest.raises(ValueError, match="send append_token_ids instead of messages"):
        chat_delta(render, lambda text: list(text.encode()), [{"role": "tool", "content": "x"}], 1)
