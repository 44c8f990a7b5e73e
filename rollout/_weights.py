"""Bringing a session's workers to the job's weights (``RolloutJob.spec.weights``).

Every worker loads the checkpoint in place (``POST /v1/weights``) before it
takes a step: all of them before the job's first step, and any that joins
later, or comes back after a restart (it restarts on its start-up weights),
before it is used again. A checkpoint a worker refuses (4xx: missing, another
architecture or size) stops the job with that worker's sentence; the workers
keep serving what they had. A worker that cannot be reached stays out of the
session until the health loop sees it ready and asks again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from heddle.api import WeightsSpec
from heddle.exceptions import CheckpointError, WorkerRejectedError, WorkerUnavailableError
from heddle.worker import WorkerClient

__all__ = ["WeightsKeeper"]

log = logging.getLogger("heddle.session")


class WeightsKeeper:
    """Loads ``spec`` on workers; ``ready`` is set once the first round of loads is over."""

    def __init__(
        self,
        job: str,
        spec: WeightsSpec | None,
        versions: dict[str, str] | None = None,
        timeout_s: float = 600.0,
    ) -> None:
        self.job = job
        self.spec = spec
        self.versions = {} if versions is None else versions  # worker -> version it serves
        self.timeout_s = timeout_s
        self.ready = asyncio.Event()
        if spec is None:
            self.ready.set()
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._pending: set[str] = set()
        # Workers that refused the session's token (401): not asked again until the
        # session gets a new endpoint for them (RolloutSession.add_worker clears it).
        self.refused: set[str] = set()

    def loading(self, name: str) -> bool:
        """Whether a load on ``name`` is queued or under way."""
        return name in self._pending

    def forget(self, name: str) -> None:
        """``name`` may no longer serve the job's weights (down, restarted, removed)."""
        self.versions.pop(name, None)

    def request(self, name: str) -> None:
        """Load on ``name`` (a worker that joined or came back) before it takes steps."""
        if name not in self._pending:
            self._pending.add(name)
            self._queue.put_nowait(name)

    async def run(
        self,
        names: Iterable[str],
        client: Callable[[str], WorkerClient | None],
        loaded: Callable[[str], None],
    ) -> None:
        """Load on ``names`` at once, then on each requested worker; never returns.

        ``loaded(name)`` lets a worker take steps. Raises :class:`CheckpointError`
        when a worker refuses the checkpoint.
        """
        first = list(names)
        self._pending.update(first)
        await asyncio.gather(*(self._load(n, client(n), loaded) for n in first))
        self.ready.set()
        while True:
            name = await self._queue.get()
            await self._load(name, client(name), loaded)

    async def _load(
        self, name: str, client: WorkerClient | None, loaded: Callable[[str], None]
    ) -> None:
        spec = self.spec
        assert spec is not None
        try:
            if client is None:  # removed from the pool meanwhile
                return
            fresh = await client.load_weights(spec.path, spec.version, timeout=self.timeout_s)
        except WorkerRejectedError as exc:
            raise CheckpointError(
                f"spec.weights (path {spec.path}, version {spec.version}) did not load: {exc}"
            ) from exc
        except WorkerUnavailableError as exc:
            if exc.status == 401:
                self.refused.add(name)
            log.warning("%s: weights not loaded on %s yet (%s)", self.job, name, exc)
            return
        finally:
            self._pending.discard(name)
        log.info(
            "%s: %s serves weights version %s%s",
            self.job,
            name,
            spec.version,
            "" if fresh else " (already loaded)",
        )
        self.versions[name] = spec.version
        loaded(name)
