"""Several RL iterations in the simulator: rollouts, a trainer, weight versions, staleness.

One :class:`IterationSimulator` runs a stream of GRPO groups through the rollout
engines of :class:`~heddle.scheduler.sim.Simulator` (same engines, same
performance model) and a trainer that consumes finished groups, trains on them
for :meth:`TrainerModel.train_s` and pushes new weights. How it does so is an
:class:`IterationPolicy`:

- **colocated** (verl, slime, and Heddle): rollout and training share every GPU.
  An iteration's rollout stops when ``batch_groups`` groups have finished; the
  engines then pause for the training step and the switch between the two
  (``TrainerModel.colocated_switch_s``). Synchronous policies launch exactly one
  batch, so their rollout waits for its longest trajectory. Partial-rollout
  policies launch ``(1 + over_sample)`` batches' worth and carry what is
  unfinished at the quota into the next iteration.
- **disaggregated** (verl's fully-async recipe, AReaL): ``rollout_gpus`` run the
  engines without pause but for weight syncs; the rest train. Admission control
  bounds staleness: group ``n`` may start once ``n < (trained_versions + window)
  * batch_groups``.

A weight update interrupts every engine (:func:`interrupt_engine`): the steps in
flight recompute their context under the new weights, prefix caches are
dropped, and the engines pause for the sync. Every trajectory remembers the
version its first token came from; a trained group's staleness is the
trainer's version minus its oldest token's version. docs/async.md describes
the policies and the sources of every constant.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from heddle.exceptions import ConfigError, HeddleError

from .._cluster import ClusterSpec
from .._perf import ModelSpec
from .._policies import get_policy
from .._types import PoolShape, Trajectory, TrajectoryState
from .._versions import VersionAgedOrdering, take_oldest, unpinned, version_age
from .._workload import TrajectoryScript
from ._entities import SimEngine, SimTrajectory, drop_caches, interrupt_engine, requeue
from ._simulator import _MERGED, _MIGRATED, _PLANNED, _REPLAN, SimConfig, Simulator

__all__ = [
    "ITERATION_POLICIES",
    "IterationPolicy",
    "IterationResult",
    "IterationSimulator",
    "TrainerModel",
    "iteration_policy",
    "stream_of",
]

_RESUME, _TRAINED, _TRAINER_FREE = 100, 101, 102  # this module's own events
_OWN_EVENTS = {_RESUME: "resume", _TRAINED: "trained", _TRAINER_FREE: "trainer-free"}
_PLANNER_EVENTS = (_MIGRATED, _REPLAN, _PLANNED, _MERGED)


@dataclass(frozen=True)
class TrainerModel:
    """Seconds a GRPO training step takes, and what a weight update costs the rollout.

    Training throughput: ``tokens_per_s_per_gpu`` forward+backward tokens per GPU
    per second for a ``reference_params_billion`` model, scaled by parameter count
    (cost per token is ~6N FLOPs). Source: IBM's fms-fsdp README (github.com/
    foundation-model-stack/fms-fsdp), 13B, FSDP with selective activation
    checkpointing, 3,800 tokens/s/GPU on 96 H100s. A GRPO step also runs
    ``extra_forward_passes`` forward passes (the old policy's and the reference
    model's log-probs, as verl does by default), each a third of a
    forward+backward. Every token of a trajectory is trained on (prompt, output
    and tool replies go through the model; the loss mask only zeroes gradients).

    Weight sync (assumed, not measured; docs/async.md): disaggregated, the new
    weights cross the network at ``sync_gb_per_s`` after ``sync_fixed_s`` of
    pause/resume; colocated, each iteration pays ``colocated_switch_s`` to move
    from rollout to training memory and back (offload, reshard, wake-up).
    """

    tokens_per_s_per_gpu: float = 3800.0
    reference_params_billion: float = 13.0
    extra_forward_passes: int = 2
    sync_gb_per_s: float = 25.0
    sync_fixed_s: float = 2.0
    colocated_switch_s: float = 10.0

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not (value >= 0 and math.isfinite(value)):
                raise ConfigError(f"TrainerModel.{name}={value} must be a finite number >= 0")
        if self.tokens_per_s_per_gpu <= 0 or self.sync_gb_per_s <= 0:
            raise ConfigError("TrainerModel: tokens_per_s_per_gpu and sync_gb_per_s must be > 0")

    def seconds_per_token(self, model: ModelSpec, gpus: int) -> float:
        """Wall seconds per trained token on ``gpus`` GPUs (data parallel, linear)."""
        scale = model.params_billion / self.reference_params_billion
        passes = 1.0 + self.extra_forward_passes / 3.0
        return passes * scale / (self.tokens_per_s_per_gpu * gpus)

    def train_s(self, tokens: int, model: ModelSpec, gpus: int) -> float:
        return tokens * self.seconds_per_token(model, gpus)

    def sync_s(self, model: ModelSpec) -> float:
        return self.sync_fixed_s + model.weight_bytes / (self.sync_gb_per_s * 1e9)


@dataclass(frozen=True)
class IterationPolicy:
    """How rollouts and training interleave (module docstring); times in seconds."""

    name: str
    steps: str  # the step scheduling policy of the engines (heddle.scheduler policy name)
    colocated: bool
    description: str
    over_sample: float = 0.0  # colocated: extra groups launched, as a fraction of a batch
    window_batches: float = 1.0  # disaggregated: batches in flight ahead of the trainer
    trainer_chunks: int = 1  # disaggregated: mini-batches trained as they fill, per version
    rollout_gpus: int | None = None  # disaggregated: GPUs for the engines (the rest train)
    age_priority: bool = False  # steps of older-version trajectories run first
    rebalance_on_update: bool = False  # a trajectory whose KV an update voided may move
    wait_at_bound: bool = False  # hold the quota until no trajectory would pass the bound
    cap: int | None = None  # in-flight trajectories per engine (None: no cap)

    def __post_init__(self) -> None:
        if self.over_sample < 0 or self.window_batches < 1 or self.trainer_chunks < 1:
            raise ConfigError(
                f"{self.name}: over_sample must be >= 0, window_batches >= 1, trainer_chunks >= 1"
            )
        if not self.colocated and self.rollout_gpus is None:
            raise ConfigError(f"{self.name}: a disaggregated policy needs rollout_gpus")


# The seven policies of the comparison; iteration_policy() fills in the staleness bound.
ITERATION_POLICIES = (
    "verl",
    "verl-star",
    "slime",
    "verl-async",
    "areal",
    "slime-partial",
    "heddle",
)


def iteration_policy(
    name: str,
    max_staleness: int,
    *,
    rollout_gpus: int | None = None,
    cap: int | None = None,
    over_sample: float | None = None,
) -> IterationPolicy:
    """The named policy at a staleness bound (in weight versions), as its users run it."""
    if max_staleness < 0:
        raise ConfigError(f"max_staleness={max_staleness} must be >= 0")
    if name in ("verl", "verl-star", "slime"):
        return IterationPolicy(
            name, name, True, f"synchronous {name}: one batch, wait for its tail, train", cap=cap
        )
    if name in ("verl-async", "areal"):
        if rollout_gpus is None:
            raise ConfigError(f"{name} needs rollout_gpus (the rest of the pool trains)")
        if name == "verl-async":
            # recipe/fully_async_policy: the rollouter may run (1 + staleness_threshold)
            # batches ahead of a parameter sync (staleness_threshold <= 1 keeps samples at most
            # one sync old at its head), the trainer streams mini-batches (4 per sync here:
            # trigger_parameter_sync_step=4) and partial rollout resumes interrupted samples.
            return IterationPolicy(
                name,
                "verl",
                False,
                "verl fully-async: streamed mini-batches, (1+staleness_threshold) batches ahead",
                window_batches=1.0 + min(1.0, float(max_staleness)),
                trainer_chunks=4,
                rollout_gpus=rollout_gpus,
                cap=cap,
            )
        # AReaL: a new rollout starts only while (submitted - 1) / batch <= version + eta;
        # interruptible generation; the trainer takes a full batch in completion order.
        return IterationPolicy(
            name,
            "verl",  # requests of a trajectory stay on one server (its prefix cache)
            False,
            "AReaL: bounded staleness eta by admission control, interruptible generation",
            window_batches=1.0 + max_staleness,
            rollout_gpus=rollout_gpus,
            cap=cap,
        )
    if name == "slime-partial":
        # slime --partial-rollout --over-sampling-batch-size: launch more groups than the
        # batch, abort the rest when the batch is full, resume the partials first next time.
        return IterationPolicy(
            name,
            "slime",
            True,
            "slime partial rollout: over-sample, stop at the batch, carry partials",
            over_sample=0.5 if over_sample is None else over_sample,
            cap=cap,
        )
    if name == "heddle":
        # Steps as the shape planner runs them on these workloads (docs/benchmarks.md: it
        # falls back to verl's cache-aware routing), ordered oldest weight version first.
        return IterationPolicy(
            name,
            "verl",
            True,
            "Heddle: over-sample, stop at a quota of groups, carry the tail, oldest version first",
            over_sample=0.5 if over_sample is None else over_sample,
            age_priority=get_policy("heddle").version_age,
            rebalance_on_update=get_policy("heddle").version_age,
            wait_at_bound=True,
            cap=cap,
        )
    raise ConfigError(
        f"unknown iteration policy {name!r}; valid policies are {', '.join(ITERATION_POLICIES)}"
    )


def stream_of(draws: Sequence[Sequence[TrajectoryScript]]) -> list[list[TrajectoryScript]]:
    """GRPO groups, in order, from several draws of a workload (ids made unique per draw)."""
    groups: list[list[TrajectoryScript]] = []
    for k, scripts in enumerate(draws):
        by_group: dict[str, list[TrajectoryScript]] = {}
        for s in scripts:
            by_group.setdefault(s.group_id, []).append(
                replace(s, id=f"d{k}/{s.id}", group_id=f"d{k}/{s.group_id}")
            )
        groups.extend(by_group.values())
    return groups


@dataclass(frozen=True)
class IterationResult:
    """One policy over several iterations. Times in seconds, lengths in output tokens."""

    policy: str
    shape: str
    rollout_gpus: int
    trainer_gpus: int
    iterations: int
    max_staleness: int
    elapsed_s: float
    trained_samples: int
    trained_samples_per_s: float
    trained_mean_tokens: float
    trained_p90_tokens: float
    staleness_max: int
    staleness_mean: float
    samples_over_bound: int
    crossed_versions: int  # trained samples whose tokens came from more than one version
    recompute_tokens: int
    train_s: float  # trainer busy time, summed
    step_end_s: list[float] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


class IterationSimulator(Simulator):
    """The rollout simulator under a trainer: see the module docstring."""

    def __init__(
        self,
        groups: Sequence[Sequence[TrajectoryScript]],
        cluster: ClusterSpec,
        policy: IterationPolicy,
        *,
        batch_groups: int,
        iterations: int,
        max_staleness: int,
        tool_means_s: Mapping[str, float],
        rollout_tp: int,
        trainer: TrainerModel | None = None,
        history: Sequence[Any] = (),
    ) -> None:
        if batch_groups < 1 or iterations < 1:
            raise ConfigError("batch_groups and iterations must be >= 1")
        rollout_gpus = cluster.gpus if policy.colocated else policy.rollout_gpus
        assert rollout_gpus is not None
        if rollout_gpus % rollout_tp or not 0 < rollout_gpus <= cluster.gpus:
            raise ConfigError(
                f"{policy.name}: {rollout_gpus} rollout GPUs is not a whole number of TP"
                f"{rollout_tp} engines within the pool's {cluster.gpus} GPUs"
            )
        if not policy.colocated and rollout_gpus == cluster.gpus:
            raise ConfigError(f"{policy.name}: no GPU left for the trainer")
        scripts = [s for g in groups for s in g]
        super().__init__(
            scripts,
            cluster,
            get_policy(policy.steps),
            tool_means_s=tool_means_s,
            history=history,
            shape=PoolShape.of({rollout_tp: rollout_gpus // rollout_tp}),
            config=SimConfig(max_trajectories_per_engine=None),
        )
        self.iter_policy = policy
        self.trainer = trainer or TrainerModel()
        self.batch_groups = batch_groups
        self.iterations = iterations
        self.max_staleness = max_staleness
        self.rollout_gpus = rollout_gpus
        self.trainer_gpus = cluster.gpus if policy.colocated else cluster.gpus - rollout_gpus
        self.groups = [[s.id for s in g] for g in groups]
        self.group_of = {sid: gi for gi, g in enumerate(self.groups) for sid in g}
        self._left_in_group = [len(g) for g in self.groups]
        self._unfinished = {}  # only launched trajectories count (re-plans read them)
        self.launched_groups = 0
        self._backlog: deque[SimTrajectory] = deque()  # launched, waiting for an in-flight slot
        self._in_flight = 0
        limit = policy.cap * len(self.engines) if policy.cap else None
        self._flight_limit = limit
        self.first_version: dict[str, int] = {}
        self._unfinished_at: dict[int, int] = {}  # first version -> unfinished trajectories
        self.last_version: dict[str, int] = {}
        self.rollout_version = 0  # the weights the engines hold
        self.trained_versions = 0  # training steps done (the trainer's version)
        self.buffer: deque[int] = deque()  # finished groups, in completion order
        self.paused_until = 0.0
        self.trainer_busy = False
        self.trained_groups: list[tuple[int, int]] = []  # (group, trainer version at use)
        self.step_end_s: list[float] = []
        self.train_busy_s = 0.0
        self._chunks_this_version = 0
        self._rollout_phase = True  # colocated: False while training
        if policy.age_priority:  # older weight versions first, as the live session does
            self.ordering = VersionAgedOrdering(self.ordering, self._age)
            for engine in self.engines.values():
                engine.priority = self.ordering.priority

    def _age(self, traj: Trajectory) -> int:
        return version_age(self.first_version.get(traj.id), self.rollout_version)

    # -- launching ------------------------------------------------------------------
    def _launch_group(self, now: float) -> None:
        for sid in self.groups[self.launched_groups]:
            sim = self.sims[sid]
            self._unfinished[sid] = sim
            self._predict(sim)
            if self._flight_limit is not None and self._in_flight >= self._flight_limit:
                self._backlog.append(sim)
            else:
                self._start(sim, now)
        self.launched_groups += 1

    def _start(self, sim: SimTrajectory, now: float) -> None:
        self._in_flight += 1
        # Started while the engines load new weights: its first token comes from those.
        version = self.rollout_version + (1 if now < self.paused_until else 0)
        self.first_version[sim.id] = version
        self._unfinished_at[version] = self._unfinished_at.get(version, 0) + 1
        self._dispatch(sim, now)

    def _admit_groups(self, now: float) -> None:
        """Disaggregated admission control: stay ``window_batches`` ahead of the trainer."""
        policy = self.iter_policy
        allowed = math.floor((self.trained_versions + policy.window_batches) * self.batch_groups)
        while self.launched_groups < min(allowed, len(self.groups)):
            self._launch_group(now)

    def _fill_colocated(self, now: float) -> None:
        """Colocated: top the unfinished (launched, not finished) groups up to the target."""
        target = math.ceil(self.batch_groups * (1.0 + self.iter_policy.over_sample))
        unfinished = sum(1 for g in range(self.launched_groups) if self._left_in_group[g] > 0)
        for _ in range(target - unfinished):
            if self.launched_groups >= len(self.groups):
                raise ConfigError(
                    "the workload stream ran out of groups; draw more (more iterations of data)"
                )
            self._launch_group(now)

    # -- trajectories finishing -------------------------------------------------------
    def _step_done(self, sim: SimTrajectory, engine: SimEngine, now: float) -> None:
        super()._step_done(sim, engine, now)
        if sim.traj.state is not TrajectoryState.DONE:
            return
        self.last_version[sim.id] = self.rollout_version
        self._in_flight -= 1
        self._unfinished_at[self.first_version[sim.id]] -= 1
        if self._backlog:
            self._start(self._backlog.popleft(), now)
        g = self.group_of[sim.id]
        self._left_in_group[g] -= 1
        if self._left_in_group[g] == 0:
            self.buffer.append(g)
            self._group_finished(now)

    def _group_finished(self, now: float) -> None:
        if self.iter_policy.colocated:
            if self._rollout_phase and self._quota_met():
                self._start_training(now)
        else:
            self._maybe_train(now)

    def _group_version(self, g: int) -> int:
        return min(self.first_version[sid] for sid in self.groups[g])

    def _quota_met(self) -> bool:
        if len(self.buffer) < self.batch_groups:
            return False
        if not self.iter_policy.wait_at_bound:
            return True
        # Trained at version v + 1 next time, a trajectory begun at v - S would be S + 1 old.
        oldest_allowed = self.rollout_version - self.max_staleness + 1
        return not any(n for v, n in self._unfinished_at.items() if v < oldest_allowed)

    # -- the trainer -------------------------------------------------------------------
    def _take(self, groups: int) -> list[int]:
        if self.iter_policy.age_priority:  # the oldest finished groups first (bound-safe)
            # The live session's take too (rollout/_groups.py): one decision, take_oldest.
            finished = list(self.buffer)
            picks = take_oldest([self._group_version(g) for g in finished], groups)
            batch = [finished[k] for k in picks]
            taken = set(batch)
            self.buffer = deque(g for g in finished if g not in taken)
        else:
            batch = [self.buffer.popleft() for _ in range(groups)]
        self.trained_groups += [(g, self.trained_versions) for g in batch]
        return batch

    def _tokens(self, batch: Sequence[int]) -> int:
        total = 0
        for g in batch:
            for sid in self.groups[g]:
                s = self.sims[sid].script
                total += s.prompt_tokens + s.total_tokens + sum(s.tool_output_tokens)
        return total

    def _train_s(self, batch: Sequence[int]) -> float:
        return self.trainer.train_s(self._tokens(batch), self.perf.model, self.trainer_gpus)

    def _start_training(self, now: float) -> None:
        """Colocated: the rollout stops at the quota; train on every GPU; switch back."""
        self._rollout_phase = False
        batch = self._take(self.batch_groups)
        train = self.trainer.train_s(
            self._tokens(batch), self.cluster.perf_model().model, self.trainer_gpus
        )
        self.train_busy_s += train
        self._pause_engines(now, train + self.trainer.colocated_switch_s)

    def _maybe_train(self, now: float) -> None:
        """Disaggregated: train a mini-batch as soon as one is in the buffer."""
        chunk = math.ceil(self.batch_groups / self.iter_policy.trainer_chunks)
        if self.trainer_busy or len(self.buffer) < chunk:
            return
        if len(self.step_end_s) >= self.iterations:
            return
        batch = self._take(chunk)
        train = self.trainer.train_s(
            self._tokens(batch), self.cluster.perf_model().model, self.trainer_gpus
        )
        self.trainer_busy = True
        self.train_busy_s += train
        self._push(now + train, _TRAINED, "")

    def _trained(self, now: float) -> None:
        self._chunks_this_version += 1
        if self._chunks_this_version < self.iter_policy.trainer_chunks:
            self.trainer_busy = False
            self._maybe_train(now)
            return
        self._chunks_this_version = 0
        # A new version: the trainer sends it (busy meanwhile), the engines pause to load it.
        self.trained_versions += 1
        sync = self.trainer.sync_s(self.perf.model)
        self._pause_engines(now, sync)
        self._push(now + sync, _TRAINER_FREE, "")  # the trainer is free again
        self.step_end_s.append(now)
        self._admit_groups(now)

    # -- weight updates -------------------------------------------------------------------
    def _pause_engines(self, now: float, pause_s: float) -> None:
        # No engine admits a step from here on, even one a finishing trajectory routes to it.
        for engine in self.engines.values():
            engine.draining = True
        for engine in self.engines.values():
            for sim in interrupt_engine(engine, now):
                self._step_done(sim, engine, now)
        for engine in self.engines.values():
            drop_caches(engine)
        self.paused_until = now + pause_s
        self._push(self.paused_until, _RESUME, "")

    def _resume(self, now: float) -> None:
        self.rollout_version += 1
        if self.iter_policy.colocated:
            self.trained_versions += 1
            self.step_end_s.append(now)
            self._rollout_phase = True
        rebalance = self.iter_policy.rebalance_on_update
        voided = self.rollout_version - 1  # every engine dropped the KV of that version
        for engine in self.engines.values():
            engine.draining = False
            if rebalance:
                # Its KV is gone: the next step of a waiting trajectory may go anywhere.
                for sim in list(engine.waiting.values()):
                    # Re-routed mid-turn: enqueue, not _dispatch (that would restart the turn).
                    engine.waiting.pop(sim.id)
                    engine._load_changed()
                    sim.traj.instance = unpinned(sim.traj.instance, voided, self.rollout_version)
                    self.engines[self.placement.route(sim.traj, self._view())].enqueue(sim, now)
        for engine in self.engines.values():
            requeue(engine)
        if rebalance:
            for sim in self._unfinished.values():
                if sim.traj.state is TrajectoryState.IN_TOOL:
                    sim.traj.instance = unpinned(sim.traj.instance, voided, self.rollout_version)
        for engine in self.engines.values():
            self._kick(engine, now, arrival=False)
        if self.iter_policy.colocated and len(self.step_end_s) < self.iterations:
            self._fill_colocated(now)
            if self._quota_met():  # enough finished groups were already waiting
                self._start_training(now)

    # -- the run ---------------------------------------------------------------------
    def run_iterations(self, progress: Callable[[int, int], None] | None = None) -> IterationResult:
        """Simulate until the trainer has taken ``iterations`` steps."""
        now = 0.0
        if self.iter_policy.colocated:
            self._fill_colocated(now)
        else:
            self._admit_groups(now)
        now, _ = self._run_events(
            now,
            lambda: len(self.step_end_s),
            self.iterations,
            lambda now: (
                f"{self.iter_policy.name}: simulation stalled at t={now:.1f}s after "
                f"{len(self.step_end_s)} training steps; this is a bug in the simulator"
            ),
            progress,
        )
        return self._result(now)

    def _event_name(self, kind: int) -> str:
        return _OWN_EVENTS.get(kind) or super()._event_name(kind)

    def _handle(self, now: float, kind: int, key: str, version: int) -> None:
        if kind == _RESUME:
            if now >= self.paused_until:
                self._resume(now)
        elif kind == _TRAINED:
            self._trained(now)
        elif kind == _TRAINER_FREE:
            self.trainer_busy = False
            self._maybe_train(now)
        elif kind in _PLANNER_EVENTS:  # the step policies used here make none
            raise HeddleError(f"unexpected event {kind} in the iteration simulator")
        else:
            super()._handle(now, kind, key, version)

    def _result(self, now: float) -> IterationResult:
        elapsed = self.step_end_s[self.iterations - 1]
        used = self.trained_groups
        lengths = np.array(
            [self.sims[sid].script.total_tokens for g, _ in used for sid in self.groups[g]],
            dtype=np.float64,
        )
        staleness = [v - min(self.first_version[sid] for sid in self.groups[g]) for g, v in used]
        crossed = sum(
            1
            for g, _ in used
            for sid in self.groups[g]
            if self.last_version[sid] != self.first_version[sid]
        )
        first_prefill = sum(
            s.script.prompt_tokens + sum(s.script.tool_output_tokens)
            for s in self.sims.values()
            if s.id in self.first_version
        )
        prefilled = sum(s.prefill_tokens + s.shared_prompt_tokens for s in self.sims.values())
        samples = int(lengths.size)
        policy = self.iter_policy
        return IterationResult(
            policy=policy.name,
            shape=str(self.shape),
            rollout_gpus=self.rollout_gpus,
            trainer_gpus=self.trainer_gpus,
            iterations=self.iterations,
            max_staleness=self.max_staleness,
            elapsed_s=elapsed,
            trained_samples=samples,
            trained_samples_per_s=samples / elapsed if elapsed > 0 else math.inf,
            trained_mean_tokens=float(lengths.mean()),
            trained_p90_tokens=float(np.percentile(lengths, 90)),
            staleness_max=max(staleness),
            staleness_mean=float(np.mean(staleness)),
            samples_over_bound=sum(
                len(self.groups[g])
                for (g, _), s in zip(used, staleness, strict=True)
                if s > self.max_staleness
            ),
            crossed_versions=crossed,
            recompute_tokens=max(0, prefilled - first_prefill),
            train_s=self.train_busy_s,
            step_end_s=list(self.step_end_s),
            config={
                "steps": policy.steps,
                "colocated": policy.colocated,
                "over_sample": policy.over_sample,
                "window_batches": policy.window_batches,
                "trainer_chunks": policy.trainer_chunks,
                "cap": policy.cap,
                "description": policy.description,
            },
        )
