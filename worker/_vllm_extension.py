"""Heddle's methods on every vLLM worker (vLLM's ``worker_extension_cls``).

vLLM imports this module in each worker process before the model runner exists,
which applies :mod:`._vllm_patches` there (where sampling runs, whether vLLM
forked or spawned the process); the worker reaches the methods through
``collective_rpc``. Names start with ``heddle_``: vLLM refuses an extension whose
attributes clash with its worker's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ._vllm_patches import apply_patches, k_table_state, measure_k
from ._weights_receiver import Receiver

__all__ = ["HeddleWorkerExtension"]

apply_patches()


class HeddleWorkerExtension:
    """Mixed into vLLM's worker class; ``self`` is the vLLM worker."""

    def heddle_speculation_faults(self) -> dict[str, str]:
        """The fault checks' results in this process (:func:`apply_patches`)."""
        return apply_patches()

    def heddle_measure_k(self, settings: Mapping[str, Any]) -> bool:
        """Cap the suffix proposer's K by a table rebuilt from the acceptance this engine
        measures (``auto``: heddle.worker._auto_speculation.measured_k_table)."""
        from ._auto_speculation import measured_k_table  # noqa: PLC0415

        return measure_k(measured_k_table(**dict(settings)))

    def heddle_k_state(self) -> dict[str, Any] | None:
        """The measured K table's state in this process (None: K is not measured)."""
        return k_table_state()

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

    # -- weights pushed over a process group (heddle.worker._weights_push) ------------------
    def heddle_packed_modules(self) -> dict[str, list[str]]:
        """The model's fused modules (``qkv_proj``: q, k, v): a delta must send them whole."""
        model: Any = self.model_runner.get_model()  # type: ignore[attr-defined]
        mapping = getattr(model, "packed_modules_mapping", None) or {}
        return {str(k): [str(v) for v in vs] for k, vs in dict(mapping).items()}

    def heddle_push_begin(self, spec: Mapping[str, Any], stage: bool) -> bool:
        """Join the trainer's group in a thread (and, ``stage``, receive every tensor)."""
        rank = int(spec["rank"]) + int(getattr(self, "rank", 0))
        device = "cpu" if spec["backend"] == "gloo" else str(getattr(self, "device", "cuda"))
        receiver = Receiver(spec, rank, device=device, stage=stage)
        self._heddle_receiver: Receiver | None = receiver
        receiver.start()
        return True

    def heddle_push_status(self) -> dict[str, Any]:
        receiver: Receiver | None = getattr(self, "_heddle_receiver", None)
        return receiver.status() if receiver is not None else {"phase": "none", "error": None}

    def heddle_push_apply(self) -> dict[str, Any]:
        """Load the update into the model (the engine is paused): vLLM's in-place reload
        from the received tensors, which re-processes each layer it touches (repacking on
        the CPU build) and puts back every layer the update leaves out."""
        receiver: Receiver | None = self._heddle_receiver
        assert receiver is not None, "heddle_push_begin comes first"
        try:
            quiet = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
            level = quiet.level
            # A delta leaves most layers out; vLLM warns "Failed to load weights" for each.
            quiet.setLevel(logging.ERROR)
            try:
                self.reload_weights(  # type: ignore[attr-defined]
                    weights_iterator=receiver.stream(), is_checkpoint_format=True
                )
            finally:
                quiet.setLevel(level)
            return receiver.status()
        finally:
            receiver.close()

    def heddle_push_drop(self) -> None:
        """Forget a failed or refused update's receiver (and anything it staged)."""
        receiver: Receiver | None = getattr(self, "_heddle_receiver", None)
        if receiver is not None:
            receiver.close()
        self._heddle_receiver = None
