"""The worker API on the simulated engine: resident contexts, migration, errors, metrics."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from heddle.worker import Engine, EngineStats, Sampling, SimulatedEngine, StepOutput, create_app

from ._bad_requests import BAD_GENERATE_BODIES
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
            {"append_token_ids": [1], "sampling": {"top_p": 2}},
            422,
            "sampling.top_p",
        ),
        (
            "post",
            "/v1/trajectories/x/generate",
            {"append_token_ids": [1], "messages": [{"role": "user", "content": "hi"}]},
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
        ("put", "/v1/trajectories/x", {"token_ids": []}, 422, "List should have at least 1 item"),
        (
            "put",
            "/v1/trajectories/x",
            {"token_ids": [5, 256]},
            422,
            "token_ids holds token id 256, outside the model's vocabulary [0, 256)",
        ),
        (
            "post",
            "/v1/trajectories/x/generate",
            {"append_token_ids": [1, 256]},
            422,
            "append_token_ids holds token id 256, outside the model's vocabulary [0, 256)",
        ),
        (
            "post",
            "/v1/trajectories/x/generate",
            {"append_token_ids": [1], "sampling": {"stop_token_ids": [10, 300]}},
            422,
            "sampling.stop_token_ids holds token id 300, outside the model's vocabulary [0, 256)",
        ),
        (
            "post",
            "/v1/trajectories/x/generate",
            b"[1, 2]",
            422,
            "the request body must be a JSON object sent as application/json",
        ),
        ("get", "/v1/nothing", None, 404, "no endpoint GET /v1/nothing"),
        ("patch", "/v1/trajectories/x", None, 405, "/v1/trajectories/x does not take PATCH"),
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

    name, model, tp, max_model_len, vocab_size = "stuck", "none", 1, 1000, 1000

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


@pytest.mark.parametrize(("body", "status", "message"), BAD_GENERATE_BODIES)
async def test_out_of_range_sampling_is_refused_naming_the_field_and_its_range(
    sim_engine: Build, body: str, status: int, message: str
) -> None:
    async with worker(sim_engine()) as client:
        answer = await client.post(
            "/v1/trajectories/x/generate",
            content=body,
            headers={"content-type": "application/json"},
        )
        assert answer.status_code == status, answer.text
        assert message in answer.json()["error"]
        # Refused before it reached the engine: nothing was created.
        assert (await client.get("/v1/trajectories/x")).status_code == 404
        assert (await client.get("/v1/state")).json()["generated_tokens"] == 0


async def test_token_ids_at_the_vocabulary_edge_are_accepted(sim_engine: Build) -> None:
    async with worker(sim_engine()) as client:
        vocab = (await client.get("/v1/state")).json()["vocab_size"]
        body = step([0, vocab - 1], sampling={"max_tokens": 2, "stop_token_ids": [vocab - 1]})
        answer = await client.post("/v1/trajectories/edge/generate", json=body)
        assert answer.status_code == 200, answer.text


async def test_a_failed_step_leaves_the_context_as_it_was() -> None:
    async with worker(BrokenEngine(sim_perf(), time_scale=0.01)) as client:
        answer = await client.post("/v1/trajectories/t/generate", json=step([1] * 10))
        assert answer.status_code == 503
        # The step never happened: a retry elsewhere must not find half of it here.
        assert (await client.get("/v1/trajectories/t")).status_code == 404


async def test_error_answers_for_unmatched_routes_and_methods_are_json(sim_engine: Build) -> None:
    async with worker(sim_engine()) as client:
        answer = await client.post("/v1/trajectories/x")
        assert answer.status_code == 405
        assert answer.headers["content-type"] == "application/json"
        assert "does not take POST; use one of" in answer.json()["error"]
        assert "PUT" in answer.headers["allow"]


@pytest.fixture
async def small_limit(sim_engine: Build) -> AsyncIterator[httpx.AsyncClient]:
    """A worker whose body limit is 1000 bytes."""
    app = create_app(sim_engine(), grace_s=1.0, max_body_bytes=1000)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://worker") as client:
            yield client


async def test_a_body_over_the_limit_gets_413_with_the_json_error(
    small_limit: httpx.AsyncClient,
) -> None:
    body = step([1] * 500)  # about 1.5 kB of JSON
    answer = await small_limit.post("/v1/trajectories/big/generate", json=body)
    assert answer.status_code == 413
    assert "larger than this worker's limit of 1000 bytes" in answer.json()["error"]
    assert "--max-body-mib" in answer.json()["error"]

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it arrives
        yield b'{"append_token_ids": ['
        for _ in range(400):
            yield b"1, "
        yield b"1]}"

    chunked = await small_limit.post(
        "/v1/trajectories/big/generate",
        content=chunks(),
        headers={"content-type": "application/json"},
    )
    assert chunked.status_code == 413
    assert "larger than this worker's limit" in chunked.json()["error"]
    small = await small_limit.post("/v1/trajectories/small/generate", json=step([1] * 50))
    assert small.status_code == 200
    assert (await small_limit.get("/v1/trajectories/big")).status_code == 404


async def test_the_default_body_limit_refuses_a_16_mib_body(sim_engine: Build) -> None:
    async with worker(sim_engine()) as client:
        body = {"messages": [{"role": "tool", "content": "x" * (16 * 2**20)}]}
        answer = await client.post("/v1/trajectories/huge/generate", json=body)
        assert answer.status_code == 413, answer.text[:200]


LARGE_MESSAGE = {"role": "tool", "content": "x" * 20_000}  # small ones are tokenised in place


class SlowTokenizer(SimulatedEngine):
    """A simulated engine whose tokenizer blocks for a second, like a 10 MB prompt does."""

    def encode(self, text: str) -> list[int]:
        time.sleep(1.0)
        return super().encode(text)


async def test_tokenising_runs_off_the_event_loop_so_probes_keep_answering() -> None:
    async with worker(SlowTokenizer(sim_perf(), time_scale=0.01)) as client:
        body = {"messages": [LARGE_MESSAGE], "sampling": {"max_tokens": 2}}
        stepping = asyncio.create_task(client.post("/v1/trajectories/s/generate", json=body))
        gaps: list[float] = []
        probes: list[int] = []
        while not stepping.done():  # the loop's pauses and the probe's answers meanwhile
            before = time.monotonic()
            probes.append((await client.get("/readyz")).status_code)
            await asyncio.sleep(0.01)
            gaps.append(time.monotonic() - before)
        assert (await stepping).status_code == 200
        assert len(probes) > 10 and set(probes) == {200}
        assert max(gaps) < 0.5  # the 1 s tokenisation never held the event loop


async def test_a_trajectory_is_busy_while_its_messages_are_tokenised() -> None:
    async with worker(SlowTokenizer(sim_perf(), time_scale=0.01)) as client:
        body = {"messages": [LARGE_MESSAGE], "sampling": {"max_tokens": 2}}
        stepping = asyncio.create_task(client.post("/v1/trajectories/s/generate", json=body))
        await asyncio.sleep(0.2)
        second = await client.post("/v1/trajectories/s/generate", json=body)
        assert second.status_code == 409  # refused, not interleaved with the first
        assert (await stepping).status_code == 200


async def test_a_cancelled_step_leaves_the_simulated_batch(sim_engine: Build) -> None:
    engine = sim_engine(time_scale=0.05)
    async with worker(engine) as client:
        # Over ASGI the client's cancellation reaches the handler as the disconnect would.
        long = asyncio.create_task(client.post("/v1/trajectories/c/generate", json=step([1], 5000)))
        await until(lambda: engine.stats().running == 1)
        long.cancel()
        await until(lambda: engine.stats().running == 0, timeout_s=2.0)
        assert (await client.get("/v1/trajectories/c")).status_code == 404
        again = await client.post("/v1/trajectories/c/generate", json=step([1], 4))
        assert again.status_code == 200


async def test_the_openapi_schema_documents_every_answer(sim_engine: Build) -> None:
    async with worker(sim_engine()) as client:
        spec = (await client.get("/openapi.json")).json()
        metrics = await client.get("/metrics")
    paths = spec["paths"]
    error = {"$ref": "#/components/schemas/ErrorResponse"}
    documented = {
        ("/v1/trajectories/{trajectory_id}/generate", "post"): {400, 404, 409, 413, 422, 503},
        ("/v1/trajectories/{trajectory_id}", "put"): {400, 409, 413, 422, 503},
        ("/v1/trajectories/{trajectory_id}", "get"): {404},
        ("/v1/trajectories/{trajectory_id}", "delete"): {404, 409},
    }
    for (path, method), statuses in documented.items():
        responses = paths[path][method]["responses"]
        for status in statuses:
            assert responses[str(status)]["content"]["application/json"]["schema"] == error
    assert "503" in paths["/readyz"]["get"]["responses"]
    assert "text/plain" in paths["/metrics"]["get"]["responses"]["200"]["content"]
    assert metrics.headers["content-type"].startswith("text/plain")
