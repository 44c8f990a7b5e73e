"""Heddle's worker extension on arctic-inference's own suffix cache (no engine needed).

``_Worker`` stands in for vLLM's worker process: the extension reaches the cache
as ``self.model_runner.drafter.suffix_cache``, as it does under vLLM's suffix
proposer; the cache is the real ``SuffixDecodingCache``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from heddle.worker._vllm_extension import HeddleWorkerExtension

from .._vllm import needs_suffix

pytestmark = needs_suffix

SIBLING = [11, 12, 13, 14, 15, 16, 17, 18]


def _worker() -> tuple[Any, Any]:
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    cache = SuffixDecodingCache(max_tree_depth=24, max_cached_requests=100)
    drafter = SimpleNamespace(suffix_cache=cache)
    return SimpleNamespace(model_runner=SimpleNamespace(drafter=drafter)), cache


def _draft(cache: Any, context: list[int]) -> list[int]:
    cache.start_request("probe", [0])
    try:
        return list(cache.speculate("probe", context, max_spec_tokens=4).token_ids)
    finally:
        cache.stop_request("probe")
        cache.evict_cached_response("probe")


def test_a_seeded_text_is_drafted_from_and_the_clear_forgets_it() -> None:
    worker, cache = _worker()
    assert _draft(cache, SIBLING[:4]) == []
    assert HeddleWorkerExtension.heddle_seed_drafts(worker, "job/t0/1", SIBLING)
    draft = _draft(cache, SIBLING[:4])
    assert len(draft) >= 3 and draft == SIBLING[4 : 4 + len(draft)]  # the sibling's own next
    # A finished request vLLM has not stopped yet (its proposer stops it at the next
    # step) is still active: the clear must forget its response too.
    cache.start_request("served", [1, 2])
    cache.add_active_response("served", [21, 22, 23, 24, 25, 26, 27, 28])
    assert HeddleWorkerExtension.heddle_clear_drafts(worker) == 2
    assert _draft(cache, SIBLING[:4]) == [] and _draft(cache, [21, 22, 23, 24]) == []


def test_no_suffix_cache_no_seeding() -> None:
    worker = SimpleNamespace(model_runner=SimpleNamespace(drafter=None))
    assert not HeddleWorkerExtension.heddle_seed_drafts(worker, "k", SIBLING)
    assert HeddleWorkerExtension.heddle_clear_drafts(worker) == 0
