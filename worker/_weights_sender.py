"""The trainer's side of a weight push: announce, broadcast over the group, collect results.

>>> import asyncio
>>> from heddle.client import push_weights
>>> state = model.state_dict()                       # doctest: +SKIP
>>> asyncio.run(push_weights(workers, state, "step-7"))            # doctest: +SKIP
>>> delta = ["lm_head.weight"]                       # doctest: +SKIP
>>> asyncio.run(push_weights(workers, state, "step-8", changed=delta))   # doctest: +SKIP

The trainer is rank 0 of a group it serves itself (a ``TCPStore`` on
``address:port``); each worker joins with one rank per TP rank. The worker's plan
says what to send, in order: a delta (``changed``) grows by the other members of
each fused module it touches, so ``tensors`` must hold the whole state dict
(checkpoint names, the Hugging Face ones) even when only a few changed.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import httpx

from heddle.exceptions import WorkerError, WorkerRejectedError, WorkerUnavailableError

from ._client import WorkerEndpoint
from ._weights_receiver import DTYPES, broadcast, open_group, open_store

__all__ = ["changed_tensors", "push_weights"]


def changed_tensors(new: Mapping[str, Any], old: Mapping[str, Any]) -> list[str]:
    """Names whose tensor differs between two state dicts (or is new): a delta's ``changed``."""
    import torch  # noqa: PLC0415

    return [n for n, t in new.items() if n not in old or not torch.equal(t, old[n])]


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


def _dtype_name(tensor: Any) -> str:
    name = str(tensor.dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"tensors of dtype {name} cannot be pushed; send one of {DTYPES}")
    return name


async def push_weights(
    workers: Sequence[WorkerEndpoint],
    tensors: Mapping[str, Any],
    version: str,
    *,
    changed: Iterable[str] | None = None,
    backend: str = "gloo",
    address: str = "127.0.0.1",
    port: int = 0,
    device: str = "cpu",
    timeout_s: float = 120.0,
) -> list[dict[str, Any]]:
    """Push ``tensors`` (name -> torch tensor) to ``workers`` as ``version``; their results.

    ``changed``: only these changed (a delta, loaded with a pause of the load alone);
    else every tensor is pushed. ``backend`` ``nccl`` needs ``device`` a CUDA device
    and workers on GPUs; ``address`` must be reachable from the workers. Raises
    :class:`~heddle.exceptions.WorkerRejectedError` when a worker refuses the manifest
    (nothing was sent) and :class:`~heddle.exceptions.WorkerError` when a transfer failed.
    """
    names = list(tensors) if changed is None else [n for n in changed]
    unknown = [n for n in names if n not in tensors]
    if unknown:
        raise ValueError(f"changed names {unknown[:3]} are not in tensors; name its keys")
    port = port or _free_port(address)
    clients = [
        httpx.AsyncClient(
            base_url=w.url,
            headers={"Authorization": f"Bearer {w.token}"} if w.token else {},
            timeout=timeout_s + 30,
        )
        for w in workers
    ]
    try:
        return await _push(workers, clients, tensors, names, version, changed is not None,
                           backend=backend, address=address, port=port, device=device,
                           timeout_s=timeout_s)  # fmt: skip
    except httpx.HTTPError as exc:
        raise WorkerUnavailableError(
            ",".join(w.name for w in workers), f"cannot reach the worker: {exc!r}"
        ) from None
    finally:
        for client in clients:
            await client.aclose()


async def _push(
    workers: Sequence[WorkerEndpoint],
    clients: Sequence[httpx.AsyncClient],
    tensors: Mapping[str, Any],
    names: Sequence[str],
    version: str,
    delta: bool,
    *,
    backend: str,
    address: str,
    port: int,
    device: str,
    timeout_s: float,
) -> list[dict[str, Any]]:
    ranks: list[int] = []
    for client in clients:
        state = await client.get("/v1/state")
        ranks.append(int(state.json()["tp"]) if state.status_code == 200 else 1)
    world = 1 + sum(ranks)
    manifest = [
        {"name": n, "shape": list(tensors[n].shape), "dtype": _dtype_name(tensors[n])}
        for n in names
    ]
    bodies = []
    first = 1
    for tp in ranks:
        group = {"address": address, "port": port, "world_size": world, "rank": first}
        bodies.append(
            {
                "version": version,
                "tensors": manifest,
                "group": group,
                "backend": backend,
                "delta": delta,
                "timeout_s": timeout_s,
            }
        )
        first += tp
    spec = {"version": version, "address": address, "port": port, "world_size": world,
            "backend": backend, "timeout_s": timeout_s}  # fmt: skip
    # Served before the workers hear of it, so they meet it on their first try.
    store = await asyncio.to_thread(open_store, spec, 0)
    answers = await asyncio.gather(
        *(c.post("/v1/weights/push", json=b) for c, b in zip(clients, bodies, strict=True))
    )
    for worker, answer in zip(workers, answers, strict=True):
        if answer.status_code != 200:
            raise WorkerRejectedError(worker.name, _error(answer), answer.status_code)
    plans = [[(t["name"], t["dtype"]) for t in a.json()["tensors"]] for a in answers]
    if any(p != plans[0] for p in plans):
        raise WorkerRejectedError(
            workers[0].name, "the workers planned different tensors: push to one pool at a time"
        )
    try:
        await asyncio.to_thread(_send, spec, plans[0], tensors, device, store)
    except Exception as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise WorkerError(
            ",".join(w.name for w in workers), f"sending the weights failed: {first_line}"
        ) from None
    results = []
    for worker, client in zip(workers, clients, strict=True):
        reply = await client.get(f"/v1/weights/push/{version}", params={"wait_s": timeout_s})
        result: dict[str, Any] = reply.json()
        if reply.status_code != 200 or result.get("status") != "loaded":
            raise WorkerError(worker.name, result.get("error") or _error(reply))
        results.append(result)
    return results


def _send(
    spec: Mapping[str, Any],
    plan: Sequence[tuple[str, str]],
    tensors: Mapping[str, Any],
    device: str,
    store: Any,
) -> None:
    from ._weights_receiver import torch_dtype  # noqa: PLC0415

    group = open_group(spec, 0, store)
    for name, dtype in plan:
        tensor = tensors[name].detach().to(device=device, dtype=torch_dtype(dtype)).contiguous()
        broadcast(group, tensor)


def _error(reply: httpx.Response) -> str:
    try:
        return str(reply.json()["error"])
    except (ValueError, KeyError, TypeError):
        return f"HTTP {reply.status_code}"
