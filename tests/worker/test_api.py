"""The worker API on the simulated engine: resident contexts, migration, errors, metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from heddle.worker import Engine, EngineStats, Sampling, SimulatedEngine, StepOutput

from .conftest import sim_perf, worker

pytestmark = pytest.mark.anyio

Build = Callable[..., SimulatedEngine]


def step(
    tokens: list[int] | None = None, max_tokens: int = 8, **extra: object
) -> dict[str, object]:
    body: dict[str, object] = {"sampling": {"max_tokens": max_tokens}, **extra}
    if tokens is not None:
        body["append_token_ids"] = tokens
    return body


async def test_context_stays_resident_and_later_steps_hit_the_cache(sim_engine: Build) -> None:
    async with worker(sim_engine()) as client:
        first = (await client.post("/v1/trajectories/t1/generate", json=step([1] * 100))).json()
        assert first["prompt_tokens"] == 100 and first["cached_tokens"] == 0
        assert len(first["token_ids"]) == 8 and first["finish_reason"] == "length"
        assert first["context_tokens"] == 108
        second = (await client.post("/v1/trajectories/t1/generate", json=step([2] * 20))).json()
        assert second["prompt_tokens"] == 128
        assert second["cached_tokens"] == 108  # only the 20 new tokens were prefilled
        third = (await client.post("/v1/trajectories/t1/generate", json=step([3] * 5))).json()
        assert third["cached_tokens"] == 136 > second["cached_tokens"]
        exported = (await client.get("/v1/trajectories/t1")).json()
        assert len(exported["token_ids"]) == third["context_tokens"] == 149


async def test_chat_messages_are_rendered_and_text_round_trips(sim_engine: Build) -> None:
    async with worker(sim_engine()) as client:
        body = {
            "messages": [{"role": "user", "content": "add 2 and 2"}],
            "sampling": {"max_tokens": 12},
        }
        out = (await client.post("/v1/trajectories/c/generate", json=body)).json()
        assert out["prompt_tokens"] == len("<|user|>\nadd 2 and 2\n<|assistant|>\n")
        assert out["text"] == bytes(out["token_ids"]).decode()


async def test_export_import_moves_a_trajectory_and_warm_prefills_it(sim_engine: Build) -> None:
    async with worker(sim_engine()) as source, worker(sim_engine()) as target:
        await source.post("/v1/trajectories/m/generate", json=step([7] * 300))
        context = (await source.get("/v1/trajectories/m")).json()["token_ids"]
        for _ in range(2):  # importing the same context twice is idempotent
            answer = await target.put(
                "/v1/trajectories/m", json={"token_ids": context, "warm": True}
            )
            assert answer.status_code == 200
            assert answer.json() == {"trajectory_id": "m", "context_tokens": 308, "warmed": True}
        assert (await target.get("/v1/trajectories/m")).json()["token_ids"] == context
        resumed = (await target.post("/v1/trajectories/m/generate", json=step([9]))).json()
        assert resumed["cached_tokens"] == 308  # the warm import filled the prefix cache
        assert (await source.delete("/v1/trajectories/m")).status_code == 204
        assert (await source.get("/v1/trajectories/m")).status_code == 404


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Poll a condition (the machine may be busy; fixed sleeps would be flaky)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)


async def test_priority_decides_who_runs_first_under_load(sim_engine: Build) -> None:
    engine = sim_engine(perf=sim_perf(batch_cap=1), time_scale=0.05)
    async with worker(engine) as client:
        order: list[str] = []

        async def run(tid: str, priority: int, tokens: int) -> None:
            body = step([1] * 10, max_tokens=tokens, priority=priority)
            answer = await client.post(f"/v1/trajectories/{tid}/generate", json=body)
            assert answer.status_code == 200
            order.append(tid)

        blocker = asyncio.create_task(run("blocker", 0, 600))  # holds the only batch slot
        await until(lambda: engine.stats().running == 1)
        low = asyncio.create_task(run("low", 100, 5))
        await until(lambda: engine.stats().waiting == 1)
        high = asyncio.create_task(run("high", -100, 5))
        await until(lambda: engine.stats().waiting == 2)
        await asyncio.gather(blocker, low, high)
        assert order == ["blocker", "high", "low"]


async def test_state_and_metrics_report_what_happened(sim_engine: Build) -> None:
    async with worker(sim_engine(tp=2)) as client:
        await client.post("/v1/trajectories/a/generate", json=step([1] * 50, max_tokens=16))
        await client.post("/v1/trajectories/b/generate", json=step([1] * 50, max_tokens=16))
        state = (await client.get("/v1/state")).json()
        assert state["engine"] == "sim" and state["tp"] == 2 and state["ready"]
        assert state["resident_trajectories"] == 2 and state["generated_tokens"] == 32
        assert 0 < state["kv_usage"] < 1 and state["tokens_per_s"] > 0
        text = (await client.get("/metrics")).text
        assert "heddle_worker_generated_tokens_total 32.0" in text
        assert "heddle_worker_resident_trajectories 2.0" in text
        assert 'route="POST /v1/trajectories/{trajectory_id}/generate",status="200"' in text
        assert (await client.get("/healthz")).json() == {"status": "ok"}
        assert (await client.get("/readyz")).json() == {"ready": True}


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "message"),
    [
        (
            "post",
            "/v1/trajectories/x/generate",
            b"{not json",
            400,
            "request body is not valid JSON",
        ),
        (
            "post",
            "/v1/trajectories/nobody/generate",
            {"sampling": {"max_tokens": 4}},
            404,
            "trajectory 'nobody' is not resident on this worker",
        ),
        ("get", "/v1/trajectories/nobody", None, 404, "is not resident"),
        ("delete", "/v1/trajectories/nobody", None, 404, "is not resident"),
        (
            "post",
            "/v1/trajectories/x/generate",
            {"append_token_ids": [1], "sampling": {"temperature": -1}},
            422,
            "sampling.temperature: Input should be greater than or equal to 0",
        ),
        (
            "post",
            "/v1/trajectories/x/generate",
            {"append_token_ids": [1], "sampling": {"top_p": 2}},
            422,
            "sampling.top_p",
        ),
        (
            "post",
            "/v1/trajectories/x/generate",
            {"append_token_ids": [1], "messages": []},
            422,
            "give append_token_ids or messages, not both",
        ),
        (
            "post",
            "/v1/trajectories/x/generate",
            {"append_token_ids": [1], "bogus": 1},
            422,
            "bogus: Extra inputs are not permitted",
        ),
        (
            "post",
            "/v1/trajectories/x/generate",
            {"append_token_ids": [1] * 5000},
            400,
            "would hold 5000 tokens, more than the model's max length 4096",
        ),
        ("put", "/v1/trajectories/x", {"token_ids": [1] * 4097}, 400, "max length 4096"),
        ("put", "/v1/trajectories/x", {"tokens": [1]}, 422, "token_ids: Field required"),
    ],
)
async def test_bad_input_gets_a_4xx_that_says_what_is_wrong(
    sim_engine: Build, method: str, path: str, body: object, status: int, message: str
) -> None:
    async with worker(sim_engine()) as client:
        if isinstance(body, bytes):
            answer = await client.request(
                method, path, content=body, headers={"content-type": "application/json"}
            )
        elif body is None:
            answer = await client.request(method, path)
        else:
            answer = await client.request(method, path, json=body)
        assert answer.status_code == status, answer.text
        assert message in answer.json()["error"]


async def test_a_second_step_of_a_running_trajectory_is_refused(sim_engine: Build) -> None:
    engine = sim_engine(time_scale=0.05)
    async with worker(engine) as client:
        body = step([1] * 10, 600)
        first = asyncio.create_task(client.post("/v1/trajectories/t/generate", json=body))
        await until(lambda: engine.stats().running == 1)
        second = await client.post("/v1/trajectories/t/generate", json=step([1]))
        assert second.status_code == 409 and "already running" in second.json()["error"]
        assert (await first).status_code == 200


class BrokenEngine(SimulatedEngine):
    """Fakes an engine whose batching loop crashes on its first segment."""

    def _credit(self, iterations: int) -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


async def test_an_engine_failure_answers_503_and_readiness_turns_false() -> None:
    engine = BrokenEngine(sim_perf(), time_scale=0.01)
    async with worker(engine) as client:
        answer = await client.post("/v1/trajectories/t/generate", json=step([1] * 10))
        assert answer.status_code == 503
        assert "illegal memory access" in answer.json()["error"]
        assert (await client.get("/readyz")).status_code == 503
        assert (await client.get("/v1/state")).json()["ready"] is False
        again = await client.post("/v1/trajectories/u/generate", json=step([1]))
        assert again.status_code == 503 and "not ready" in again.json()["error"]


class StuckEngine(Engine):
    """Fakes an engine that never finishes a step until aborted."""

    name, model, tp, max_model_len = "stuck", "none", 1, 1000

    def __init__(self) -> None:
        self.waiters: list[asyncio.Future[StepOutput]] = []

    @property
    def ready(self) -> bool:
        return True

    async def start(self) -> None: ...

    async def step(
        self, trajectory_id: str, context: list[int], sampling: Sampling, priority: int
    ) -> StepOutput:
        future: asyncio.Future[StepOutput] = asyncio.get_running_loop().create_future()
        self.waiters.append(future)
        return await future

    async def warm(self, trajectory_id: str, context: list[int]) -> None: ...

    def release(self, trajectory_id: str) -> None: ...

    def stats(self) -> EngineStats:
        return EngineStats(running=len(self.waiters), waiting=0, kv_usage=0.0)

    async def abort_all(self) -> None:
        for f in self.waiters:
            if not f.done():
                f.set_result(StepOutput([], "abort", 0, 0))

    async def shutdown(self) -> None: ...

    def decode(self, token_ids: list[int]) -> str:
        return ""


async def test_draining_refuses_new_steps_and_aborts_stuck_ones_after_the_grace() -> None:
    engine = StuckEngine()
    async with worker(engine, grace_s=0.3) as client:
        state = client._transport.app.state.worker  # type: ignore[attr-defined]
        stuck = asyncio.create_task(client.post("/v1/trajectories/t/generate", json=step([1])))
        await asyncio.sleep(0.05)
        drain = asyncio.create_task(state.drain())
        await asyncio.sleep(0.05)
        assert (await client.get("/readyz")).status_code == 503
        refused = await client.post("/v1/trajectories/u/generate", json=step([1]))
        assert refused.status_code == 503 and "shutting down" in refused.json()["error"]
        await drain
        aborted = await stuck
        assert aborted.status_code == 503 and "aborted this step" in aborted.json()["error"]
