"""Heddle's methods on every vLLM worker (vLLM's ``worker_extension_cls``).

vLLM imports this module in each worker process before the model runner exists,
which applies :mod:`._vllm_patches` there (where sampling runs, whether vLLM
forked or spawned the process); the worker reaches the methods through
``collective_rpc``. Names start with ``heddle_``: vLLM refuses an extension whose
attributes clash with its worker's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._vllm_patches import apply_patches

__all__ = ["HeddleWorkerExtension"]

apply_patches()


class HeddleWorkerExtension:
    """Mixed into vLLM's worker class; ``self`` is the vLLM worker."""

    def heddle_speculation_faults(self) -> dict[str, str]:
        """The fault checks' results in this process (:func:`apply_patches`)."""
        return apply_patches()

    def heddle_seed_drafts(self, key: str, token_ids: Sequence[int]) -> bool:
        """Add a text to the suffix cache's global tree (responses it drafts from).

        ``key`` names the text (a trajectory's id and segment): the same key again
        replaces it. Returns False where the engine does not run suffix decoding.
        """
        drafter: Any = getattr(getattr(self, "model_runner", None), "drafter", None)
        cache: Any = getattr(drafter, "suffix_cache", None)
        if cache is None or not token_ids:
            return False
        seed_id = f"heddle-seed:{key}"
        if seed_id in cache.active_requests:
            cache.stop_request(seed_id)
        # start_request replaces a cached response of the same id; the prompt is empty
        # because only responses enter the global tree.
        cache.start_request(seed_id, [])
        cache.add_active_response(seed_id, list(token_ids))
        cache.stop_request(seed_id)
        return True

    def heddle_clear_drafts(self) -> int:
        """Forget every response in the suffix cache (its global tree): a measurement
        starts from an engine that has served nothing. Returns how many.

        Call it with no request running. A finished request stays *active* in the
        cache until vLLM's proposer next runs (it stops those no longer in the batch
        then), so active requests are stopped here too; their responses would
        otherwise survive the clear.
        """
        drafter: Any = getattr(getattr(self, "model_runner", None), "drafter", None)
        cache: Any = getattr(drafter, "suffix_cache", None)
        if cache is None:
            return 0
        for req_id in list(cache.active_requests):
            cache.stop_request(req_id)
        done = list(cache.cached_requests)
        for req_id in done:
            cache.evict_cached_response(req_id)
        return len(done)
