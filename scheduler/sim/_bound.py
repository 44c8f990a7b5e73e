"""The makespan lower bound every policy is held to (derivation: docs/simulator.md).

``max(serial, work)``. *Serial*: the slowest trajectory alone on its fastest
TP degree, its prefills and true tool latencies included. *Work*: GPU-seconds
no schedule can avoid, over all GPUs. An engine of ``k`` GPUs spends, per
decode iteration, at least ``W/bw + k·f_k`` GPU-seconds on the memory side
(weights read once; ``f_k`` its fixed step and all-reduce time) or ``k·f_k``
on the compute side, plus per token the KV it reads (``c·kv/bw``) or the
FLOPs it needs. An iteration serves at most ``cap`` tokens *and* tokens whose
contexts sum to at most the engine's KV capacity ``KV_k``, so a token of
context ``c`` uses at least ``max(1/cap, c/KV_k)`` of an iteration, which is
at least ``λ/cap + (1-λ)·c/KV_k`` for any ``λ`` in [0, 1]. Letting each token
pick its cheapest TP degree relaxes the schedule further, so for every
choice of ``λ_k`` the sum is a lower bound; the bound takes the best ``λ_k``
a coordinate search finds. Prefill adds its FLOPs once per group's prompt
(siblings on one engine share it through the prefix cache) and tool reply.
A group's prompt is held once per engine, so for the KV capacity a token's
context counts its prompt as shared by the whole group (``c - p + p/n``);
the KV it reads is still its whole context. Tests check on random small
cases that no policy beats it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .._cluster import ClusterSpec
from .._perf import PerfModel
from .._profiled import ProfiledPerfModel
from .._workload import TrajectoryScript

__all__ = ["LowerBound", "lower_bound"]

_LAMBDAS = np.linspace(0.0, 1.0, 21)


@dataclass(frozen=True)
class LowerBound:
    """``max(serial_s, work_s)``: no schedule on this cluster can finish sooner.

    ``serial_s``: the slowest trajectory run alone on its fastest TP degree,
    prefills and tools included. ``work_s``: the GPU-seconds every token needs
    at best (batches bounded by the batch cap and by the KV cache at each TP
    degree, weights read once per iteration, each token's context read once,
    prompts and tool replies prefilled once), spread over all GPUs.
    """

    serial_s: float
    work_s: float

    @property
    def bound_s(self) -> float:
        return max(self.serial_s, self.work_s)


def _serial_time(
    script: TrajectoryScript, perf: PerfModel, tps: Sequence[int], grouped: bool
) -> float:
    best = math.inf
    for tp in tps:
        # A sibling may have prefilled the group's prompt already.
        t = 0.0 if grouped else perf.prefill_time(script.prompt_tokens, tp)
        context = script.prompt_tokens
        for i, tokens in enumerate(script.turn_tokens):
            t += perf.segment_time(1, context, tp, tokens)
            context += tokens
            if i < len(script.tool_latency_s):
                t += script.tool_latency_s[i] + perf.prefill_time(script.tool_output_tokens[i], tp)
                context += script.tool_output_tokens[i]
        best = min(best, t)
    return best


def _runs(
    scripts: Sequence[TrajectoryScript], group_sizes: dict[str, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decode runs as (first context, tokens, first KV share): token ``i`` of a run reads
    ``first + i`` and holds at least ``share + i`` of the KV cache (its prompt shared)."""
    starts: list[int] = []
    counts: list[int] = []
    shares: list[int] = []
    for s in scripts:
        context = s.prompt_tokens
        shared = s.prompt_tokens * (1.0 - 1.0 / group_sizes[s.group_id])
        for i, n in enumerate(s.turn_tokens):
            starts.append(context)
            counts.append(n)
            shares.append(math.floor(context - shared))  # whole tokens, as the envelope sums
            context += n
            if i < len(s.tool_output_tokens):
                context += s.tool_output_tokens[i]
    return (
        np.asarray(starts, dtype=np.float64),
        np.asarray(counts, dtype=np.float64),
        np.asarray(shares, dtype=np.float64),
    )


def _envelope_sum(
    alpha: np.ndarray, beta: np.ndarray, starts: np.ndarray, counts: np.ndarray
) -> float:
    """``sum over tokens of min_k (alpha_k + beta_k * c)``, tokens in runs ``start + i``.

    The lower envelope of a few lines is evaluated at each run's two ends and
    its breakpoints; between them one line wins, and a line sums over integer
    contexts as ``count * (alpha + beta * mean context)``.
    """
    lo = starts
    hi = starts + counts - 1.0
    # Breakpoints of the envelope: where any two lines cross.
    cuts = [
        (alpha[j] - alpha[i]) / (beta[i] - beta[j])
        for i in range(len(alpha))
        for j in range(i + 1, len(alpha))
        if beta[i] != beta[j]
    ]
    edges = np.sort(np.asarray([c for c in cuts if c > 0], dtype=np.float64))
    total = 0.0
    left = lo
    for edge in [*edges, np.inf]:
        right = np.minimum(hi, np.floor(edge))
        n = right - left + 1.0
        mask = n > 0
        if mask.any():
            mid = (left[mask] + right[mask]) / 2.0
            values = alpha[:, None] + beta[:, None] * mid[None, :]  # one line wins on the piece
            total += float((n[mask] * values.min(axis=0)).sum())
        left = np.maximum(left, np.floor(edge) + 1.0)
    return total


def _iteration_share_cost(
    per_iteration: np.ndarray,
    kv: np.ndarray,
    cap: int,
    starts: np.ndarray,
    counts: np.ndarray,
) -> float:
    """Best lower bound on ``sum_tokens min_k per_iteration_k * max(1/cap, c/KV_k)``."""
    lambdas = np.ones(len(per_iteration))

    def value(lam: np.ndarray) -> float:
        alpha = per_iteration * lam / cap
        beta = per_iteration * (1.0 - lam) / kv
        return _envelope_sum(alpha, beta, starts, counts)

    best = value(lambdas)
    for _ in range(3):  # coordinate ascent: any lambda is valid, better ones are tighter
        for k in range(len(lambdas)):
            for lam in _LAMBDAS:
                trial = lambdas.copy()
                trial[k] = lam
                v = value(trial)
                if v > best:
                    best, lambdas = v, trial
    return best


def _profiled_work(
    perf: ProfiledPerfModel, tps: Sequence[int], tokens: float, context_sum: float, prefill: int
) -> float:
    """A measured engine's floor: each token at its cheapest batch and TP, prefill per token."""
    decode = min(perf.decode_work_floor(tokens, context_sum, tp) for tp in tps)
    per_prefill_token = min(tp * perf.profile.prefill[tp].per_token_s for tp in tps)
    return decode + prefill * per_prefill_token


def _roofline_work(
    perf: PerfModel,
    tps: Sequence[int],
    kv_shares: np.ndarray,
    counts: np.ndarray,
    context_sum: float,
    prefill_tokens: int,
) -> float:
    """GPU-seconds of the datasheet model (the module docstring's derivation).

    ``kv_shares``: each run's first token's least share of the KV cache (:func:`_runs`).
    """
    hw, model = perf.hardware, perf.model
    bandwidth = hw.hbm_bandwidth_gbps * 1e9 * hw.bandwidth_efficiency  # per GPU
    flops = hw.bf16_tflops * 1e12 * hw.compute_efficiency  # per GPU
    tokens = float(counts.sum())
    kv = np.asarray([perf.kv_capacity_tokens(tp) for tp in tps], dtype=np.float64)
    fixed = np.asarray([tp * perf._fixed_time(1, tp) for tp in tps], dtype=np.float64)
    weights = model.weight_bytes / bandwidth
    memory_side = (
        _iteration_share_cost(weights + fixed, kv, perf.batch_cap, kv_shares, counts)
        + context_sum * model.kv_bytes_per_token / bandwidth
    )
    compute_side = (
        _iteration_share_cost(fixed, kv, perf.batch_cap, kv_shares, counts)
        + 2.0 * model.params_billion * 1e9 * tokens / flops
        + 4.0 * model.num_layers * model.hidden_size * context_sum / flops
    )
    prefill = 2.0 * model.params_billion * 1e9 * prefill_tokens / flops
    return max(memory_side, compute_side) + prefill


def lower_bound(scripts: Sequence[TrajectoryScript], cluster: ClusterSpec) -> LowerBound:
    perf = cluster.perf_model()
    tps = [
        tp
        for tp in cluster.tensor_parallel_sizes
        if tp <= cluster.gpus and perf.kv_capacity_tokens(tp) > 0
    ]
    group_sizes: dict[str, int] = {}
    prompts: dict[str, int] = {}
    for s in scripts:
        group_sizes[s.group_id] = group_sizes.get(s.group_id, 0) + 1
        prompts[s.group_id] = min(s.prompt_tokens, prompts.get(s.group_id, s.prompt_tokens))
    starts, counts, kv_shares = _runs(scripts, group_sizes)
    tokens = float(counts.sum())
    context_sum = float((counts * starts + counts * (counts - 1.0) / 2.0).sum())
    prefill_tokens = sum(prompts.values()) + sum(sum(s.tool_output_tokens) for s in scripts)
    if isinstance(perf, ProfiledPerfModel):
        work = _profiled_work(perf, tps, tokens, context_sum, prefill_tokens) / cluster.gpus
    else:
        work = _roofline_work(perf, tps, kv_shares, counts, context_sum, prefill_tokens)
        work /= cluster.gpus
    # Only the longest trajectories (by tokens or by tool time) can decide the serial bound.
    by_tokens = sorted(scripts, key=lambda s: -s.total_tokens)[:32]
    by_tools = sorted(scripts, key=lambda s: -sum(s.tool_latency_s))[:32]
    serial = max(
        _serial_time(s, perf, tps, group_sizes[s.group_id] > 1)
        for s in {id(s): s for s in by_tokens + by_tools}.values()
    )
    return LowerBound(serial_s=serial, work_s=work)
