"""The session's record of one trajectory: histories in typed arrays, written as JSON."""

from __future__ import annotations

import dataclasses
import json
import math

from heddle.rollout import SyntheticEnvironment, TrajectoryRun, load_workload, synthetic_tasks
from heddle.scheduler import Trajectory
from heddle.worker import StepReply


def _run() -> TrajectoryRun:
    workload = load_workload("quickstart")
    tasks = synthetic_tasks(1, workload, 0)
    env = SyntheticEnvironment(workload, 1, 1, seed=0)
    return TrajectoryRun(
        Trajectory("t", "g", prompt_tokens=0), tasks[0], 0, 0, env.episode(tasks[0], 0, 0, "t")
    )


def test_a_logprob_json_cannot_carry_is_written_as_null() -> None:
    """-inf and NaN reach the session as null; one of them must not stop the session."""
    run = _run()
    reply = StepReply([1, 2], [7, 8, 9], "abc", "stop", 2, 0, [-0.5, None, -1.5], 0.0, 0.0)
    run.apply("w", reply, want_logprobs=True)
    record = run.record(policy="heddle", want_logprobs=True)
    assert record["response_logprobs"] == [-0.5, None, -1.5]
    assert record["response_token_ids"] == [7, 8, 9] and record["prompt_token_ids"] == [1, 2]
    assert record["response_mask"] == [1, 1, 1]
    text = json.dumps(record, allow_nan=False)  # valid JSON: no NaN
    assert not math.isnan(json.loads(text)["response_logprobs"][0])


def test_forgetting_the_history_keeps_what_the_session_still_counts() -> None:
    run = _run()
    run.apply("w", StepReply([1], [5, 6], "x", "stop", 1, 0, None, 0.0, 0.0), want_logprobs=False)
    run.forget_history()
    assert (len(run.tokens), len(run.mask), run.messages) == (0, 0, [])
    assert run.traj.turns == 1 and run.traj.generated_tokens == 2


def test_the_record_written_is_the_typed_output_record_and_the_docs_name_every_field() -> None:
    from pathlib import Path
    from typing import get_type_hints

    from heddle.rollout import OutputRecord, TrajectoryStatus

    run = _run()
    run.apply("w", StepReply([1], [5, 6], "x", "stop", 1, 0, [-0.1, -0.2], 0.0, 0.0), True)
    run.status = TrajectoryStatus.DONE
    record = run.record(policy="heddle", want_logprobs=True, weight_version="7")
    fields = set(get_type_hints(OutputRecord))
    # episode: external environments only; speculation: pools that speculate
    assert set(record) == fields - {"episode", "speculation"}
    assert set(record) - {"response_logprobs"} == set(OutputRecord.__required_keys__)
    assert json.loads(json.dumps(record))["status"] == "done"
    docs = (Path(__file__).resolve().parents[2] / "docs" / "rollouts.md").read_text()
    output = docs[docs.index("## Output: one JSON line") : docs.index("## Export to a trainer")]
    missing = sorted(f for f in fields if f'"{f}"' not in output and f"`{f}`" not in output)
    assert missing == [], f"docs/rollouts.md's Output section does not name {missing}"


def test_a_trajectory_across_weight_versions_says_so_step_by_step() -> None:
    """Each step's tokens carry the version that generated them; the export to slime lists
    one version per step, and the logprobs of each segment are that policy's."""
    from heddle.rollout import TRAINERS, TrajectoryStatus

    run = _run()
    run.apply("w", StepReply([1, 2], [5, 6], "a", "stop", 2, 0, [-0.1, -0.2], 0, 0), True, "3")
    run.apply(
        "w", StepReply([9], [7, 8, 4], "b", "stop", 5, 0, [-1.0, -2.0, -3.0], 0, 0), True, "4"
    )
    run.status = TrajectoryStatus.DONE
    record = run.record(policy="heddle", want_logprobs=True, weight_version="4")
    # response = [5, 6] + tool [9] + [7, 8, 4]: the second step's tokens start at 3.
    assert record["segments"] == [
        {"weight_version": "3", "response_start": 0, "response_end": 2},
        {"weight_version": "4", "response_start": 3, "response_end": 6},
    ]
    assert record["weight_version"] == "3"  # the oldest: staleness counts from it
    assert record["weight_versions"] == ["3", "4"]
    second = record["segments"][1]
    logprobs = record["response_logprobs"][second["response_start"] : second["response_end"]]
    assert logprobs == [-1.0, -2.0, -3.0]
    assert all(record["response_mask"][second["response_start"] : second["response_end"]])
    row = json.loads(json.dumps(record))
    assert TRAINERS["slime"](row, 0)["weight_versions"] == ["3", "4"]
    assert TRAINERS["verl"](row, 0)["non_tensor_batch"]["weight_versions"] == ["3", "4"]


def test_without_named_weights_the_versions_stay_empty() -> None:
    run = _run()
    run.apply("w", StepReply([1], [5], "x", "stop", 1, 0, None, 0.0, 0.0), want_logprobs=False)
    record = run.record(policy="heddle", want_logprobs=False)
    assert record["weight_version"] is None and record["weight_versions"] == []
    assert record["segments"] == [{"weight_version": None, "response_start": 0, "response_end": 1}]


def test_speculation_counts_add_up_over_steps_into_tokens_per_decode_step() -> None:
    run = _run()
    for tokens, drafted, accepted in (([5, 6, 7, 8], 6, 2), ([9, 10], 2, 0)):
        reply = StepReply([1], tokens, "x", "stop", 1, 0, None, 0.0, 0.0)
        reply = dataclasses.replace(
            reply,
            drafted_tokens=drafted,
            accepted_tokens=accepted,
            decode_steps=len(tokens) - accepted,
        )
        run.apply("w", reply, want_logprobs=False)
    record = run.record(policy="heddle", want_logprobs=False)
    # 6 tokens in 4 engine steps: 2 of them came from accepted drafts.
    assert record["speculation"] == {
        "drafted_tokens": 8,
        "accepted_tokens": 2,
        "decode_steps": 4,
        "tokens_per_decode_step": 1.5,
    }
    plain = _run()
    plain.apply("w", StepReply([1], [5], "x", "stop", 1, 0, None, 0.0, 0.0), False)
    assert "speculation" not in plain.record(policy="heddle", want_logprobs=False)
