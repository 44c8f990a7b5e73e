"""The pool's token: every call but the probes and /metrics needs it (docs/worker-api.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from heddle.exceptions import ConfigError
from heddle.worker import OPEN_PATHS, SimulatedEngine, create_app, read_token

from .test_process import sim_worker

TOKEN = "s3cret-token_of.the-pool"

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def guarded(engine: SimulatedEngine) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(engine, grace_s=1.0, token=TOKEN)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://worker") as client:
            yield client


STEP = {"messages": [{"role": "user", "content": "hi"}], "sampling": {"max_tokens": 4}}
BEARER = {"Authorization": f"Bearer {TOKEN}"}


async def test_without_the_token_every_api_call_gets_401_in_one_sentence(
    sim_engine: Callable[..., SimulatedEngine],
) -> None:
    async with guarded(sim_engine()) as client:
        calls = [
            client.post("/v1/trajectories/t/generate", json=STEP),
            client.put("/v1/trajectories/t", json={"token_ids": [1, 2]}),
            client.get("/v1/trajectories/t"),
            client.delete("/v1/trajectories/t"),
            client.get("/v1/state"),
            client.post("/v1/weights", json={"path": "/x", "version": "1"}),
            client.get("/openapi.json"),
            client.get("/no/such/route"),  # no hint of which routes exist
        ]
        for call in calls:
            answer = await call
            assert answer.status_code == 401, answer.request.url
            assert answer.headers["www-authenticate"].startswith("Bearer")
            assert answer.json() == {"error": answer.json()["error"]}
            assert "needs its pool's token" in answer.json()["error"]
            assert answer.json()["error"].count(". ") == 0  # one sentence


async def test_a_wrong_token_is_refused_and_the_right_one_serves(
    sim_engine: Callable[..., SimulatedEngine],
) -> None:
    async with guarded(sim_engine()) as client:
        for wrong in (f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", TOKEN, f"Basic {TOKEN}"):
            answer = await client.post(
                "/v1/trajectories/t/generate", json=STEP, headers={"Authorization": wrong}
            )
            assert answer.status_code == 401
            assert "not this worker's" in answer.json()["error"]
        answer = await client.post("/v1/trajectories/t/generate", json=STEP, headers=BEARER)
        assert answer.status_code == 200, answer.text
        assert answer.json()["token_ids"]
        state = await client.get("/v1/state", headers=BEARER)
        assert state.json()["resident_trajectories"] == 1


async def test_probes_and_metrics_stay_open(sim_engine: Callable[..., SimulatedEngine]) -> None:
    async with guarded(sim_engine()) as client:
        assert sorted(OPEN_PATHS) == ["/healthz", "/metrics", "/readyz"]
        for path in OPEN_PATHS:
            assert (await client.get(path)).status_code == 200, path
        # A refused call is still counted: /metrics shows someone knocking without the token.
        await client.get("/v1/state")
        metrics = (await client.get("/metrics")).text
        assert 'heddle_worker_requests_total{route="GET unmatched",status="401"} 1.0' in metrics


async def test_the_schema_declares_the_token(sim_engine: Callable[..., SimulatedEngine]) -> None:
    async with guarded(sim_engine()) as client:
        schema = (await client.get("/openapi.json", headers=BEARER)).json()
    assert schema["components"]["securitySchemes"]["poolToken"]["scheme"] == "bearer"
    for path, operations in schema["paths"].items():
        for operation in operations.values():
            guarded_route = path not in OPEN_PATHS
            assert ("security" in operation) == guarded_route, path
            assert ("401" in operation["responses"]) == guarded_route, path


def test_the_token_file_wins_over_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("from-file\n")
    env = {"HEDDLE_WORKER_TOKEN": "from-env"}
    assert read_token(str(path), env) == "from-file"
    assert read_token(None, env) == "from-env"
    assert read_token(None, {}) is None


@pytest.mark.parametrize(
    ("file_text", "env", "says"),
    [
        (None, {"HEDDLE_WORKER_TOKEN": ""}, "HEDDLE_WORKER_TOKEN is empty"),
        ("\n", {}, "is empty; put the pool's token there"),
        ("two words", {}, "characters an HTTP header cannot carry"),
        ("é", {}, "characters an HTTP header cannot carry"),
    ],
)
def test_a_bad_token_is_refused_in_one_sentence(
    tmp_path: Path, file_text: str | None, env: dict[str, str], says: str
) -> None:
    path = None
    if file_text is not None:
        (tmp_path / "token").write_text(file_text)
        path = str(tmp_path / "token")
    with pytest.raises(ConfigError, match=says):
        read_token(path, env)
    with pytest.raises(ConfigError, match="cannot be read"):
        read_token(str(tmp_path / "missing"), {})


@pytest.mark.slow
def test_a_served_worker_reads_its_token_from_a_file(tmp_path: Path) -> None:
    (tmp_path / "token").write_text(TOKEN)
    with sim_worker("--token-file", str(tmp_path / "token"), "--time-scale", "0") as (_, url):
        assert httpx.get(f"{url}/v1/state", timeout=5).status_code == 401
        assert httpx.get(f"{url}/v1/state", headers=BEARER, timeout=5).status_code == 200


@pytest.mark.slow
def test_an_empty_token_stops_the_worker_before_it_serves() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "heddle", "worker", "--engine", "sim"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HEDDLE_WORKER_TOKEN": " "},
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "heddle: error: HEDDLE_WORKER_TOKEN is empty; put the pool's token there or leave it out"
    )
