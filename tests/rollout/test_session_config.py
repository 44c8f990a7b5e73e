"""A job's own session settings reach the session, also where the operator passes its own
``SessionConfig`` (the session pod always does)."""

from __future__ import annotations

from typing import Any

from heddle.api import RolloutJobSpec
from heddle.rollout import SessionConfig, session_config_for


def _job(scheduling: dict[str, Any]) -> RolloutJobSpec:
    return RolloutJobSpec.from_manifest(
        {
            "apiVersion": "heddle.dev/v1alpha1",
            "kind": "RolloutJob",
            "metadata": {"name": "j", "namespace": "ns"},
            "spec": {
                "enginePool": "p",
                "environment": {"type": "synthetic", "synthetic": {"workload": "coding"}},
                "scheduling": scheduling,
                "output": {"path": "out.jsonl"},
            },
        }
    )


def test_the_jobs_replan_interval_overrides_the_operators_settings() -> None:
    operator = SessionConfig(replan_interval_s=2.0, step_timeout_s=30.0, max_step_retries=3)
    config = session_config_for(_job({"replanIntervalSeconds": 0.25}), operator)
    assert config.replan_interval_s == 0.25
    # What a job cannot set stays the operator's.
    assert (config.step_timeout_s, config.max_step_retries) == (30.0, 3)


def test_without_operator_settings_the_defaults_and_the_jobs_value_apply() -> None:
    config = session_config_for(_job({"replanIntervalSeconds": 7}))
    assert config.replan_interval_s == 7.0
    assert config.step_timeout_s == SessionConfig().step_timeout_s


def test_a_job_that_leaves_the_field_out_gets_the_documented_default() -> None:
    operator = SessionConfig(replan_interval_s=9.0)
    assert session_config_for(_job({}), operator).replan_interval_s == 2.0
