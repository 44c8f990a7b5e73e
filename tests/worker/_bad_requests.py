"""Bad generate requests every engine must refuse alike: (body, status, part of the error).

Shared by test_api (sim engine) and test_vllm (real vLLM): the API, not the
engine, validates them, so both answer the same 4xx with the same sentence.
Bodies are raw JSON text so that values JSON libraries refuse to write
(``Infinity``, integers past 64 bits) reach the worker as a client could send them.
"""

from __future__ import annotations

BAD_GENERATE_BODIES: list[tuple[str, int, str]] = [
    (
        '{"append_token_ids": [1], "sampling": {"temperature": 2.5}}',
        422,
        "sampling.temperature must be a number in [0.0, 2.0], not 2.5",
    ),
    (
        '{"append_token_ids": [1], "sampling": {"temperature": Infinity}}',
        422,
        "sampling.temperature must be a number in [0.0, 2.0], not inf",
    ),
    (
        '{"append_token_ids": [1], "sampling": {"temperature": -1}}',
        422,
        "sampling.temperature must be a number in [0.0, 2.0], not -1",
    ),
    (
        '{"append_token_ids": [1], "sampling": {"top_p": 0}}',
        422,
        "sampling.top_p must be a number in (0.0, 1.0], not 0",
    ),
    (
        '{"append_token_ids": [1], "sampling": {"seed": 18446744073709551616}}',
        422,
        "sampling.seed must be a number in [0, 18446744073709551615], not 18446744073709551616",
    ),
    (
        '{"append_token_ids": [1], "sampling": {"max_tokens": 0}}',
        422,
        "sampling.max_tokens must be a number in [1, inf), not 0",
    ),
    (
        '{"append_token_ids": [1], "priority": 9223372036854775808}',
        422,
        "priority must be a number in [-9223372036854775808, 9223372036854775807]",
    ),
    (
        '{"append_token_ids": [1], "priority": -9223372036854775809}',
        422,
        "priority must be a number in [-9223372036854775808, 9223372036854775807]",
    ),
    ('{"messages": []}', 422, "messages: List should have at least 1 item"),
    ('{"append_token_ids": [-1]}', 422, "append_token_ids holds token id -1, outside the model"),
    (
        '{"append_token_ids": [1], "sampling": {"stop_token_ids": [-5]}}',
        422,
        "sampling.stop_token_ids holds token id -5, outside the model's vocabulary",
    ),
    ("", 422, "the request needs a JSON body"),
    ("{not json", 400, "request body is not valid JSON"),
]
