"""Weights in place: the checkpoint check, and POST /v1/weights on the simulated engine.

The same endpoint on real vLLM (tokens change, the KV cache stays) is in
test_weights_vllm.py.
"""

from __future__ import annotations

import asyncio
import json
import struct
from pathlib import Path

import pytest

from heddle.exceptions import CheckpointError
from heddle.worker import LoadedWeights, SimulatedEngine
from heddle.worker._weights import check_compatible, checkpoint_layout

from .conftest import sim_perf, worker
from .test_api import StuckEngine, step

LLAMA = {"model.embed_tokens.weight": [512, 128], "lm_head.weight": [512, 128]}


def fake_checkpoint(
    path: Path, shapes: dict[str, list[int]] | None = None, arch: str = "LlamaForCausalLM"
) -> str:
    """config.json and a safetensors file whose header lists ``shapes`` (no tensor data)."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"architectures": [arch]}))
    header = {
        name: {"dtype": "BF16", "shape": shape, "data_offsets": [0, 0]}
        for name, shape in (shapes or LLAMA).items()
    }
    raw = json.dumps({"__metadata__": {"format": "pt"}, **header}).encode()
    (path / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    return str(path)


def test_a_checkpoint_of_the_same_model_is_compatible(tmp_path: Path) -> None:
    running = checkpoint_layout(fake_checkpoint(tmp_path / "a"))
    new = checkpoint_layout(fake_checkpoint(tmp_path / "b"))
    assert new.shapes == {"model.embed_tokens.weight": (512, 128), "lm_head.weight": (512, 128)}
    check_compatible(new, running)


@pytest.mark.parametrize(
    ("shapes", "arch", "says"),
    [
        (LLAMA, "Qwen3ForCausalLM", "is a Qwen3ForCausalLM architecture, the engine runs Llama"),
        ({**LLAMA, "lm_head.weight": [512, 256]}, "LlamaForCausalLM", "has shape [512, 256]"),
        ({"model.embed_tokens.weight": [512, 128]}, "LlamaForCausalLM", "missing ['lm_head"),
        ({**LLAMA, "extra.weight": [1]}, "LlamaForCausalLM", "unexpected ['extra.weight']"),
    ],
)
def test_another_model_is_refused_naming_the_path_and_the_difference(
    tmp_path: Path, shapes: dict[str, list[int]], arch: str, says: str
) -> None:
    running = checkpoint_layout(fake_checkpoint(tmp_path / "a"))
    new = checkpoint_layout(fake_checkpoint(tmp_path / "b", shapes, arch))
    with pytest.raises(CheckpointError, match=r"checkpoint .*/b") as caught:
        check_compatible(new, running)
    assert says in str(caught.value)


def test_unloadable_directories_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist or is not a directory"):
        checkpoint_layout(str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"has no config\.json"):
        checkpoint_layout(str(tmp_path / "empty"))
    (tmp_path / "empty" / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match=r"no \*.safetensors files"):
        checkpoint_layout(str(tmp_path / "empty"))
    (tmp_path / "empty" / "model.safetensors").write_bytes(b"\x05\0\0\0\0\0\0\0nope!")
    with pytest.raises(CheckpointError, match="not a safetensors file"):
        checkpoint_layout(str(tmp_path / "empty"))


def sim() -> SimulatedEngine:
    return SimulatedEngine(sim_perf(), time_scale=0.01, max_model_len=4096)


@pytest.mark.anyio
async def test_sim_worker_loads_a_version_reports_it_and_refuses_a_missing_path(
    tmp_path: Path,
) -> None:
    path = fake_checkpoint(tmp_path / "step-1")
    async with worker(sim(), weights_roots=(str(tmp_path),)) as client:
        before = (await client.get("/v1/state")).json()
        assert before["weight_version"] is None and before["weights_path"] == "sim"
        early = await client.post(
            "/v1/trajectories/e/generate", json=step([1], weight_version="step-1")
        )
        assert early.status_code == 421
        assert early.json()["error"].startswith(
            "the worker serves weights version None, the step asks for 'step-1'"
        )
        loaded = await client.post("/v1/weights", json={"path": path, "version": "step-1"})
        assert loaded.status_code == 200, loaded.text
        on_time = step([1], weight_version="step-1")
        assert (await client.post("/v1/trajectories/e/generate", json=on_time)).status_code == 200
        assert loaded.json()["loaded"] is True and loaded.json()["version"] == "step-1"
        state = (await client.get("/v1/state")).json()
        assert (state["weight_version"], state["weights_path"]) == ("step-1", path)
        again = await client.post("/v1/weights", json={"path": path, "version": "step-1"})
        assert again.json()["loaded"] is False  # already there: nothing drains, nothing loads
        missing = await client.post(
            "/v1/weights", json={"path": str(tmp_path / "step-2"), "version": "step-2"}
        )
        assert missing.status_code == 422
        error = missing.json()["error"]
        assert f"checkpoint {tmp_path / 'step-2'} does not exist" in error
        assert "keeps serving weights version 'step-1'" in error
        assert (await client.get("/v1/state")).json()["weight_version"] == "step-1"
        served = await client.post("/v1/trajectories/t/generate", json=step([1] * 10))
        assert served.status_code == 200
        metrics = (await client.get("/metrics")).text
        assert 'heddle_worker_weights_info{path="' + path + '",version="step-1"} 1.0' in metrics
        assert 'heddle_worker_weight_loads_total{result="loaded"} 1.0' in metrics
        assert 'heddle_worker_weight_loads_total{result="refused"} 1.0' in metrics


@pytest.mark.anyio
async def test_a_load_waits_for_steps_in_flight_and_refuses_new_ones_meanwhile(
    tmp_path: Path,
) -> None:
    path = fake_checkpoint(tmp_path / "v2")
    engine = sim()
    async with worker(engine, weights_roots=(str(tmp_path),)) as client:
        # 2,000 tokens take a while even at 1/100 of the model's time: in flight during the load.
        long = asyncio.create_task(
            client.post("/v1/trajectories/long/generate", json=step([1] * 10, max_tokens=2000))
        )
        while not engine.stats().running:
            await asyncio.sleep(0.01)
        load = asyncio.create_task(client.post("/v1/weights", json={"path": path, "version": "2"}))
        await asyncio.sleep(0.02)
        refused = await client.post("/v1/trajectories/new/generate", json=step([1]))
        assert refused.status_code == 503
        assert "loading weights version '2'" in refused.json()["error"]
        finished = await long
        assert finished.status_code == 200 and len(finished.json()["token_ids"]) == 2000
        answer = (await load).json()
        assert answer["loaded"] is True and answer["drained_s"] > 0
        assert (
            await client.post("/v1/trajectories/new/generate", json=step([1]))
        ).status_code == 200


@pytest.mark.anyio
async def test_a_load_that_keeps_steps_in_flight_neither_waits_for_nor_aborts_them(
    tmp_path: Path,
) -> None:
    """mode keep: the engine pauses with the step inside and resumes it; the load does not
    drain (drained_s 0) and the step ends whole, where drain would have waited for it."""
    path = fake_checkpoint(tmp_path / "v2")
    engine = sim()
    async with worker(engine, weights_roots=(str(tmp_path),)) as client:
        long = asyncio.create_task(
            client.post("/v1/trajectories/long/generate", json=step([1] * 10, max_tokens=2000))
        )
        while not engine.stats().running:
            await asyncio.sleep(0.01)
        loaded = await client.post(
            "/v1/weights", json={"path": path, "version": "2", "mode": "keep"}
        )
        answer = loaded.json()
        assert loaded.status_code == 200, loaded.text
        assert (answer["mode"], answer["kept"], answer["drained_s"]) == ("keep", 1, 0.0)
        assert not long.done()  # still generating after the load returned
        assert engine.weights is not None and engine.weights.version == "2"
        finished = await long
        assert finished.status_code == 200 and len(finished.json()["token_ids"]) == 2000
        bad = await client.post("/v1/weights", json={"path": path, "version": "3", "mode": "x"})
        assert bad.status_code == 422


class _LoadableStuckEngine(StuckEngine):
    async def load_weights(self, path: str, version: str, *, keep: bool = False) -> LoadedWeights:
        self.weights = LoadedWeights(path, version)
        return self.weights


@pytest.mark.anyio
async def test_a_step_still_running_after_the_grace_is_refused_with_a_clear_503(
    tmp_path: Path,
) -> None:
    roots = ("/ckpt",)
    async with worker(_LoadableStuckEngine(), grace_s=0.2, weights_roots=roots) as client:
        stuck = asyncio.create_task(client.post("/v1/trajectories/t/generate", json=step([1])))
        await asyncio.sleep(0.05)
        loaded = await client.post("/v1/weights", json={"path": "/ckpt", "version": "9"})
        assert loaded.status_code == 200 and loaded.json()["drained_s"] >= 0.2
        aborted = await stuck
        assert aborted.status_code == 503
        assert "is loading new weights and aborted this step" in aborted.json()["error"]


@pytest.mark.anyio
async def test_an_engine_without_in_place_loading_says_so() -> None:
    async with worker(StuckEngine(), weights_roots=("/ckpt",)) as client:
        answer = await client.post("/v1/weights", json={"path": "/ckpt", "version": "1"})
        assert answer.status_code == 422
        assert "the stuck engine cannot load weights in place" in answer.json()["error"]
        empty = await client.post("/v1/weights", json={"path": "", "version": "1"})
        assert empty.status_code == 422 and "path" in empty.json()["error"]
