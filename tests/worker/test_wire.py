"""The client's typed messages (worker/_wire.py) are the server's models, field by field."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from heddle.worker import (
    GenerateRequest,
    GenerateResponse,
    ImportRequest,
    SamplingParams,
    Timings,
    WeightsRequest,
    WeightsResponse,
)
from heddle.worker._schemas import StepSpeculation
from heddle.worker._wire import (
    GenerateBody,
    GenerateReplyBody,
    ImportBody,
    SamplingBody,
    StepSpeculationBody,
    TimingsBody,
    WeightsBody,
    WeightsReplyBody,
)

PAIRS: list[tuple[Any, type[BaseModel]]] = [
    (SamplingBody, SamplingParams),
    (GenerateBody, GenerateRequest),
    (TimingsBody, Timings),
    (StepSpeculationBody, StepSpeculation),
    (GenerateReplyBody, GenerateResponse),
    (ImportBody, ImportRequest),
    (WeightsBody, WeightsRequest),
    (WeightsReplyBody, WeightsResponse),
]


@pytest.mark.parametrize(("typed", "model"), PAIRS, ids=[m.__name__ for _, m in PAIRS])
def test_the_client_s_message_has_the_server_s_fields_and_required_ones(
    typed: Any, model: type[BaseModel]
) -> None:
    fields = model.model_fields
    assert set(typed.__annotations__) == set(fields)
    # A field the server requires must be one the client always sends or always reads.
    required = {name for name, f in fields.items() if f.is_required()}
    assert set(typed.__required_keys__) == required


def test_a_body_the_client_builds_is_one_the_server_accepts() -> None:
    body: GenerateBody = {
        "sampling": {"max_tokens": 8, "temperature": 0.5, "logprobs": True},
        "priority": 3,
        "append_token_ids": [1, 2, 3],
        "weight_version": "7",
    }
    request = GenerateRequest.model_validate(body)
    assert request.sampling.max_tokens == 8 and request.priority == 3
    ImportRequest.model_validate(ImportBody(token_ids=[1, 2], warm=True))
    WeightsRequest.model_validate(WeightsBody(path="/ckpt", version="7"))
