"""The worker's OpenAPI schema is its contract: schemathesis checks a real sim worker against it.

Bounded so it stays a unit-test-sized run: ``EXAMPLES`` requests per endpoint
and generation mode (valid and invalid data), a fixed seed, and a time budget.
Driven through hypothesis directly: schemathesis' pytest plugin does not run
under this pytest.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import positive_data_acceptance

from .test_process import sim_worker

pytestmark = pytest.mark.slow  # real processes or engines; `-m 'not slow'` skips them

EXAMPLES = 20
# Every other check runs (server errors, documented statuses, content types, response
# schemas, invalid data refused). This one expects every schema-valid request to
# succeed, but some limits are facts of the running worker, not of the schema: the
# vocabulary size, the model's max length, the trajectories it holds. Those answers
# (400, 404, 422) are documented, which the status-code check does verify.
NOT_APPLICABLE = [positive_data_acceptance]
BUDGET_S = 45.0  # the whole run, well under a minute on a busy 2-core machine
TOKEN = "contract-token"
ENDPOINTS = sorted(
    [
        "POST /v1/trajectories/{trajectory_id}/generate",
        "PUT /v1/trajectories/{trajectory_id}",
        "GET /v1/trajectories/{trajectory_id}",
        "DELETE /v1/trajectories/{trajectory_id}",
        "DELETE /v1/trajectories",
        "POST /v1/drafts",
        "GET /v1/state",
        "POST /v1/weights",
        "POST /v1/weights/push",
        "GET /v1/weights/push/{version}",
        "GET /healthz",
        "GET /readyz",
        "GET /metrics",
    ]
)
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_every_answer_matches_the_schema(mode: GenerationMode, tmp_path: Path) -> None:
    # With a token, as in a pool: the schema declares it, and schemathesis' ignored_auth
    # check also sends each request without it and expects the documented 401.
    (tmp_path / "token").write_text(TOKEN)
    token_file = str(tmp_path / "token")
    with sim_worker("--time-scale", "0", "--max-model-len", "4096", "--token-file", token_file) as (
        _,
        url,
    ):
        schema = schemathesis.openapi.from_url(f"{url}/openapi.json", headers=AUTH)
        started = time.monotonic()
        operations = [result.ok() for result in schema.get_all_operations()]
        # Every endpoint by name, so none drops out of the contract unnoticed (and a new
        # one is added here on purpose).
        assert sorted(op.label for op in operations) == ENDPOINTS

        for operation in operations:
            if mode is GenerationMode.NEGATIVE and not operation.body:
                continue  # nothing to get wrong: the path's id is any string, no body

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=EXAMPLES,
                derandomize=True,
                deadline=None,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
                database=None,
            )
            def check(case: Any) -> None:
                case.call_and_validate(base_url=url, headers=AUTH, excluded_checks=NOT_APPLICABLE)

            check()
        assert time.monotonic() - started < BUDGET_S, "the contract run outgrew its budget"
