"""Weights pushed over a process group: the plan, the protocol's refusals, and a real gloo
transfer into a sim worker served over HTTP (the sim drops the tensors; vLLM loads them:
test_weights_push_vllm.py)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import uvicorn

from heddle.client import changed_tensors, push_weights
from heddle.exceptions import CheckpointError, WorkerError, WorkerRejectedError
from heddle.worker import SimulatedEngine, WorkerEndpoint, create_app
from heddle.worker._weights import checkpoint_layout
from heddle.worker._weights_push import PushRequest, plan_push

from .conftest import sim_perf
from .test_weights import fake_checkpoint

SHAPES = {
    "model.embed_tokens.weight": [64, 16],
    "model.layers.0.self_attn.q_proj.weight": [16, 16],
    "model.layers.0.self_attn.k_proj.weight": [8, 16],
    "model.layers.0.self_attn.v_proj.weight": [8, 16],
    "model.layers.0.mlp.gate_proj.weight": [32, 16],
    "model.layers.0.mlp.up_proj.weight": [32, 16],
    "model.norm.weight": [16],
}
O_PROJ = "model.layers.0.self_attn.o_proj.weight"
FUSED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


def request(names: list[str], *, delta: bool, shapes: dict[str, list[int]] = SHAPES) -> PushRequest:
    return PushRequest.model_validate(
        {
            "version": "v1",
            "tensors": [{"name": n, "shape": shapes[n], "dtype": "float32"} for n in names],
            "group": {"address": "127.0.0.1", "port": 1, "world_size": 2, "rank": 1},
            "delta": delta,
        }
    )


def test_a_delta_grows_by_the_other_members_of_each_fused_module(tmp_path: Path) -> None:
    layout = checkpoint_layout(fake_checkpoint(tmp_path / "a", SHAPES))
    plan = plan_push(
        request(["model.layers.0.self_attn.k_proj.weight", "model.norm.weight"], delta=True),
        layout,
        FUSED,
    )
    assert [t.name for t in plan] == [
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.v_proj.weight",
        "model.norm.weight",
    ]
    assert [t.shape for t in plan][:2] == [[8, 16], [16, 16]]
    full = plan_push(request(list(SHAPES), delta=False), layout, FUSED)
    assert [t.name for t in full] == list(SHAPES)


@pytest.mark.parametrize(
    ("names", "shapes", "delta", "says"),
    [
        (["model.layers.0.self_attn.o_proj.weight"], {**SHAPES, O_PROJ: [16, 16]}, True,
         f"tensor {O_PROJ} is not one of the model's 7 tensors"),
        (["model.norm.weight"], {**SHAPES, "model.norm.weight": [32]}, True,
         "tensor model.norm.weight has shape [32], the running model's has [16]"),
        (["model.norm.weight", "model.norm.weight"], SHAPES, True, "announced twice"),
        (["model.norm.weight"], SHAPES, False, "a full push carries every tensor of the model"),
    ],
)  # fmt: skip
def test_a_manifest_that_does_not_fit_is_refused_in_one_sentence(
    tmp_path: Path, names: list[str], shapes: dict[str, list[int]], delta: bool, says: str
) -> None:
    layout = checkpoint_layout(fake_checkpoint(tmp_path / "a", SHAPES))
    with pytest.raises(CheckpointError) as caught:
        plan_push(request(names, delta=delta, shapes=shapes), layout, FUSED)
    assert says in str(caught.value)
    assert "\n" not in str(caught.value)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def served(model: str) -> AsyncIterator[WorkerEndpoint]:
    """A sim worker on ``model`` served over real HTTP in this event loop."""
    engine = SimulatedEngine(sim_perf(), model=model, time_scale=0.01, max_model_len=4096)
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(engine), host="127.0.0.1", port=port, log_level="warning")
    )
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        yield WorkerEndpoint("w0", f"http://127.0.0.1:{port}")
    finally:
        server.should_exit = True
        await task


def state_dict(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(*s, generator=g) for n, s in SHAPES.items()}


@pytest.mark.anyio
async def test_a_full_push_then_a_delta_over_gloo_bump_the_version(tmp_path: Path) -> None:
    ckpt = fake_checkpoint(tmp_path / "a", SHAPES)
    async with served(ckpt) as endpoint:
        old = state_dict(0)
        [full] = await push_weights([endpoint], old, "step-1", timeout_s=20)
        total = sum(t.numel() * 4 for t in old.values())
        assert (full["status"], full["tensors"], full["bytes"]) == ("loaded", 7, total)
        assert full["delta"] is False and full["error"] is None
        async with httpx.AsyncClient(base_url=endpoint.url) as http:
            state = (await http.get("/v1/state")).json()
            assert state["weight_version"] == "step-1"
            assert state["weights_path"].startswith("push://127.0.0.1:")
            new = {**old, "model.norm.weight": old["model.norm.weight"] + 1}
            changed = changed_tensors(new, old)
            assert changed == ["model.norm.weight"]
            [delta] = await push_weights([endpoint], new, "step-2", changed=changed, timeout_s=20)
            assert (delta["status"], delta["tensors"], delta["bytes"]) == ("loaded", 1, 16 * 4)
            assert (await http.get("/v1/state")).json()["weight_version"] == "step-2"
            again = await http.get("/v1/weights/push/step-1")
            assert again.json()["status"] == "loaded"
            metrics = (await http.get("/metrics")).text
            assert 'heddle_worker_weight_loads_total{result="loaded"} 2.0' in metrics


@pytest.mark.slow
@pytest.mark.anyio
async def test_push_refusals_and_a_trainer_that_never_sends(tmp_path: Path) -> None:
    ckpt = fake_checkpoint(tmp_path / "a", SHAPES)
    async with served(ckpt) as endpoint:
        wrong = {**state_dict(0), "model.norm.weight": torch.zeros(17)}
        with pytest.raises(WorkerRejectedError) as caught:
            await push_weights([endpoint], wrong, "bad", changed=["model.norm.weight"])
        assert caught.value.status == 422
        assert "tensor model.norm.weight has shape [17], the running model's has [16]" in str(
            caught.value
        )
        async with httpx.AsyncClient(base_url=endpoint.url, timeout=60) as http:
            body: dict[str, Any] = request(["model.norm.weight"], delta=True).model_dump()
            body["group"]["port"] = _free_port()  # nobody serves it: the trainer never comes
            body["timeout_s"] = 5.0  # long enough for the 409s below under load
            plan = await http.post("/v1/weights/push", json=body)
            assert plan.status_code == 200, plan.text
            busy = await http.post("/v1/weights/push", json={**body, "version": "v2"})
            assert busy.status_code == 409
            assert "a push of version 'v1' is under way" in busy.json()["error"]
            disk = await http.post("/v1/weights", json={"path": ckpt, "version": "disk"})
            assert disk.status_code == 409  # a load from disk never overlaps a push
            assert "weights version 'v1' are being pushed" in disk.json()["error"]
            result = (await http.get("/v1/weights/push/v1", params={"wait_s": 30})).json()
            assert result["status"] == "failed"
            assert result["error"].startswith(
                f"no weights from the trainer (rank 0 at 127.0.0.1:{body['group']['port']}) "
                "within 5.0 s"
            )
            assert result["error"].endswith("the worker keeps serving None")
            assert (await http.get("/v1/state")).json()["weight_version"] is None
            missing = await http.get("/v1/weights/push/nope")
            assert missing.status_code == 404 and "no push of version 'nope'" in missing.text
            rank = await http.post(
                "/v1/weights/push",
                json={**body, "group": {**body["group"], "world_size": 2, "rank": 2}},
            )
            assert rank.status_code == 422 and "does not fit world_size 2" in rank.text
            nccl = await http.post("/v1/weights/push", json={**body, "backend": "nccl"})
            if not torch.cuda.is_available():
                assert nccl.status_code == 422
                assert nccl.json()["error"].startswith("backend nccl needs GPUs")
        # After the failure the worker takes the next push.
        [ok] = await push_weights([endpoint], state_dict(1), "v3", timeout_s=20)
        assert ok["status"] == "loaded"


@pytest.mark.anyio
async def test_the_sender_refuses_bad_input_and_an_unreachable_worker(tmp_path: Path) -> None:
    ckpt = fake_checkpoint(tmp_path / "a", SHAPES)
    async with served(ckpt) as endpoint:
        with pytest.raises(ValueError, match="cannot be pushed"):
            await push_weights([endpoint], {**state_dict(0), "model.norm.weight":
                                            torch.zeros(16, dtype=torch.int64)}, "x")  # fmt: skip
        with pytest.raises(ValueError, match="not in tensors"):
            await push_weights([endpoint], state_dict(0), "x", changed=["nope"])
        with pytest.raises(WorkerError):
            await push_weights(
                [WorkerEndpoint("gone", f"http://127.0.0.1:{_free_port()}")], state_dict(0), "x"
            )
