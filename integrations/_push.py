"""A trainer's weights pushed to the pool's workers over a process group (docs/trainers.md).

Any adapter's weight hook calls :meth:`WeightPusher.push` with the trainer's state
dict: the first push (and every push in ``full`` mode) sends every tensor, a
``delta`` push only those :func:`~heddle.client.changed_tensors` finds against
the last pushed copy (the smallest tensor when none changed, so that the workers
still take the new version). The pusher keeps that copy on the trainer's CPU: one
more copy of the model there is the bound on its memory; ``full`` keeps none.

>>> from heddle.integrations import HeddleSettings, WeightPusher
>>> settings = HeddleSettings(job="job.yaml", weights_sync="delta",
...                           push_workers="http://10.0.0.7:8000")
>>> WeightPusher.from_settings(settings).delta
True
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from heddle.client import WorkerEndpoint, changed_tensors, push_weights
from heddle.exceptions import ConfigError

from ._settings import HeddleSettings

__all__ = ["PushReport", "WeightPusher"]


@dataclass(frozen=True)
class PushReport:
    """One push: its version, the tensors the trainer named, and what the workers say."""

    version: str
    names: tuple[str, ...]  # what was announced (a delta's workers add fused siblings)
    delta: bool
    results: tuple[dict[str, Any], ...]  # per worker: status, tensors, bytes, stall_s, ...

    @property
    def bytes(self) -> int:
        """Bytes the workers received, summed over workers."""
        return sum(int(r.get("bytes") or 0) for r in self.results)


class WeightPusher:
    """Pushes versions of one trainer's state dict to ``workers``; one per trainer process."""

    def __init__(
        self,
        workers: Sequence[WorkerEndpoint],
        *,
        delta: bool = False,
        backend: str = "gloo",
        address: str = "127.0.0.1",
        device: str = "cpu",
        timeout_s: float = 120.0,
    ) -> None:
        if not workers:
            raise ConfigError("a weight push needs at least one worker: set push_workers")
        self.workers = list(workers)
        self.delta = delta
        self.backend = backend
        self.address = address
        self.device = device
        self.timeout_s = timeout_s
        self._count = itertools.count(1)
        self._last: dict[str, Any] | None = None  # the last pushed copy (delta mode only)

    @classmethod
    def from_settings(cls, settings: HeddleSettings) -> WeightPusher:
        """From ``weights_sync`` (``push`` or ``delta``) and the ``push_*`` settings."""
        if settings.weights_sync == "disk":
            raise ConfigError("weights_sync is disk: set it to push or delta to push weights")
        urls = [u.strip() for u in (settings.push_workers or "").split(",") if u.strip()]
        workers = [
            WorkerEndpoint(f"push-{i}", u, token=settings.push_token) for i, u in enumerate(urls)
        ]
        return cls(
            workers,
            delta=settings.weights_sync == "delta",
            backend=settings.push_backend,
            address=settings.push_address,
            device=settings.push_device,
        )

    async def push(self, state: Mapping[str, Any], version: str | None = None) -> PushReport:
        """Push ``state`` (name -> tensor, the Hugging Face names) as ``version`` (default
        ``push-<n>``, counting this pusher's pushes); every worker serves it on return."""
        version = version or f"push-{next(self._count)}"
        changed = None
        if self.delta and self._last is not None:
            changed = changed_tensors(state, self._last)
            if not changed and state:  # a push carries 1+ tensors; the version must still move
                changed = [min(state, key=lambda n: int(state[n].numel()))]
        results = await push_weights(
            self.workers, state, version, changed=changed, backend=self.backend,
            address=self.address, device=self.device, timeout_s=self.timeout_s,
        )  # fmt: skip
        if self.delta:  # kept only once every worker took it, so a failed push is re-sent
            self._last = {n: t.detach().to("cpu", copy=True) for n, t in state.items()}
        names = tuple(state) if changed is None else tuple(changed)
        return PushReport(version, names, changed is not None, tuple(results))
