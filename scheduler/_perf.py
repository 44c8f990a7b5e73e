"""The explicit performance model of an LLM engine instance.

Every number the scheduler and the simulator use for time comes from here:
per-iteration decode time as a function of batch size, resident context and
tensor-parallel degree; prefill time; KV capacity; the low-load per-token time
``T(tp)`` and the interference factor ``F(batch)`` of the paper's placement
cost. docs/performance-model.md gives each constant's source.

Decode iteration time (a roofline, per engine instance of ``tp`` GPUs)::

    t_mem     = (weight_bytes + context_tokens * kv_bytes_per_token) / (tp * hbm_bw * bw_eff)
    t_compute = (2 * params * batch + 4 * layers * hidden * context_tokens) / (tp * flops * mfu)
    t_iter    = max(t_mem, t_compute) + all_reduce(tp, batch) + step_overhead

Both roofline terms are linear in ``context_tokens``, so the time of ``k``
consecutive iterations whose context grows by ``batch`` tokens each has a
closed form (:meth:`PerfModel.segment_time`); the simulator relies on that to
jump from batch change to batch change instead of stepping token by token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from heddle.exceptions import ConfigError

from ._limits import ENGINE_BATCH_CAP

__all__ = [
    "HARDWARE_PRESETS",
    "MODEL_PRESETS",
    "EngineInstance",
    "HardwareSpec",
    "ModelSpec",
    "PerfModel",
]


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a dense decoder-only model (enough to cost its decode steps)."""

    name: str
    params_billion: float
    num_layers: int
    hidden_size: int
    num_kv_heads: int
    head_dim: int
    bytes_per_param: int = 2  # bf16

    @property
    def weight_bytes(self) -> float:
        return self.params_billion * 1e9 * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> float:
        """Key and value bytes one token occupies across all layers."""
        return 2.0 * self.num_layers * self.num_kv_heads * self.head_dim * self.bytes_per_param


@dataclass(frozen=True)
class HardwareSpec:
    """One accelerator and its interconnect. Efficiencies are fractions of peak."""

    name: str
    memory_gb: float
    hbm_bandwidth_gbps: float  # GB/s per GPU
    bf16_tflops: float  # dense, per GPU
    interconnect_gbps: float  # per-direction GB/s per GPU within a node
    bandwidth_efficiency: float = 0.8
    compute_efficiency: float = 0.5
    all_reduce_latency_us: float = 10.0  # one small NCCL all-reduce inside a node
    step_overhead_ms: float = 4.0  # scheduler, sampling and Python per engine step
    gpu_memory_utilization: float = 0.9
    activation_reserve_gb: float = 3.0  # per GPU, kept out of the KV cache
    # Share of a verification step's extra compute (the draft tokens') that is not hidden
    # under a memory-bound step's reads. Fitted on vLLM-shaped Qwen3-8B layer stacks on
    # an H200 (docs/performance-model.md, "Speculative decoding"): t(k)/t(0) within 6.5%
    # on average over batch 1-256, contexts 1K and 8K, k 1-8; 0 would make drafts free.
    draft_compute_exposed: float = 0.5


# Qwen3 shapes from the models' config.json (layers, hidden, KV heads, head dim).
MODEL_PRESETS: dict[str, ModelSpec] = {
    "qwen3-8b": ModelSpec("Qwen3-8B", 8.19, 36, 4096, 8, 128),
    "qwen3-14b": ModelSpec("Qwen3-14B", 14.77, 40, 5120, 8, 128),
    "qwen3-32b": ModelSpec("Qwen3-32B", 32.76, 64, 5120, 8, 128),
}

# H100 SXM5 datasheet: 80 GB HBM3 at 3.35 TB/s, 989 dense bf16 TFLOPS,
# NVLink 4 at 900 GB/s bidirectional (450 GB/s each way). H200 SXM datasheet: the
# same chip and NVLink with 141 GB of HBM3e at 4.8 TB/s.
HARDWARE_PRESETS: dict[str, HardwareSpec] = {
    "h100-sxm": HardwareSpec("H100-SXM", 80.0, 3350.0, 989.0, 450.0),
    "h200-sxm": HardwareSpec("H200-SXM", 141.0, 4800.0, 989.0, 450.0),
}


@dataclass(frozen=True)
class EngineInstance:
    """One engine instance as the placement and migration planners see it.

    ``slowdown[b]`` is the interference factor ``F(b)``: per-token time of a
    trajectory in a batch of ``b`` divided by its time alone (``F(1) == 1``,
    nondecreasing, defined for ``0 <= b <= batch_cap``).
    """

    name: str
    tp: int
    per_token_s: float  # T(tp): seconds per output token at batch 1
    kv_capacity_tokens: int
    batch_cap: int
    slowdown: tuple[float, ...] = field(repr=False)

    def interference(self, batch: int) -> float:
        """``F(batch)``; above the batch cap requests take turns, so it grows linearly."""
        if batch <= self.batch_cap:
            return self.slowdown[max(batch, 0)]
        return self.slowdown[self.batch_cap] * batch / self.batch_cap


@dataclass(frozen=True)
class PerfModel:
    """Costs one model on one hardware type. Pure arithmetic, no state."""

    model: ModelSpec
    hardware: HardwareSpec
    batch_cap: int = ENGINE_BATCH_CAP  # the paper's per-engine cap, vLLM's max_num_seqs
    typical_context_tokens: int = 8192  # context per trajectory assumed for T and F

    def __post_init__(self) -> None:
        if self.batch_cap < 1:
            raise ConfigError(f"batch_cap={self.batch_cap} must be at least 1")
        if self.typical_context_tokens < 1:
            raise ConfigError(
                f"typical_context_tokens={self.typical_context_tokens} must be at least 1"
            )

    @property
    def step_overhead_s(self) -> float:
        """Time a step spends outside the engine (HTTP, the worker's bookkeeping) before
        it can join a batch. The datasheet model has none: it costs the GPU alone."""
        return 0.0

    # -- capacity ---------------------------------------------------------
    def kv_capacity_tokens(self, tp: int) -> int:
        """Tokens of KV cache an instance of ``tp`` GPUs holds (0 if the weights do not fit)."""
        hw = self.hardware
        usable = tp * (hw.memory_gb * hw.gpu_memory_utilization - hw.activation_reserve_gb) * 1e9
        free = usable - self.model.weight_bytes
        return max(0, int(free // self.model.kv_bytes_per_token))

    def min_tp(self, candidates: list[int] | tuple[int, ...]) -> int:
        """Smallest TP degree among ``candidates`` whose KV cache holds one long trajectory."""
        for tp in sorted(candidates):
            if self.kv_capacity_tokens(tp) >= self.typical_context_tokens:
                return tp
        raise ConfigError(
            f"{self.model.name} does not fit on any of tp={sorted(candidates)} "
            f"{self.hardware.name} GPUs with room for {self.typical_context_tokens} tokens; "
            "allow a larger tensor-parallel size"
        )

    # -- decode -------------------------------------------------------------
    def _roofline_terms(
        self, batch: int, tp: int, draft_tokens: int = 0
    ) -> tuple[float, float, float, float]:
        """(mem_base, mem_per_ctx_token, compute_base, compute_per_ctx_token) in seconds.

        A speculative step verifying ``draft_tokens`` drafts per sequence reads the
        weights and the KV once but computes ``batch * (draft_tokens + 1)`` query
        tokens, each attending over its sequence's context.
        """
        hw, m = self.hardware, self.model
        bw = tp * hw.hbm_bandwidth_gbps * 1e9 * hw.bandwidth_efficiency
        flops = tp * hw.bf16_tflops * 1e12 * hw.compute_efficiency
        queries = draft_tokens + 1
        compute_base = 2.0 * m.params_billion * 1e9 * batch / flops
        compute_ctx = 4.0 * m.num_layers * m.hidden_size / flops
        # The drafts' compute shows partly even where the reads dominate:
        # max(mem + exposed * extra compute, compute), still linear in context.
        exposed = hw.draft_compute_exposed * draft_tokens
        return (
            m.weight_bytes / bw + exposed * compute_base,
            m.kv_bytes_per_token / bw + exposed * compute_ctx,
            compute_base * queries,
            compute_ctx * queries,
        )

    def _fixed_time(self, batch: int, tp: int, draft_tokens: int = 0) -> float:
        """All-reduce (two per layer for TP > 1) plus the per-step overhead."""
        hw, m = self.hardware, self.model
        t = hw.step_overhead_ms * 1e-3
        if tp > 1:
            tokens = batch * (draft_tokens + 1)
            ring_bytes = 2.0 * (tp - 1) / tp * tokens * m.hidden_size * 2
            per_op = hw.all_reduce_latency_us * 1e-6 + ring_bytes / (hw.interconnect_gbps * 1e9)
            t += 2 * m.num_layers * per_op
        return t

    def iteration_time(
        self, batch: int, context_tokens: float, tp: int, draft_tokens: int = 0
    ) -> float:
        """Seconds for one decode iteration of ``batch`` requests holding ``context_tokens``.

        With ``draft_tokens`` > 0 it is a verification step of that many drafts per
        sequence (docs/performance-model.md, "Speculative decoding").
        """
        if batch <= 0:
            return 0.0
        mb, mc, cb, cc = self._roofline_terms(batch, tp, draft_tokens)
        return max(mb + mc * context_tokens, cb + cc * context_tokens) + self._fixed_time(
            batch, tp, draft_tokens
        )

    def segment_time(
        self,
        batch: int,
        context_tokens: float,
        tp: int,
        iterations: int,
        draft_tokens: int = 0,
        tokens_per_step: float = 1.0,
    ) -> float:
        """Seconds for ``iterations`` decode steps, context growing by ``batch *
        tokens_per_step`` per step (1 without speculation).

        Exact sum of :meth:`iteration_time` over the steps (both roofline
        terms are linear in context, so each side of their crossing is an
        arithmetic series).
        """
        if iterations <= 0 or batch <= 0:
            return 0.0
        mb, mc, cb, cc = self._roofline_terms(batch, tp, draft_tokens)
        growth = batch * tokens_per_step
        # max(mem, compute) of two lines in the step index: one side wins before
        # their crossing, the other after it; each side sums as an arithmetic series.
        diff0 = (mb - cb) + (mc - cc) * context_tokens
        dslope = (mc - cc) * growth
        split = 0
        if dslope != 0.0:
            split = min(iterations, max(0, math.ceil(-diff0 / dslope)))
        return (
            _series_of_max(mb, mc, cb, cc, context_tokens, growth, 0, split)
            + _series_of_max(mb, mc, cb, cc, context_tokens, growth, split, iterations - split)
            + iterations * self._fixed_time(batch, tp, draft_tokens)
        )

    def iterations_within(
        self,
        batch: int,
        context_tokens: float,
        tp: int,
        seconds: float,
        draft_tokens: int = 0,
        tokens_per_step: float = 1.0,
    ) -> int:
        """Whole decode iterations that complete within ``seconds`` (inverse of segment_time)."""
        if seconds <= 0 or batch <= 0:
            return 0

        def fits(n: int) -> bool:
            spent = self.segment_time(batch, context_tokens, tp, n, draft_tokens, tokens_per_step)
            return spent <= seconds

        lo, hi = 0, 1
        while fits(hi):
            lo, hi = hi, hi * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid
        return lo

    # -- prefill and movement ----------------------------------------------
    def prefill_time(self, tokens: int, tp: int) -> float:
        """Seconds to prefill ``tokens`` uncached tokens (compute bound, plus one weight read)."""
        if tokens <= 0:
            return 0.0
        mb, _, _, cc = self._roofline_terms(1, tp)
        hw = self.hardware
        flops = tp * hw.bf16_tflops * 1e12 * hw.compute_efficiency
        linear = 2.0 * self.model.params_billion * 1e9 * tokens / flops
        attention = cc * tokens * tokens / 2.0  # causal attention over the new tokens
        return max(linear + attention, mb) + self._fixed_time(1, tp)

    # -- the paper's T(tp) and F(b) ------------------------------------------
    def per_token_s(self, tp: int) -> float:
        """``T(tp)``: seconds per output token of a lone trajectory of typical context."""
        return self.iteration_time(1, self.typical_context_tokens, tp)

    def instance(self, name: str, tp: int) -> EngineInstance:
        """The planner's view of one instance of ``tp`` GPUs."""
        kv = self.kv_capacity_tokens(tp)
        ctx = self.typical_context_tokens
        # Concurrency is bounded by the batch cap and by how many typical contexts fit.
        cap = max(1, min(self.batch_cap, kv // ctx if kv >= ctx else 1))
        base = self.iteration_time(1, ctx, tp)
        slowdown = [0.0] + [self.iteration_time(b, b * ctx, tp) / base for b in range(1, cap + 1)]
        return EngineInstance(
            name=name,
            tp=tp,
            per_token_s=base,
            kv_capacity_tokens=kv,
            batch_cap=cap,
            slowdown=tuple(slowdown),
        )


def _series_of_max(
    mb: float, mc: float, cb: float, cc: float, ctx: float, batch: float, first: int, count: int
) -> float:
    """``sum_{i=first}^{first+count-1} max(mb + mc*c_i, cb + cc*c_i)``, ``c_i = ctx + i*batch``.

    The caller splits at the crossing so one side wins on the whole range; an
    arithmetic series sums to ``count`` times its midpoint value.
    """
    if count <= 0:
        return 0.0
    mid = ctx + (first + (count - 1) / 2.0) * batch
    return count * max(mb + mc * mid, cb + cc * mid)
