"""``POST /v1/weights/push``: weights a trainer pushes over a process group, without a stall.

The protocol (docs/worker-api.md, the sender is :mod:`._weights_sender`):

1. The trainer announces the update: version, each tensor's checkpoint name,
   shape and dtype, the group (its TCPStore's address and port, the world size,
   this worker's first rank) and ``delta`` (only changed tensors). The worker
   checks the manifest against the checkpoint it runs (unknown tensor, shape,
   a full push that misses some) and answers the **plan**: the tensors to send,
   in order. A delta grows by the other members of each fused module it touches
   (``q_proj`` brings ``k_proj`` and ``v_proj``: vLLM reprocesses a layer from
   all of its parts). Nothing blocks before this answer, so a refusal costs the
   trainer one round trip.
2. The worker joins the group in the background; the trainer broadcasts the
   plan's tensors from rank 0. A **delta** is received into memory while the
   engine keeps generating, then the engine pauses with its requests kept,
   loads, and resumes: the stall is the load alone. A **full** push streams
   straight into the paused engine's weights (no second copy of the model):
   the stall is the transfer and the load.
3. ``GET /v1/weights/push/{version}`` waits for the result: the version now
   served (the prefix cache was reset), the bytes, the receive time and the stall.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import FastAPI
from pydantic import Field

from heddle.exceptions import CheckpointError
from heddle.exceptions import RequestError as ApiError

from ._engine import Engine, EngineError
from ._schemas import ErrorResponse, _Strict
from ._weights import CheckpointLayout

__all__ = [
    "PushGroup",
    "PushPlan",
    "PushRequest",
    "PushResult",
    "PushTensor",
    "add_push_routes",
    "plan_push",
]

_MAX_DIMS = 8


class PushTensor(_Strict):
    name: str = Field(min_length=1, max_length=1000, description="the checkpoint's tensor name")
    shape: list[int] = Field(max_length=_MAX_DIMS, description="the tensor's shape")
    dtype: Literal["float32", "float16", "bfloat16", "float64"] = Field(
        description="the dtype it is sent in (torch's name)"
    )


class PushGroup(_Strict):
    """Where the trainer's process group meets: its TCPStore, served by rank 0."""

    address: str = Field(min_length=1, max_length=253, description="the trainer's host")
    port: int = Field(ge=1, le=65535, description="the trainer's TCPStore port")
    world_size: int = Field(ge=2, le=65536, description="1 (the trainer) + every receiving rank")
    rank: int = Field(ge=1, le=65535, description="this worker's first rank (one per TP rank)")


class PushRequest(_Strict):
    """Announce an update; the answer is the plan, the tensors follow over the group."""

    version: str = Field(min_length=1, max_length=253, description="the version to report")
    tensors: list[PushTensor] = Field(min_length=1, max_length=1_000_000)
    group: PushGroup
    backend: Literal["gloo", "nccl"] = Field(
        "gloo", description="gloo: tensors over TCP (CPU); nccl: GPU to GPU"
    )
    delta: bool = Field(
        False,
        description="true: only these tensors changed; they are received while the engine "
        "generates, then it pauses to load them. false: every tensor, streamed into the "
        "paused engine",
    )
    timeout_s: float = Field(
        120.0, gt=0, le=3600, description="how long to wait for the trainer at each stage"
    )


class PushPlan(_Strict):
    version: str
    tensors: list[PushTensor] = Field(description="what to broadcast from rank 0, in this order")
    ranks: int = Field(description="ranks this worker joins the group with (its TP degree)")
    delta: bool


class PushResult(_Strict):
    version: str
    status: Literal["receiving", "loaded", "failed"]
    error: str | None = Field(None, description="why it failed; the old weights keep serving")
    delta: bool
    tensors: int = Field(description="tensors in the plan")
    bytes: int = Field(0, description="bytes received")
    receive_s: float = Field(0.0, description="seconds tensors were arriving")
    stall_s: float = Field(0.0, description="seconds the engine was paused (no token generated)")
    kept: int = Field(0, description="steps in flight that the pause kept and resumed")


def _fused_names(name: str, fused: Mapping[str, Sequence[str]], known: Sequence[str]) -> list[str]:
    """Every checkpoint tensor that vLLM loads into the same module as ``name``."""
    module, _, _ = name.rpartition(".")
    parts = module.split(".")
    for members in fused.values():
        if parts and parts[-1] in members:
            prefix = ".".join(parts[:-1])
            mods = {f"{prefix}.{m}" if prefix else m for m in members}
            return [n for n in known if n.rpartition(".")[0] in mods]
    return [n for n in known if n.rpartition(".")[0] == module]


def plan_push(
    request: PushRequest, layout: CheckpointLayout | None, fused: Mapping[str, Sequence[str]]
) -> list[PushTensor]:
    """The tensors to receive, in order, or :class:`CheckpointError` saying what is wrong.

    ``layout`` None: the engine has no weights to check against (the sim); the
    manifest is taken as it is.
    """
    seen: set[str] = set()
    for t in request.tensors:
        if t.name in seen:
            raise CheckpointError(f"tensor {t.name} is announced twice; send each name once")
        seen.add(t.name)
        if any(d < 0 for d in t.shape):
            raise CheckpointError(f"tensor {t.name} has a negative dimension {t.shape}")
    if layout is None:
        return list(request.tensors)
    for t in request.tensors:
        shape = layout.shapes.get(t.name)
        if shape is None:
            close = difflib.get_close_matches(t.name, list(layout.shapes), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise CheckpointError(
                f"tensor {t.name} is not one of the model's {len(layout.shapes)} tensors; "
                f"send the checkpoint's names (the Hugging Face state dict's){hint}"
            )
        if tuple(t.shape) != shape:
            raise CheckpointError(
                f"tensor {t.name} has shape {list(t.shape)}, the running model's has "
                f"{list(shape)}; push weights of the model the worker runs"
            )
    if not request.delta:
        missing = [n for n in layout.shapes if n not in seen]
        if missing:
            raise CheckpointError(
                f"a full push carries every tensor of the model, and {len(missing)} are "
                f"missing (e.g. {missing[0]}); send them all, or set delta: true for a part"
            )
        return list(request.tensors)
    plan: list[PushTensor] = []
    planned: set[str] = set()
    for t in request.tensors:
        for name in [t.name, *_fused_names(t.name, fused, list(layout.shapes))]:
            if name not in planned:
                planned.add(name)
                plan.append(PushTensor(name=name, shape=list(layout.shapes[name]), dtype=t.dtype))
    return plan


@dataclass
class _Transfer:
    plan: PushPlan
    result: PushResult
    done: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


@dataclass
class _Pushes:
    """The update under way (one at a time) and the last few results, by version."""

    current: _Transfer | None = None
    results: dict[str, _Transfer] = field(default_factory=dict)
    keep_results: int = 16

    def remember(self, transfer: _Transfer) -> None:
        self.results[transfer.plan.version] = transfer
        while len(self.results) > self.keep_results:
            self.results.pop(next(iter(self.results)))


_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "the body is not JSON"},
    404: {"model": ErrorResponse, "description": "no push of that version on this worker"},
    409: {"model": ErrorResponse, "description": "another push or a disk load is under way"},
    422: {"model": ErrorResponse, "description": "the manifest does not fit the model"},
    413: {"model": ErrorResponse, "description": "the body is over the worker's --max-body-mib"},
    503: {"model": ErrorResponse, "description": "not ready, loading or shutting down"},
}


def _cuda() -> bool:
    try:
        import torch  # noqa: PLC0415 - a worker without torch receives nothing over NCCL
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def add_push_routes(
    app: FastAPI,
    engine: Engine,
    metrics: Any,
    refuse_when_unavailable: Callable[[], None],
    disk_loading: Callable[[], str | None],
) -> _Pushes:
    """``POST /v1/weights/push`` and ``GET /v1/weights/push/{version}`` on ``app``.

    ``metrics`` is the worker's (its weight-load counters); ``disk_loading`` names the
    version ``POST /v1/weights`` is loading, if any: the two paths never overlap. The
    returned pushes let that route refuse while a push is under way.
    """
    pushes = _Pushes()

    def refuse_when_busy() -> None:
        if pushes.current is not None:
            raise ApiError(
                409,
                f"a push of version {pushes.current.plan.version!r} is under way on this "
                "worker; wait for GET /v1/weights/push/{version} to answer, then push again",
            )
        if (loading := disk_loading()) is not None:
            raise ApiError(
                409,
                f"the worker is loading weights version {loading!r} from disk; push once "
                "that POST /v1/weights has answered",
            )

    async def run(transfer: _Transfer, spec: dict[str, Any]) -> None:
        held = engine.weights.version if engine.weights else None
        result = transfer.result
        try:
            loaded = await engine.receive_weights(spec, delta=transfer.plan.delta)
            stats = engine.last_push
            result.bytes = int(stats.get("received_bytes", 0))
            result.receive_s = float(stats.get("receive_s", 0.0))
            result.stall_s = loaded.load_s
            result.kept = int(stats.get("kept", 0))
            result.status = "loaded"
            metrics.weight_loads.labels("loaded").inc()
            metrics.weight_load_s.set(loaded.load_s)
        except CheckpointError as exc:
            result.status, result.error = "failed", f"{exc}; the worker keeps serving {held!r}"
            metrics.weight_loads.labels("refused").inc()
        except EngineError as exc:
            result.status = "failed"
            result.error = f"the engine failed while loading pushed weights: {exc}"
            metrics.weight_loads.labels("failed").inc()
        finally:
            if pushes.current is transfer:
                pushes.current = None
            transfer.done.set()

    @app.post(
        "/v1/weights/push",
        response_model=PushPlan,
        responses={s: _RESPONSES[s] for s in (400, 409, 413, 422, 503)},
        tags=["weights"],
    )
    async def push(body: PushRequest) -> PushPlan:
        refuse_when_unavailable()
        refuse_when_busy()
        if body.backend == "nccl" and not _cuda():
            raise ApiError(
                422, "backend nccl needs GPUs and this worker has none; push with backend gloo"
            )
        try:
            layout = engine.push_layout()
            fused = await engine.fused_modules() if body.delta else {}
            plan = plan_push(body, layout, fused)
        except CheckpointError as exc:
            metrics.weight_loads.labels("refused").inc()
            raise ApiError(422, str(exc)) from exc
        if body.group.rank + engine.tp > body.group.world_size:
            raise ApiError(
                422,
                f"group.rank {body.group.rank} with this worker's {engine.tp} ranks (its TP "
                f"degree) does not fit world_size {body.group.world_size}; the world is 1 (the "
                "trainer) plus the TP degree of every worker it pushes to",
            )
        answer = PushPlan(version=body.version, tensors=plan, ranks=engine.tp, delta=body.delta)
        transfer = _Transfer(
            answer,
            PushResult(
                version=body.version, status="receiving", delta=body.delta, tensors=len(plan)
            ),
        )
        spec = {
            "version": body.version,
            "address": body.group.address,
            "port": body.group.port,
            "world_size": body.group.world_size,
            "rank": body.group.rank,
            "backend": body.backend,
            "timeout_s": body.timeout_s,
            "tensors": [t.model_dump() for t in plan],
        }
        refuse_when_busy()  # again: another push or a disk load may have begun meanwhile
        pushes.current = transfer
        pushes.remember(transfer)
        transfer.task = asyncio.create_task(run(transfer, spec), name=f"push-{body.version}")
        return answer

    @app.get(
        "/v1/weights/push/{version}",
        response_model=PushResult,
        responses={404: _RESPONSES[404]},
        tags=["weights"],
    )
    async def push_result(version: str, wait_s: float = 0.0) -> PushResult:
        """The push's result; ``wait_s``: wait up to that long for it to finish."""
        transfer = pushes.results.get(version)
        if transfer is None:
            raise ApiError(
                404,
                f"no push of version {version!r} on this worker (it keeps the last "
                f"{pushes.keep_results}); announce one with POST /v1/weights/push",
            )
        if wait_s > 0:
            deadline = time.monotonic() + min(wait_s, 3600.0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(transfer.done.wait(), max(0.0, deadline - time.monotonic()))
        return transfer.result

    return pushes
