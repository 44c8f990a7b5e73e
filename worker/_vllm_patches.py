"""Two faults of vLLM's speculative decoding, fixed where they are found, in vLLM's own process.

Each fix is guarded by a check of the fault itself, not of a version: where an
upgrade fixed vLLM, the check finds no fault and nothing is patched; where the
code moved so that the fix no longer applies, the check reports the fault as
unfixed and the worker refuses to speculate (never serving corrupted samples).
The checks and fixes run in every process that samples (vLLM's workers import
:mod:`heddle.worker._vllm_extension`, which applies them) and the worker asks each
of them for the result after start-up (:func:`speculation_faults`).

1. ``expand``: on vLLM's CPU build, ``rejection_sampler.expand_batch_to_tokens``
   runs ``cpu_triton_utils._expand_kernel_impl``, which passes ``_ensure_int64``
   copies of its float input and output to an int64 kernel: per-token temperature
   and top-p at draft positions stay uninitialised, and sampling at T > 0 with
   speculation returns garbage with no error (acceptance fell to 2.8% in a trial).
   Fixed by a pure-torch expansion (the same contract, any dtype).
2. ``suffix-k``: ``SuffixDecodingProposer.propose`` asserts that the K the
   scheduler asks for equals the configured K, so a K by batch size
   (``num_speculative_tokens_per_batch_size``) kills the engine on its first
   smaller K. Fixed by drafting at most the K asked for.

Not a fault but Heddle's own: :func:`measure_k` caps the suffix proposer's K per
engine step by a :class:`heddle.scheduler.MeasuredKTable` (``auto`` speculation), which
it feeds each request-step's tokens (those sampled at the next step: the accepted
drafts and the target's own) at the K it was asked for; the table rebuilds itself
from them.
"""

from __future__ import annotations

import functools
import inspect
from collections import Counter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from heddle.scheduler import MeasuredKTable

__all__ = ["FAULTS", "apply_patches", "k_table_state", "measure_k", "speculation_faults"]

FAULTS = ("expand", "suffix-k")
# Results, by fault: "absent" (vLLM is right), "patched" (fixed here), "unfixed" (found, and
# the fix did not take: speculation is refused), "n/a" (the code it concerns is not there).
_results: dict[str, str] = {}


def _expand_batch_to_tokens(
    x: Any, cu_num_tokens: Any, num_tokens: int, replace_from: int = 0, replace_to: int = 0
) -> Any:
    """vLLM's ``expand_batch_to_tokens`` in torch: row i of ``x`` repeated for its tokens
    (``cu_num_tokens`` cumulative), ``replace_from`` values replaced by ``replace_to``."""
    import torch  # noqa: PLC0415 - only inside vLLM's processes

    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1))
    values = torch.where(x == replace_from, torch.full_like(x, replace_to), x)
    expanded = torch.repeat_interleave(values, counts.clamp(min=0))
    out = x.new_zeros(num_tokens)
    n = min(num_tokens, int(expanded.shape[0]))
    out[:n] = expanded[:n]
    return out


def _expand_is_right(rejection_sampler: Any) -> bool:
    """Expand float rows as the rejection sampler does for temperature and top-p."""
    import torch  # noqa: PLC0415

    x = torch.tensor([0.7, 0.0, 1.3], dtype=torch.float32)
    cu = torch.tensor([2, 3, 6], dtype=torch.int32)
    try:
        got = rejection_sampler.expand_batch_to_tokens(x, cu, 6, replace_from=0, replace_to=1)
    except Exception:  # e.g. no kernel for this platform yet: take it as wrong, use ours
        return False
    want = torch.tensor([0.7, 0.7, 1.0, 1.3, 1.3, 1.3], dtype=torch.float32)
    return bool(got.dtype == x.dtype and torch.allclose(got, want))


def _check_expand() -> str:
    try:
        from vllm.v1.sample import rejection_sampler  # noqa: PLC0415
    except ImportError:
        return "n/a"
    if not hasattr(rejection_sampler, "expand_batch_to_tokens"):
        return "n/a"
    if _expand_is_right(rejection_sampler):
        return "patched" if _results.get("expand") == "patched" else "absent"
    rejection_sampler.expand_batch_to_tokens = _expand_batch_to_tokens
    return "patched" if _expand_is_right(rejection_sampler) else "unfixed"


def _check_suffix_k() -> str:
    try:
        from vllm.v1.spec_decode.suffix_decoding import (  # noqa: PLC0415
            SuffixDecodingProposer,
        )
    except ImportError:
        return "n/a"
    propose = SuffixDecodingProposer.propose
    if getattr(propose, "_heddle_patched", False):
        return "patched"
    source = inspect.getsource(propose)
    if "num_speculative_tokens == self.num_speculative_tokens" not in source:
        return "absent"
    params = list(inspect.signature(propose).parameters)
    if params[:2] != ["self", "num_speculative_tokens"] or (
        "self.num_speculative_tokens" not in source.split("max_spec_tokens", 1)[-1]
    ):
        return "unfixed"  # the method changed shape: the fix below would not mean the same

    @functools.wraps(propose)
    def fixed(self: Any, num_speculative_tokens: int, *args: Any, **kwargs: Any) -> Any:
        # The configured K is the cap; this step's K (by batch size) may be smaller.
        configured = self.num_speculative_tokens
        self.num_speculative_tokens = min(num_speculative_tokens, configured)
        try:
            return propose(self, self.num_speculative_tokens, *args, **kwargs)
        finally:
            self.num_speculative_tokens = configured

    fixed._heddle_patched = True  # type: ignore[attr-defined]
    SuffixDecodingProposer.propose = fixed
    return "patched"


def apply_patches() -> dict[str, str]:
    """Check each fault, fix it where found; idempotent. Returns the result by fault.

    ``HEDDLE_VLLM_PATCHES=0`` leaves vLLM as it is (the exactness tests check that
    catch the faults this way): every fault reports ``unchecked``, and the worker
    speculates on the unpatched engine. Never set it to serve a rollout.
    """
    import os  # noqa: PLC0415

    if os.environ.get("HEDDLE_VLLM_PATCHES", "1") == "0":
        _results.update(dict.fromkeys(FAULTS, "unchecked"))
        return dict(_results)
    _results["expand"] = _check_expand()
    _results["suffix-k"] = _check_suffix_k()
    return dict(_results)


def speculation_faults(results: list[dict[str, str]], *, batch_size_table: bool) -> str | None:
    """Why speculation must not run, from every rank's results; ``None``: it may.

    ``suffix-k`` matters only with a K by batch size; ``unchecked`` (patches turned
    off) is allowed so a test can show what the unpatched engine does.
    """
    for rank, result in enumerate(results):
        if result.get("expand") == "unfixed":
            return (
                f"vLLM's rejection sampler on rank {rank} expands per-token temperature and "
                "top-p wrongly (the CPU build's expand kernel) and Heddle's fix did not take: "
                "speculation would sample garbage at T > 0; run without speculation"
            )
        if batch_size_table and result.get("suffix-k") == "unfixed":
            return (
                f"vLLM's suffix proposer on rank {rank} cannot draft fewer tokens than "
                "num_speculative_tokens and Heddle's fix did not take: give a fixed K "
                "instead of a table by batch size"
            )
    return None


# -- K from measured acceptance (auto speculation) -----------------------------------------
# The suffix proposer's parameters the cap relies on (vLLM 0.32's order).
_PROPOSE_PARAMS = ["self", "num_speculative_tokens", "input_batch", "sampled_token_ids"]


class _Measuring:
    """This process's measured table and, per request, its last draft: (the K it was
    asked for, the tokens drafted)."""

    table: MeasuredKTable | None = None
    asked: dict[str, tuple[int, int]] = {}  # noqa: RUF012 - replaced whole at each step


_measuring = _Measuring()


def _verified(input_batch: Any, i: int) -> int | None:
    """Draft tokens vLLM verified for request ``i`` this step (None: not known here)."""
    spec = getattr(input_batch, "spec_token_ids", None)
    return None if spec is None else len(spec[i])


def _capped(propose: Any) -> Any:
    @functools.wraps(propose)
    def capped(
        self: Any, num_speculative_tokens: int, input_batch: Any, sampled: Any, *a: Any, **kw: Any
    ) -> Any:
        table = _measuring.table
        if table is None:
            return propose(self, num_speculative_tokens, input_batch, sampled, *a, **kw)
        # What the previous step's drafts gave: this step's sampled tokens per request
        # (its accepted drafts and one token of the target's own), counted only where
        # vLLM verified exactly what was drafted (not where it skipped or cut drafts).
        steps: Counter[int] = Counter()
        tokens: Counter[int] = Counter()
        for i, ids in enumerate(sampled):
            if not ids:
                continue
            asked, drafted = _measuring.asked.get(input_batch.req_ids[i], (0, 0))
            verified = _verified(input_batch, i)
            if asked and (verified is None or verified == drafted):
                steps[asked] += 1
                tokens[asked] += len(ids)
        for k, n in steps.items():
            table.record(k, n, tokens[k])
        cap = min(num_speculative_tokens, table.k_at(len(sampled)))
        # The proposer reads its own K (vLLM 0.32 drafts up to self.num_speculative_tokens
        # whatever it is passed): set it for this step, as the suffix-k fix does.
        configured = self.num_speculative_tokens
        self.num_speculative_tokens = cap
        try:
            drafts = propose(self, cap, input_batch, sampled, *a, **kw)
        finally:
            self.num_speculative_tokens = configured
        _measuring.asked = {
            input_batch.req_ids[i]: (cap, len(drafts[i]))
            for i, ids in enumerate(sampled)
            if ids and cap
        }
        return drafts

    capped._heddle_capped = True  # type: ignore[attr-defined]
    return capped


def measure_k(table: MeasuredKTable) -> bool:
    """Draft by ``table`` from now on, in this process. False where the suffix proposer
    is missing, has another shape than the cap relies on, or cannot draft fewer than its
    configured K (the ``suffix-k`` fault found and not fixed): the worker then refuses."""
    try:
        from vllm.v1.spec_decode.suffix_decoding import (  # noqa: PLC0415
            SuffixDecodingProposer,
        )
    except ImportError:
        return False
    if apply_patches().get("suffix-k") not in {"patched", "absent", "unchecked"}:
        return False  # the cap must sit on a proposer that takes a smaller K
    propose = SuffixDecodingProposer.propose
    if not getattr(propose, "_heddle_capped", False):
        params = list(inspect.signature(inspect.unwrap(propose)).parameters)
        if params[: len(_PROPOSE_PARAMS)] != _PROPOSE_PARAMS:
            return False
        SuffixDecodingProposer.propose = _capped(propose)
    _measuring.table, _measuring.asked = table, {}
    return True


def k_table_state() -> dict[str, Any] | None:
    """The measured table's state (:meth:`MeasuredKTable.state`); None: K is not measured."""
    return None if _measuring.table is None else _measuring.table.state()
