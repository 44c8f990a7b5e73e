"""Speculative decoding decisions: acceptance models, K per engine, group co-location.

Three decisions, shared by the simulator now and the live session and worker:

* **Acceptance** (:class:`AcceptanceModel`): expected output tokens per decode
  step for a request, from the drafting method, K, which texts its engine's
  suffix tree holds (its own, how many GRPO siblings, how many earlier samples
  of the task) and its position in the output. Fitted on exact replays of
  recorded outputs (:func:`fit_acceptance`) or a cited preset
  (:data:`ACCEPTANCE_PRESETS`, docs/speculation.md).
* **K** (:func:`choose_k`, :func:`k_by_batch_size`): the number of drafts that
  maximises tokens per second for an engine's batch under the performance
  model; 0 (off) wherever verifying drafts would not beat a plain step, so an
  engine is never slower than it would be without speculation.
  :func:`k_by_batch_size` is the batch-size -> K table a vLLM worker takes
  (``num_speculative_tokens_per_batch_size``-style); :func:`auto_k_table` is the one
  a worker builds for a pool's ``auto`` (and the simulator's Heddle runs take).
* **Co-location** (:func:`plan_group_colocation`): whether putting each GRPO
  group on one engine pays — the siblings' acceptance gain against the
  imbalance of whole groups per engine, both predicted (the closed form; the
  simulator judges it further, sim/_spec_plan.py).
* **Seeding** (:func:`seed_pays`, asked through :func:`seed_text_pays` by the
  simulator and the live session alike): whether inserting a sibling's or an
  earlier iteration's text into an engine's suffix cache (``POST /v1/drafts``)
  saves the engine more time than the insertion costs it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from heddle.exceptions import ConfigError

from ._perf import PerfModel
from ._replay import SampleReplay

__all__ = [
    "ACCEPTANCE_PRESETS",
    "AUTO_ACCEPTANCE",
    "AUTO_CONTEXT_TOKENS",
    "AUTO_MAX_K",
    "AUTO_SIBLINGS",
    "HEDDLE_SPECULATION",
    "METHODS",
    "SEED_S_PER_TOKEN",
    "AcceptanceModel",
    "ColocationPlan",
    "SeedQuery",
    "SpeculationConfig",
    "acceptance_model",
    "auto_context_tokens",
    "auto_k_table",
    "choose_k",
    "fit_acceptance",
    "geometric_tokens_per_step",
    "k_by_batch_size",
    "k_table_ranges",
    "plan_group_colocation",
    "seed_pays",
    "seed_text_pays",
    "sensitivity_model",
    "unseeded_history",
]

METHODS = ("off", "ngram", "suffix")
# Inserting a text into arctic-inference's suffix cache (depth 24) cost 5.4 us per token,
# measured here on 400,000 random tokens (docs/speculation.md, "Seeding"); the engine's
# loop runs the insertion between steps, so the engine waits for it.
SEED_S_PER_TOKEN: Final = 5.4e-6
K_CHOICES = (1, 2, 3, 4, 5, 6, 7, 8)
# What a worker's ``auto`` table is built on (:func:`auto_k_table`). A worker knows no
# job's acceptance when it starts, so it takes our own measurement (SmolLM2-135M at
# T=1.0: the table errs towards speculating less), a GRPO group's 15 siblings in its
# tree (the session feeds them), this context per running sequence, and K up to 4.
AUTO_ACCEPTANCE: Final = "pessimistic"
AUTO_CONTEXT_TOKENS: Final = 1024
AUTO_SIBLINGS: Final = 15
AUTO_MAX_K: Final = 4  # K when none is given: vLLM's own examples use 3-5


@dataclass(frozen=True)
class SpeculationConfig:
    """How an engine speculates: ``method`` and a fixed K (``num_speculative_tokens``),
    or ``None`` for K chosen by batch size (:func:`choose_k`, Heddle's ``auto``)."""

    method: str = "off"
    num_speculative_tokens: int | None = 4

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(
                f"speculation.method={self.method!r} is not one of {', '.join(METHODS)}"
            )
        k = self.num_speculative_tokens
        if k is not None and not 1 <= k <= 16:
            raise ConfigError(
                f"speculation.num_speculative_tokens={k} must be between 1 and 16 "
                "(or omitted for K by batch size)"
            )

    @property
    def enabled(self) -> bool:
        return self.method != "off"

    def label(self) -> str:
        if not self.enabled:
            return "off"
        k = "auto" if self.num_speculative_tokens is None else str(self.num_speculative_tokens)
        return f"{self.method}-k{k}"


# Heddle's own: vLLM's suffix method, K by batch size, groups co-located where it pays.
HEDDLE_SPECULATION = SpeculationConfig("suffix", None)


def geometric_tokens_per_step(alpha: float, k: int) -> float:
    """Tokens per step when each draft token is accepted with probability ``alpha``
    given the previous one was: ``1 + alpha + ... + alpha^k``."""
    if k <= 0:
        return 1.0
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


@dataclass(frozen=True)
class AcceptanceModel:
    """Tokens per decode step by method, K, drafting corpus and output position.

    ``table[(method, source)][k]`` gives tokens per step in each position bucket
    (``position_edges``: bucket ``i`` holds positions ``< edges[i]``, the last
    everything after). Sources: ``own`` (the request's text, or n-gram),
    ``siblings`` (its whole GRPO group of ``group_size`` in the engine's tree),
    ``history`` (``history_samples`` finished earlier samples of the task, no
    siblings). Fewer siblings interpolate by ``sibling_curve[n]``: the share of the
    siblings' gain that ``n`` co-located siblings give (measured by replay;
    log-shaped when unmeasured); fewer history samples linearly; more of either
    than measured gets no extra credit, and both together the better of the two.
    """

    name: str
    source_note: str
    temperature: float
    position_edges: tuple[int, ...]
    table: Mapping[tuple[str, str], Mapping[int, tuple[float, ...]]]
    group_size: int = 16
    history_samples: int = 16
    sibling_curve: tuple[float, ...] = ()

    def _bucket(self, position: float) -> int:
        for i, edge in enumerate(self.position_edges):
            if position < edge:
                return i
        return len(self.position_edges)

    def _at(self, method: str, source: str, k: int, position: float) -> float:
        by_k = self.table.get((method, source))
        if by_k is None:
            raise ConfigError(f"acceptance model {self.name!r} has no {method}/{source} entry")
        ks = sorted(by_k)
        b = self._bucket(position)
        if k in by_k:
            return by_k[k][b]
        if k <= ks[0]:
            # Below the smallest measured K: scale the gain down linearly (K=0 is 1.0).
            return 1.0 + (by_k[ks[0]][b] - 1.0) * k / ks[0]
        if k >= ks[-1]:
            return by_k[ks[-1]][b]  # more drafts than measured: no extra credit
        lo = max(x for x in ks if x < k)
        hi = min(x for x in ks if x > k)
        w = (k - lo) / (hi - lo)
        return by_k[lo][b] * (1 - w) + by_k[hi][b] * w

    def sibling_share(self, siblings: int) -> float:
        """Share of the full group's gain that ``siblings`` co-located siblings give."""
        if siblings <= 0:
            return 0.0
        top = self.group_size - 1
        if siblings >= top:
            return 1.0
        if self.sibling_curve and siblings < len(self.sibling_curve):
            return self.sibling_curve[siblings]
        return math.log2(1 + siblings) / math.log2(1 + top)

    def tokens_per_step(
        self,
        method: str,
        k: int,
        *,
        siblings: int = 0,
        history: float = 0.0,
        position: float = 0.0,
    ) -> float:
        """Expected output tokens per decode step (1.0 with no speculation). ``history``
        may be fractional: an expected count (:func:`unseeded_history`), exact since the
        credit is linear in it up to ``history_samples``."""
        if method == "off" or k <= 0:
            return 1.0
        if method == "ngram":
            return self._at("ngram", "own", k, position)
        own = self._at("suffix", "own", k, position)
        tau = own
        if siblings > 0:
            full = self._at("suffix", "siblings", k, position)
            tau = own + (full - own) * self.sibling_share(siblings)
        if history > 0:
            # Measured without siblings; both together are credited the better of the two.
            hist = self._at("suffix", "history", k, position)
            tau = max(tau, own + (hist - own) * min(1.0, history / self.history_samples))
        return max(1.0, tau)


def _geometric_model(
    name: str, note: str, alphas: Mapping[tuple[str, str], float], temperature: float = 1.0
) -> AcceptanceModel:
    table = {
        key: {k: (geometric_tokens_per_step(a, k),) for k in K_CHOICES} for key, a in alphas.items()
    }
    return AcceptanceModel(name, note, temperature, (), table)


def _alpha_for(tokens_per_step: float, k: int) -> float:
    """The geometric per-draft acceptance that gives ``tokens_per_step`` at ``k``."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if geometric_tokens_per_step(mid, k) < tokens_per_step:
            lo = mid
        else:
            hi = mid
    return lo


# Presets for workloads without token traces (docs/speculation.md, "Acceptance presets").
ACCEPTANCE_PRESETS: dict[str, AcceptanceModel] = {
    # Per-draft acceptance rates chosen to reproduce published end-to-end gains of
    # speculation in RL rollouts: Seer (arXiv 2511.14617) +26-48% from grouped
    # (sibling) drafts over its own baseline; RhymeRL (arXiv 2508.18588) ~1.5x
    # from history drafts. A geometric acceptance of 0.30 / 0.50 / 0.55 gives
    # 1.43 / 1.94 / 2.07 tokens per step at K=4: not a measurement of ours.
    "default": _geometric_model(
        "default",
        "calibrated to Seer (+26-48% grouped speculation) and RhymeRL (~1.5x history)",
        {
            ("ngram", "own"): 0.25,
            ("suffix", "own"): 0.30,
            ("suffix", "siblings"): 0.50,
            ("suffix", "history"): 0.55,
        },
    ),
    # Our own SmolLM2-135M measurement at T=1.0 (issue 26): ngram 1.11, suffix on
    # own text 1.14, with 15 siblings 1.29, with 16 earlier samples 1.32 tokens per
    # step, taken at K=4 and spread over K as a geometric acceptance (0.10, 0.12,
    # 0.23, 0.24 per draft token).
    "pessimistic": _geometric_model(
        "pessimistic",
        "SmolLM2-135M-Instruct at T=1.0, 24 prompts x 16 samples (issue 26), at K=4",
        {
            ("ngram", "own"): _alpha_for(1.11, 4),
            ("suffix", "own"): _alpha_for(1.14, 4),
            ("suffix", "siblings"): _alpha_for(1.29, 4),
            ("suffix", "history"): _alpha_for(1.32, 4),
        },
    ),
}


def sensitivity_model(tokens_per_step: float) -> AcceptanceModel:
    """A what-if model for the sensitivity table: ``tokens_per_step`` at K=4 for a
    request with its siblings (and history) in its engine's tree, half the gain on its
    own text or n-gram drafts; geometric in K."""
    if not 1.0 <= tokens_per_step <= 4.9:
        raise ConfigError(f"tokens per step {tokens_per_step} must be between 1.0 and 4.9")
    own = 1.0 + (tokens_per_step - 1.0) / 2.0
    full = _alpha_for(tokens_per_step, 4)
    half = _alpha_for(own, 4)
    return _geometric_model(
        f"tau:{tokens_per_step:g}",
        f"what-if: {tokens_per_step:g} tokens per step with siblings at K=4, {own:g} without",
        {
            ("ngram", "own"): half,
            ("suffix", "own"): half,
            ("suffix", "siblings"): full,
            ("suffix", "history"): full,
        },
    )


def acceptance_model(name: str) -> AcceptanceModel:
    """A preset by name, or ``tau:X`` (:func:`sensitivity_model`)."""
    model = ACCEPTANCE_PRESETS.get(name)
    if model is not None:
        return model
    prefix, _, value = name.partition(":")
    try:
        if prefix == "tau":
            return sensitivity_model(float(value))
    except ValueError:
        pass
    raise ConfigError(
        f"acceptance {name!r}: use one of {', '.join(ACCEPTANCE_PRESETS)}, or tau:X for X "
        "tokens per step with siblings (1.0 to 4.9), e.g. tau:2.0"
    )


def fit_acceptance(
    replays: Mapping[tuple[str, str, int], Sequence[SampleReplay]],
    *,
    name: str,
    source_note: str,
    temperature: float,
    position_edges: tuple[int, ...] = (32, 64, 128),
    sibling_curve: tuple[float, ...] = (),
    group_size: int = 16,
    history_samples: int = 16,
) -> AcceptanceModel:
    """The parametric model from exact replays keyed ``(method, source, k)``.

    Per position bucket: output tokens over decode steps of every replayed step
    whose first token falls in it (the steps' own emitted counts).
    """
    table: dict[tuple[str, str], dict[int, tuple[float, ...]]] = {}
    buckets = len(position_edges) + 1
    for (method, source, k), runs in replays.items():
        tokens = [0.0] * buckets
        steps = [0] * buckets
        for run in runs:
            pos = 1  # the prefill produced token 0
            for emitted in run.emitted:
                b = next((i for i, e in enumerate(position_edges) if pos < e), buckets - 1)
                tokens[b] += emitted
                steps[b] += 1
                pos += emitted
        values = []
        for b in range(buckets):
            if steps[b]:
                values.append(tokens[b] / steps[b])
            else:
                values.append(values[-1] if values else 1.0)
        table.setdefault((method, source), {})[k] = tuple(values)
    return AcceptanceModel(
        name,
        source_note,
        temperature,
        position_edges,
        table,
        group_size,
        history_samples,
        sibling_curve,
    )


def choose_k(
    perf: PerfModel,
    tp: int,
    batch: int,
    context_tokens: float,
    tokens_per_step: Callable[[int], float],
    ks: Sequence[int] = K_CHOICES,
    margin: float = 0.02,
) -> int:
    """K that maximises tokens per second for this batch; 0 (off) unless it beats plain
    decode by ``margin`` (the model's own error should not turn speculation on).

    ``tokens_per_step(k)`` is the batch's expected tokens per sequence per step.
    """
    if batch <= 0:
        return 0
    plain = 1.0 / perf.iteration_time(batch, context_tokens, tp)
    best_k, best_rate = 0, plain * (1.0 + margin)
    for k in ks:
        rate = tokens_per_step(k) / perf.iteration_time(batch, context_tokens, tp, k)
        if rate > best_rate:
            best_k, best_rate = k, rate
    return best_k


def k_by_batch_size(
    perf: PerfModel,
    tp: int,
    context_per_sequence: float,
    tokens_per_step: Callable[[int], float],
    max_batch: int | None = None,
    ks: Sequence[int] = K_CHOICES,
) -> tuple[tuple[int, int], ...]:
    """The batch-size -> K table for a vLLM worker's ``auto`` speculation.

    ``((up_to_batch, k), ...)`` in increasing batch size: batches of at most
    ``up_to_batch`` sequences use ``k`` drafts (0: off) — from :func:`choose_k` at
    every size up to ``max_batch`` (the engine's batch cap), runs of equal K merged.
    """
    top = perf.batch_cap if max_batch is None else max_batch
    rows: list[tuple[int, int]] = []
    for b in range(1, top + 1):
        k = choose_k(perf, tp, b, b * context_per_sequence, tokens_per_step, ks)
        if rows and rows[-1][1] == k:
            rows[-1] = (b, k)
        else:
            rows.append((b, k))
    return tuple(rows)


def auto_context_tokens(max_model_len: int | None) -> float:
    """Context per running sequence an ``auto`` table is built at: :data:`AUTO_CONTEXT_TOKENS`,
    or half the model length where that is shorter."""
    return float(min(AUTO_CONTEXT_TOKENS, (max_model_len or 2 * AUTO_CONTEXT_TOKENS) // 2))


def auto_k_table(
    perf: PerfModel,
    tp: int,
    method: str,
    *,
    max_num_seqs: int,
    max_model_len: int | None = None,
    max_k: int = AUTO_MAX_K,
) -> tuple[tuple[int, int], ...]:
    """The ``((up_to_batch, K), ...)`` table a worker started with ``auto`` speculation
    drafts by (heddle.worker, ``auto_speculation``): :func:`k_by_batch_size` on
    :data:`AUTO_ACCEPTANCE` with :data:`AUTO_SIBLINGS` siblings (suffix; none for
    n-gram), at :data:`AUTO_CONTEXT_TOKENS` per sequence or half ``max_model_len``
    where shorter, K in ``1..max_k``. The simulator's Heddle runs take this very table:
    no worker builds its table on the acceptance a run will see."""
    context = auto_context_tokens(max_model_len)
    acceptance = ACCEPTANCE_PRESETS[AUTO_ACCEPTANCE]
    siblings = AUTO_SIBLINGS if method == "suffix" else 0

    def tokens_per_step(k: int) -> float:
        return acceptance.tokens_per_step(method, k, siblings=siblings)

    ks = tuple(range(1, max_k + 1))
    return k_by_batch_size(perf, tp, context, tokens_per_step, max_num_seqs, ks)


def k_table_ranges(table: Sequence[tuple[int, int]]) -> tuple[tuple[int, int, int], ...]:
    """``((up_to_batch, K), ...)`` as the ``((first, last, K), ...)`` ranges a worker
    and vLLM take (``num_speculative_tokens_per_batch_size``)."""
    ranges, first = [], 1
    for last, k in table:
        ranges.append((first, last, k))
        first = last + 1
    return tuple(ranges)


@dataclass(frozen=True)
class ColocationPlan:
    """Whether whole GRPO groups share an engine, and where each group goes."""

    colocate: bool
    assignment: Mapping[str, int] = field(default_factory=dict)  # group -> engine index
    predicted_colocated_s: float = 0.0
    predicted_scattered_s: float = 0.0


def plan_group_colocation(
    groups: Mapping[str, Sequence[float]],
    engines: int,
    seconds_per_token: float,
    tokens_per_step_colocated: float,
    tokens_per_step_scattered: float,
) -> ColocationPlan:
    """Co-locate groups when the predicted makespan with whole groups per engine
    (greedy longest-group-first onto the least loaded engine, each engine's work at
    the co-located acceptance) beats the makespan scattered (work spread evenly, at
    the scattered acceptance). Both include the longest trajectory's own time: a
    long group on one engine becomes the tail.

    ``groups`` maps a group to its trajectories' predicted remaining tokens;
    ``seconds_per_token`` is the per-token time of a loaded engine.
    """
    if engines <= 0 or not groups:
        return ColocationPlan(False)
    loads = [0.0] * engines
    assignment: dict[str, int] = {}
    order = sorted(groups, key=lambda g: (-sum(groups[g]), g))
    for g in order:
        i = min(range(engines), key=lambda e: (loads[e], e))
        loads[i] += sum(groups[g])
        assignment[g] = i
    longest = max((max(v) for v in groups.values() if v), default=0.0)
    total = sum(loads)
    # Per engine, work divides among its batch; the longest trajectory bounds it below.
    co = max(max(loads) / max(1.0, total / engines), 1.0) * total / engines
    co_s = max(co, longest) * seconds_per_token / tokens_per_step_colocated
    sc_s = max(total / engines, longest) * seconds_per_token / tokens_per_step_scattered
    return ColocationPlan(co_s < sc_s, assignment if co_s < sc_s else {}, co_s, sc_s)


def seed_pays(
    perf: PerfModel,
    tp: int,
    batch: int,
    context_tokens: float,
    *,
    insert_tokens: float,
    seconds_per_inserted_token: float,
    remaining_tokens: float,
    tokens_per_step_before: float,
    tokens_per_step_after: float,
    k: int = 4,
    margin: float = 1.5,
) -> bool:
    """Whether inserting ``insert_tokens`` into an engine's suffix cache pays.

    The engine's loop spends ``insert_tokens * seconds_per_inserted_token`` on it. The
    gain: the requests it helps (``remaining_tokens`` predicted still to generate on this
    engine) advance ``tokens_per_step_after`` instead of ``..._before`` per step, and
    each of their tokens costs the engine ``iteration_time / batch`` per step it
    takes. At a full batch a step's time is shared by many requests and an insertion
    rarely pays; in the tail (few requests, memory-bound) it pays most. The saving
    must exceed the cost ``margin`` times: it rests on two predictions (the remaining
    length and the acceptance), and at 1.0 the insertions cost more than they saved on
    the flat workload at 8,192 trajectories (docs/speculation.md, the findings).
    """
    if batch <= 0 or insert_tokens <= 0 or tokens_per_step_after <= tokens_per_step_before:
        return False
    per_request_step = perf.iteration_time(batch, context_tokens, tp, k) / batch
    saved = (
        remaining_tokens
        * per_request_step
        * (1.0 / tokens_per_step_before - 1.0 / tokens_per_step_after)
    )
    return saved > margin * insert_tokens * seconds_per_inserted_token


@dataclass(frozen=True)
class SeedQuery:
    """What one seeding decision reads: the engine now, the text, and the group there.

    ``batch`` and ``context_tokens``: the engine's running requests and the KV they
    hold; ``k``: the K it drafts with at that batch (0: not drafting); ``members``:
    requests of the text's group running there, ``remaining_tokens`` their predicted
    remaining output; ``siblings_held``: siblings whose text the engine's tree holds
    now (served there or inserted, less the request itself), ``siblings_after`` with
    this text; ``history_held`` / ``history_after``: earlier samples of the task it
    holds before / after (0 for a sibling's text) by insertion; ``history_unseeded``:
    those it holds anyway, on average (:func:`unseeded_history`).
    """

    tp: int
    batch: int
    context_tokens: float
    k: int
    insert_tokens: float
    members: int
    remaining_tokens: float
    siblings_held: int
    siblings_after: int
    history_held: int = 0
    history_after: int = 0
    history_unseeded: float = 0.0


def unseeded_history(group_size: int, engines: int) -> float:
    """Earlier samples of a task an engine's suffix cache holds without insertions, on
    average: the previous iteration's routing put the task's ``group_size`` samples
    somewhere in the pool, chosen afresh (where its groups went was not remembered), so
    each engine holds ``group_size / engines`` of them whether this iteration keeps the
    group whole there or scatters it. A group kept whole holds all of them one time in
    ``engines``, none otherwise; the acceptance model is linear in history below its
    measured count, so the expectation is the exact mean."""
    return group_size / max(1, engines)


def seed_text_pays(
    perf: PerfModel,
    query: SeedQuery,
    tokens_per_step: Callable[[int, int, float], float],
    *,
    seconds_per_inserted_token: float = SEED_S_PER_TOKEN,
) -> bool:
    """:func:`seed_pays` for one text, the acceptance before and after it read from
    ``tokens_per_step(k, siblings, history)`` (the acceptance model at the output's
    start). The one question the simulator's engines and the live session's drafts
    feed ask before an insertion. The history credited before is what the engine
    holds without insertions on average (``history_unseeded``), or what was inserted."""
    if query.members <= 0 or query.k <= 0:
        return False  # nothing there to help, or the engine does not draft at this batch
    here = query.siblings_held
    held = max(query.history_unseeded, float(query.history_held))
    before = tokens_per_step(query.k, here, held)
    after = tokens_per_step(query.k, query.siblings_after, max(held, query.history_after))
    return seed_pays(
        perf,
        query.tp,
        query.batch,
        query.context_tokens,
        insert_tokens=query.insert_tokens,
        seconds_per_inserted_token=seconds_per_inserted_token,
        remaining_tokens=query.remaining_tokens,
        tokens_per_step_before=before,
        tokens_per_step_after=after,
        k=query.k,
    )
