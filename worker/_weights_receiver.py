"""Receiving weights a trainer pushes over a process group (gloo on CPU, NCCL on GPUs).

Runs where the weights live: in each vLLM worker process (through
:mod:`._vllm_extension`, one receiver per TP rank) or in the sim engine's process.
The group is torch's own ``ProcessGroupGloo``/``ProcessGroupNCCL`` over a
``TCPStore`` the trainer (rank 0) serves, built apart from vLLM's default group,
so the engine's own tensor-parallel collectives are untouched. The trainer
broadcasts each tensor of the plan from rank 0, in the plan's order; every
other rank receives it. A group lives for one update: a trainer that restarted
never meets a stale one.

A receive is a thread: the engine keeps generating while tensors arrive (the
delta path stages them all before the engine pauses), or the engine pauses
first and the tensors stream straight into vLLM's reload (the full path: no
second copy of the model in memory).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

__all__ = [
    "DTYPES",
    "Group",
    "Receiver",
    "broadcast",
    "open_group",
    "open_store",
    "torch_dtype",
]

# The dtypes a push may carry, by the names the wire uses (torch's own, without "torch.").
DTYPES = ("float32", "float16", "bfloat16", "float64")


def torch_dtype(name: str) -> Any:
    import torch  # noqa: PLC0415 - only where weights are received or sent

    return getattr(torch, name)


@dataclass(frozen=True)
class Group:
    """A process group and the store it met on (which must outlive it)."""

    group: Any
    store: Any


def open_store(spec: Mapping[str, Any], rank: int) -> Any:
    """The trainer's TCPStore: served by rank 0 (at once, before the workers come), a
    client elsewhere."""
    import torch.distributed as dist  # noqa: PLC0415

    return dist.TCPStore(
        spec["address"],
        int(spec["port"]),
        int(spec["world_size"]),
        is_master=rank == 0,
        timeout=timedelta(seconds=float(spec["timeout_s"])),
        wait_for_workers=False,
    )


def open_group(spec: Mapping[str, Any], rank: int, store: Any = None) -> Group:
    """Join the trainer's group as ``rank``: gloo or NCCL over the trainer's TCPStore."""
    import torch.distributed as dist  # noqa: PLC0415

    timeout = timedelta(seconds=float(spec["timeout_s"]))
    store = store if store is not None else open_store(spec, rank)
    # One prefix per version: keys of an earlier update on the same store never collide.
    prefixed = dist.PrefixStore(f"heddle-weights/{spec['version']}", store)
    if spec["backend"] == "nccl":
        group = dist.ProcessGroupNCCL(prefixed, rank, int(spec["world_size"]), timeout=timeout)
    else:
        group = dist.ProcessGroupGloo(prefixed, rank, int(spec["world_size"]), timeout)
    return Group(group, store)


def broadcast(group: Group, tensor: Any) -> None:
    """Rank 0's ``tensor`` into every rank's ``tensor`` (in place)."""
    import torch.distributed as dist  # noqa: PLC0415

    options = dist.BroadcastOptions()
    options.rootRank = 0
    group.group.broadcast([tensor], options).wait()


@dataclass
class Receiver:
    """One update's receipt on one rank: joins the group, then receives the plan's tensors.

    ``stage``: receive every tensor into memory at once (the engine keeps running);
    else only join, and :meth:`stream` yields the tensors while the engine is paused.
    """

    spec: Mapping[str, Any]  # version, address, port, world_size, backend, timeout_s, tensors
    rank: int
    device: str = "cpu"
    stage: bool = False
    phase: str = "joining"  # joining, joined, received, failed, done
    error: str | None = None
    staged: list[tuple[str, Any]] = field(default_factory=list)
    received_bytes: int = 0
    receive_s: float = 0.0
    _group: Group | None = None
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="heddle-weights", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._group = open_group(self.spec, self.rank)
            self.phase = "joined"
            if self.stage:
                started = time.monotonic()
                self.staged = list(self._receive())
                self.receive_s = time.monotonic() - started
                self.phase = "received"
        except Exception as exc:  # the trainer went away, timed out, or sent other shapes
            self.error = _why(exc, self.spec)
            self.phase = "failed"

    def _receive(self) -> Iterator[tuple[str, Any]]:
        import torch  # noqa: PLC0415

        tensors: Sequence[Mapping[str, Any]] = self.spec["tensors"]
        for entry in tensors:
            tensor = torch.empty(
                tuple(entry["shape"]), dtype=torch_dtype(entry["dtype"]), device=self.device
            )
            assert self._group is not None
            broadcast(self._group, tensor)
            self.received_bytes += tensor.numel() * tensor.element_size()
            yield entry["name"], tensor

    def stream(self) -> Iterator[tuple[str, Any]]:
        """The tensors as they arrive (joined, not staged), or those staged."""
        if self.stage:
            yield from self.staged
            return
        started = time.monotonic()
        try:
            yield from self._receive()
        except Exception as exc:
            raise RuntimeError(_why(exc, self.spec)) from None
        self.receive_s = time.monotonic() - started

    def wait_joined(self, timeout_s: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)

    def status(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "error": self.error,
            "received_bytes": self.received_bytes,
            "receive_s": self.receive_s,
        }

    def close(self) -> None:
        self.staged = []
        self._group = None
        self.phase = "done" if self.error is None else "failed"


def _why(exc: BaseException, spec: Mapping[str, Any]) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    where = f"{spec['address']}:{spec['port']}"
    if "timed out" in text.lower() or "timeout" in text.lower():
        return (
            f"no weights from the trainer (rank 0 at {where}) within {spec['timeout_s']} s: "
            "start the sender right after the plan, or raise timeout_s"
        )
    return f"receiving weights from the trainer (rank 0 at {where}) failed: {text}"
