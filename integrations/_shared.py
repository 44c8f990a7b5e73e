"""One batcher per settings and event loop, shared by a process's one-sample adapters."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from ._rollouts import HeddleRollouts, SampleBatcher
from ._settings import HeddleSettings

__all__ = ["batcher_for", "rollouts_for", "settings_from", "submit_from_thread"]

_lock = threading.Lock()
_rollouts: dict[HeddleSettings, HeddleRollouts] = {}
_batchers: dict[tuple[HeddleSettings, int], SampleBatcher] = {}


def rollouts_for(settings: HeddleSettings) -> HeddleRollouts:
    with _lock:
        if settings not in _rollouts:
            _rollouts[settings] = HeddleRollouts(settings)
        return _rollouts[settings]


def batcher_for(settings: HeddleSettings) -> SampleBatcher:
    """The batcher of this event loop: a trainer makes one adapter object per sample, and
    the samples of one batch must meet in one job."""
    key = (settings, id(asyncio.get_running_loop()))
    with _lock:
        if key not in _batchers:
            _batchers[key] = SampleBatcher(_rollouts.setdefault(settings, HeddleRollouts(settings)))
        return _batchers[key]


def settings_from(given: dict[str, Any]) -> HeddleSettings:
    """Keyword settings from a trainer's config, the rest from HEDDLE_* variables."""
    return HeddleSettings.from_env(**given)


_background: asyncio.AbstractEventLoop | None = None


def submit_from_thread(
    settings: HeddleSettings, task: dict[str, Any], group: Any = None
) -> dict[str, Any]:
    """A one-sample call from synchronous code in any thread (ROLL runs one env manager
    per thread): all of them meet on one background event loop, hence in one batch."""
    global _background  # noqa: PLW0603 - one loop per process, made on first use
    with _lock:
        if _background is None:
            _background = asyncio.new_event_loop()
            threading.Thread(target=_background.run_forever, daemon=True).start()
        loop = _background

    async def call() -> dict[str, Any]:
        return await batcher_for(settings).submit(task, group)

    return asyncio.run_coroutine_threadsafe(call(), loop).result()
