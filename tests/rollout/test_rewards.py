"""Rewards: the manifest field, the HTTP and scripted scorers, and a session that scores."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from heddle.api import RewardSpec, RolloutJobSpec, SamplingSpec, ToolsSpec
from heddle.exceptions import ManifestError
from heddle.rollout import (
    HostAllowList,
    HttpReward,
    LocalPool,
    OutputSink,
    RewardResult,
    RolloutSession,
    ScriptedReward,
    SessionConfig,
    SessionMetrics,
    Task,
    ToolsEnvironment,
    check_tool_hosts,
)
from heddle.scheduler import HARDWARE_PRESETS, MODEL_PRESETS, PerfModel
from heddle.worker import WorkerEndpoint

from .._rollout_fixtures import assert_exactly_once, read_records

# What each path of the reward server answers (status, body); /flaky fails twice first.
REPLIES: dict[str, tuple[int, bytes]] = {
    "/ok": (200, b'{"reward": 0.75, "info": {"correct": true}}'),
    "/int": (200, b'{"reward": 1}'),
    "/nan": (200, b'{"reward": NaN}'),
    "/string": (200, b'{"reward": "1.0"}'),
    "/bool": (200, b'{"reward": true}'),
    "/missing": (200, b'{"score": 1.0}'),
    "/badinfo": (200, b'{"reward": 1.0, "info": "yes"}'),
    "/garbage": (200, b"<html>busy</html>"),
    "/refuse": (422, b'{"error": "no ground truth for this task"}'),
    "/down": (503, b"overloaded"),
}


class RewardServer:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.calls.append((self.path, body))
                    tries = sum(1 for p, _ in server.calls if p == self.path)
                if self.path == "/slow":
                    time.sleep(2.0)
                status, reply = REPLIES.get(self.path, (200, b'{"reward": 0.5}'))
                if self.path == "/flaky" and tries <= 2:
                    status, reply = 500, b"warming up"
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(reply)))
                    self.end_headers()
                    self.wfile.write(reply)
                except BrokenPipeError:  # the client's deadline came first: what /slow is for
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def paths(self, path: str) -> int:
        return sum(1 for p, _ in self.calls if p == path)


@pytest.fixture
def reward_server() -> Iterator[RewardServer]:
    server = RewardServer()
    thread = threading.Thread(target=server.httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()


RECORD = {"task_id": "t1", "sample": 0, "messages": [{"role": "user", "content": "2+2?"}]}


def _score(server: RewardServer, path: str, retries: int = 2) -> RewardResult:
    async def go() -> RewardResult:
        scorer = HttpReward(
            RewardSpec("http", url=server.url + path, timeout_s=0.5, retries=retries)
        )
        try:
            return await scorer.score(RECORD)
        finally:
            await scorer.close()

    return asyncio.run(go())


def test_reward_reply_gives_reward_and_info(reward_server: RewardServer) -> None:
    got = _score(reward_server, "/ok")
    assert (got.reward, got.info, got.error) == (0.75, {"correct": True}, None)
    assert reward_server.calls[0][1] == RECORD  # the record is what the endpoint sees
    assert _score(reward_server, "/int").reward == 1.0


@pytest.mark.parametrize(
    ("path", "sentence"),
    [
        ("/nan", "reward=NaN; it must be a finite number"),
        ("/string", 'reward="1.0"; it must be a finite number'),
        ("/bool", "reward=true; it must be a finite number"),
        ("/missing", 'replied without a "reward" field'),
        ("/badinfo", 'info="yes"; give an object'),
        ("/refuse", 'refused the trajectory (422): {"error": "no ground truth'),
    ],
)
def test_malformed_or_refused_reply_is_one_sentence_and_not_retried(
    reward_server: RewardServer, path: str, sentence: str
) -> None:
    got = _score(reward_server, path)
    assert got.reward is None and got.error is not None and sentence in got.error
    assert "\n" not in got.error and "Traceback" not in got.error
    assert reward_server.paths(path) == 1  # the endpoint would answer the same again


def test_server_errors_and_garbage_are_retried_like_tools(reward_server: RewardServer) -> None:
    assert _score(reward_server, "/flaky", retries=2).reward == 0.5
    assert reward_server.paths("/flaky") == 3
    for path in ("/down", "/garbage"):
        got = _score(reward_server, path, retries=1)
        assert got.reward is None and got.error is not None
        assert got.error.startswith("reward endpoint failed after 2 attempts")
        assert reward_server.paths(path) == 2


def test_timeout_bounds_each_attempt(reward_server: RewardServer) -> None:
    started = time.monotonic()
    got = _score(reward_server, "/slow", retries=0)
    assert time.monotonic() - started < 1.5
    assert got.error is not None and "within 0.5 s (timeoutSeconds)" in got.error


def test_unreachable_endpoint_is_named() -> None:
    async def go() -> RewardResult:
        scorer = HttpReward(RewardSpec("http", url="http://127.0.0.1:9/", retries=0))
        return await scorer.score(RECORD)

    got = asyncio.run(go())
    assert got.error is not None and "reward server refused the connection" in got.error


def test_scripted_reward_is_deterministic_and_follows_the_rate() -> None:
    def scores(seed: int, rate: float) -> list[float | None]:
        scorer = ScriptedReward(RewardSpec("scripted", success_rate=rate, seed=seed))
        return [
            asyncio.run(scorer.score({"task_id": f"p{i}", "sample": s})).reward
            for i in range(50)
            for s in range(4)
        ]

    first = scores(0, 0.3)
    assert first == scores(0, 0.3)
    assert set(first) == {0.0, 1.0} and 0.2 < sum(first) / len(first) < 0.4  # type: ignore[arg-type]
    assert first != scores(1, 0.3)
    assert set(scores(0, 0.0)) == {0.0} and set(scores(0, 1.0)) == {1.0}


def _job(reward: Any) -> RolloutJobSpec:
    return RolloutJobSpec.from_manifest(
        {
            "metadata": {"name": "j"},
            "spec": {
                "enginePool": "p",
                "tasks": {"inline": [{"prompt": "hi"}]},
                "output": {"path": "out.jsonl"},
                "environment": {"reward": reward},
            },
        }
    )


def test_manifest_reward_fields() -> None:
    spec = _job({"url": "http://r:8000/score", "timeoutSeconds": 5, "onError": "fail"})
    assert spec.environment.reward == RewardSpec(
        "http", url="http://r:8000/score", timeout_s=5.0, on_error="fail"
    )
    scripted = _job({"type": "scripted", "successRate": 0.25, "seed": 3}).environment.reward
    assert scripted == RewardSpec("scripted", success_rate=0.25, seed=3)
    assert _job(None).environment.reward is None


@pytest.mark.parametrize(
    ("reward", "sentence"),
    [
        ({}, r"spec.environment.reward.url is required"),
        ({"url": "r:8000"}, r"reward.url='r:8000' must start with http:// or https://"),
        ({"url": "http://r", "onError": "ignore"}, r"onError='ignore'; choose one of"),
        ({"type": "scripted", "successRate": 2}, r"successRate=2 must be in \[0, 1\]"),
        ({"type": "scripted", "url": "http://r"}, r"unknown field\(s\) \['url'\]"),
    ],
)
def test_manifest_reward_errors_name_the_field(reward: Any, sentence: str) -> None:
    with pytest.raises(ManifestError, match=sentence):
        _job(reward)


def test_reward_host_outside_the_allow_list_is_refused() -> None:
    allowed = HostAllowList.parse("grader.rl.svc")
    check_tool_hosts(_job({"url": "http://grader.rl.svc/score"}), allowed)
    check_tool_hosts(_job({"type": "scripted"}), allowed)  # nothing to reach
    with pytest.raises(ManifestError) as err:
        check_tool_hosts(_job({"url": "http://169.254.169.254/x"}), allowed)
    assert str(err.value).startswith(
        "RolloutJob 'j' spec.environment.reward.url http://169.254.169.254/x: host "
        "'169.254.169.254' is not among the hosts this operator lets tools reach "
        "(HEDDLE_TOOL_ALLOWED_HOSTS; with the Helm chart, operator.toolAllowedHosts)"
    )


def test_crd_reward_schema_accepts_both_types_and_defaults_only_shared_fields() -> None:
    from ..operator._cluster import crd_schemas, validate

    job = {
        "apiVersion": "heddle.dev/v1alpha1",
        "kind": "RolloutJob",
        "metadata": {"name": "j"},
        "spec": {"enginePool": "p", "tasks": {"path": "t.jsonl"}, "output": {"path": "o.jsonl"}},
    }
    for reward in ({"url": "http://r/score", "onError": "fail"}, {"type": "scripted"}):
        job["spec"]["environment"] = {"reward": reward}  # type: ignore[index]
        validate("rolloutjobs", job)
    env = crd_schemas()["rolloutjobs"]["properties"]["spec"]["properties"]["environment"]
    fields = env["properties"]["reward"]["properties"]
    # The API server fills defaults in; one on an http-only field would break a scripted reward.
    assert {k for k, v in fields.items() if "default" in v} == {"type", "onError"}


# -- a session that scores ---------------------------------------------------------------

PERF = PerfModel(MODEL_PRESETS["qwen3-8b"], HARDWARE_PRESETS["h100-sxm"])


def _run(
    workers: list[WorkerEndpoint],
    out: Path,
    spec: RewardSpec,
    tasks: list[Task],
    **kwargs: Any,
) -> tuple[list[dict[str, Any]], SessionMetrics]:
    env = ToolsEnvironment(ToolsSpec())  # no tools: each trajectory is one turn
    env.reward = HttpReward(spec) if spec.type == "http" else ScriptedReward(spec)
    metrics = SessionMetrics(CollectorRegistry())
    session = RolloutSession(
        job="t",
        tasks=tasks,
        samples_per_task=2,
        environment=env,
        workers=workers,
        sink=OutputSink(out),
        perf=PERF,
        sampling=SamplingSpec(max_tokens_per_turn=64, max_total_tokens=64),
        max_turns=4,
        config=SessionConfig(replan_interval_s=0.3, health_interval_s=0.2),
        metrics=metrics,
        **kwargs,
    )
    asyncio.run(session.run())
    return read_records(out), metrics


def _tasks(n: int) -> list[Task]:
    return [
        Task(f"t{i}", ({"role": "user", "content": f"<reply>answer {i}</reply>"},))
        for i in range(n)
    ]


def _calls(metrics: SessionMetrics, outcome: str) -> float:
    value = metrics.registry.get_sample_value(
        "heddle_rollout_reward_calls_total", {"job": "t", "outcome": outcome}
    )
    return value or 0.0


def test_session_records_each_reward_once(
    scripted_pool: tuple[LocalPool, list[WorkerEndpoint]],
    reward_server: RewardServer,
    tmp_path: Path,
) -> None:
    _, workers = scripted_pool
    tasks = _tasks(3)
    records, metrics = _run(
        workers, tmp_path / "o.jsonl", RewardSpec("http", url=reward_server.url + "/ok"), tasks
    )
    assert_exactly_once(records, {(t.id, s) for t in tasks for s in range(2)})
    for r in records:
        assert (r["status"], r["reward"], r["reward_info"], r["reward_error"]) == (
            "done",
            0.75,
            {"correct": True},
            None,
        )
    bodies = [b for _, b in reward_server.calls]
    assert len(bodies) == 6  # one call per trajectory
    assert {(b["task_id"], b["sample"]) for b in bodies} == {
        (r["task_id"], r["sample"]) for r in records
    }
    assert all(b["messages"][-1]["role"] == "assistant" and "reward" not in b for b in bodies)
    assert _calls(metrics, "ok") == 6 and _calls(metrics, "error") == 0


@pytest.mark.parametrize("on_error", ["record", "fail"])
def test_failed_reward_is_recorded_and_fails_only_when_asked(
    scripted_pool: tuple[LocalPool, list[WorkerEndpoint]],
    reward_server: RewardServer,
    tmp_path: Path,
    on_error: str,
) -> None:
    _, workers = scripted_pool
    spec = RewardSpec("http", url=reward_server.url + "/nan", on_error=on_error)
    records, metrics = _run(workers, tmp_path / "o.jsonl", spec, _tasks(2))
    assert len(records) == 4
    for r in records:
        assert r["reward"] is None and "must be a finite number" in r["reward_error"]
        if on_error == "fail":
            assert (r["status"], r["finish_reason"]) == ("failed", "reward_failed")
            assert r["error"] == r["reward_error"]
        else:
            assert (r["status"], r["error"]) == ("done", None)
    assert _calls(metrics, "error") == 4


def test_deadline_during_the_reward_call_still_writes_the_trajectory(
    scripted_pool: tuple[LocalPool, list[WorkerEndpoint]],
    reward_server: RewardServer,
    tmp_path: Path,
) -> None:
    _, workers = scripted_pool
    spec = RewardSpec("http", url=reward_server.url + "/slow", timeout_s=10.0)
    tasks = _tasks(2)
    records, _ = _run(workers, tmp_path / "o.jsonl", spec, tasks, deadline_s=1.0)
    assert_exactly_once(records, {(t.id, s) for t in tasks for s in range(2)})
    for r in records:
        assert r["status"] == "done" and r["reward"] is None
        assert r["reward_error"] == "the deadline came before the reward endpoint answered"


def test_scripted_reward_in_a_session(
    scripted_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    _, workers = scripted_pool
    spec = RewardSpec("scripted", success_rate=0.5, seed=7)
    first, _ = _run(workers, tmp_path / "a.jsonl", spec, _tasks(4))
    again, _ = _run(workers, tmp_path / "b.jsonl", spec, _tasks(4))

    def rewards(records: list[dict[str, Any]]) -> dict[tuple[str, int], float]:
        return {(r["task_id"], r["sample"]): r["reward"] for r in records}

    assert rewards(first) == rewards(again) and set(rewards(first).values()) <= {0.0, 1.0}


def test_the_documented_reward_endpoint_scores_through_http_reward() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "rollouts.md").read_text()
    (block,) = [b.split("```", 1)[0] for b in docs.split("```python\n")[1:] if "Grader" in b]
    scope: dict[str, Any] = {"__name__": "docs"}
    exec(compile(block, "docs/rollouts.md", "exec"), scope)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), scope["Grader"])
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/score"

    async def go(answer: str) -> RewardResult:
        scorer = HttpReward(RewardSpec("http", url=url))
        record = {
            "task_id": "t",
            "sample": 0,
            "messages": [{"role": "assistant", "content": answer}],
            "task_fields": {"reward_model": {"style": "rule", "ground_truth": "72"}},
        }
        try:
            return await scorer.score(record)
        finally:
            await scorer.close()

    try:
        assert asyncio.run(go("it is 72")).reward == 1.0
        wrong = asyncio.run(go("it is 71"))
        assert (wrong.reward, wrong.info) == (0.0, {"ground_truth": "72"})
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_trajectory_the_deadline_cut_says_it_was_not_scored(
    scripted_pool: tuple[LocalPool, list[WorkerEndpoint]],
    reward_server: RewardServer,
    tmp_path: Path,
) -> None:
    _, workers = scripted_pool
    spec = RewardSpec("http", url=reward_server.url + "/slow", timeout_s=10.0)
    tasks = _tasks(2)
    # One trajectory at a time: the first waits on its reward when the deadline comes,
    # the others never start.
    records, _ = _run(
        workers, tmp_path / "o.jsonl", spec, tasks, deadline_s=1.0, max_trajectories_in_flight=1
    )
    assert_exactly_once(records, {(t.id, s) for t in tasks for s in range(2)})
    cut = [r for r in records if r["status"] == "truncated"]
    assert cut and all(r["finish_reason"] == "deadline" for r in cut)
    for r in cut:
        assert r["reward"] is None
        assert r["reward_error"] == "not scored: the deadline came before it finished"


def test_a_refused_url_is_named_without_its_credentials() -> None:
    allowed = HostAllowList.parse("grader.rl.svc")
    with pytest.raises(ManifestError) as err:
        check_tool_hosts(_job({"url": "http://user:hunter2@evil.example/x?key=k"}), allowed)
    assert "reward.url http://evil.example/x: host 'evil.example'" in str(err.value)
    assert "hunter2" not in str(err.value) and "key=k" not in str(err.value)
