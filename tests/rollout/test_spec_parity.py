"""The live session takes the simulator's speculation decisions (issue 26, docs/speculation.md).

Seeding: a real session on two sim worker processes over HTTP feeds the engines'
suffix caches through a :class:`DraftsFeed` with the session's :class:`SeedGate`;
every insertion it decided is asked again of the simulator's own
:class:`EngineSpeculator` on the same question, and the texts that reached each
worker are exactly those the decisions let through. Co-location: the live decision
(``live_colocation``, what ``heddle run`` and ``build_session`` call) and a
:class:`Simulator` run of the same job take the same verdict, for the same reason.
"""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from heddle.api import SamplingSpec
from heddle.rollout import (
    ColocationVerdict,
    DraftCorpus,
    DraftsFeed,
    DraftText,
    LocalPool,
    OutputSink,
    RolloutSession,
    SeedGate,
    SessionConfig,
    SyntheticEnvironment,
    build_session,
    live_colocation,
    load_workload,
    perf_model_for,
    prepare_job,
    synthetic_tasks,
)
from heddle.rollout._colocation import sim_speculation_for
from heddle.rollout._decide import plan_pool
from heddle.scheduler import (
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    FinishedTrajectory,
    PerfModel,
    PredictorConfig,
    Trajectory,
    get_policy,
    make_placement,
    make_predictor,
)
from heddle.scheduler.sim import (
    EngineSpeculator,
    GroupStickyPlacement,
    SimConfig,
    Simulator,
    planner_cluster,
    workload_sketch,
)
from heddle.worker import Speculation, WorkerEndpoint

from .._rollout_fixtures import read_records

ROOT = Path(__file__).resolve().parents[2]
PERF = PerfModel(MODEL_PRESETS["qwen3-8b"], HARDWARE_PRESETS["h100-sxm"])
# What a suffix-decoding worker's /v1/state says (the sim engine itself does not draft).
STATE = {"speculation": {"method": "suffix", "num_speculative_tokens": 4}, "tp": 1}
# An earlier iteration's four answers of two tasks (runs of one token, unlike the sim
# engine's bytes): short ones for the first task, long ones (costlier to insert) for the
# second.
HISTORY = [[(7 + s,) * 20 for s in range(4)], [(11 + s,) * 800 for s in range(4)]]
HISTORY_TEXTS = {text for task in HISTORY for text in task}


class _Seen:
    """A worker's client as the feed sees it: /v1/state says suffix decoding at K=4;
    each POST /v1/drafts is recorded and forwarded to the real worker."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.texts: list[tuple[str, tuple[int, ...]]] = []  # (task, text)

    async def state(self) -> dict[str, Any]:
        return STATE

    async def seed_drafts(
        self, job: str, task_id: str, texts: Sequence[Sequence[int]], *, timeout: float = 10.0
    ) -> int:
        self.texts.extend((task_id, tuple(t)) for t in texts)
        return int(await self.client.seed_drafts(job, task_id, texts, timeout=timeout))


class _Feed(DraftsFeed):
    def __init__(self, job: str, corpus: DraftCorpus, gate: SeedGate | None) -> None:
        super().__init__(job, corpus, gate=gate)
        self.seen: dict[str, _Seen] = {}

    async def run(self, client_for: Callable[[str], Any]) -> None:
        def wrapped(name: str) -> _Seen | None:
            client = client_for(name)
            if client is None:
                return None
            return self.seen.setdefault(name, _Seen(client))

        await super().run(wrapped)


def _run_session(
    workers: list[WorkerEndpoint], out: Path, gate: SeedGate | None
) -> tuple[_Feed, dict[str, int]]:
    workload = load_workload(str(ROOT / "examples" / "synthetic" / "workload.yaml"))
    tasks = synthetic_tasks(4, workload, seed=0)
    corpus = DraftCorpus()
    # An earlier iteration's answers of two tasks (the history the feed inserts).
    for task, answers in zip(tasks, HISTORY, strict=False):
        for sample, answer in enumerate(answers):
            text = array("i", answer)
            key = f"old/{task.id}/{sample}"
            corpus.add(task.id, [DraftText(key, text, None, "old", f"old-{sample}")])
    feed = _Feed("parity", corpus, gate)
    session = RolloutSession(
        job="parity",
        tasks=tasks,
        samples_per_task=4,
        environment=SyntheticEnvironment(workload, 4, 4, seed=0, tool_time_scale=0.05),
        workers=workers,
        sink=OutputSink(out),
        perf=PERF,
        sampling=SamplingSpec(max_tokens_per_turn=256, max_total_tokens=600),
        max_turns=4,
        policy="heddle",  # its predictor gives the remaining lengths the question weighs
        config=SessionConfig(replan_interval_s=0.3, health_interval_s=0.2),
        drafts=feed,
    )
    result = asyncio.run(session.run())
    assert len(read_records(out)) == 16 and result.drafts is not None
    return feed, result.drafts


def test_the_live_feed_inserts_exactly_what_the_simulators_question_lets_through(
    sim_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    _, workers = sim_pool
    gate = SeedGate(PERF)
    feed, stats = _run_session(workers, tmp_path / "out.jsonl", gate)
    decisions = gate.decisions
    # Both answers occur: texts that pay (a sibling's text to an engine running its
    # group) and texts that do not (nothing of the group running there, or too long).
    assert {d.pays for d in decisions} == {True, False}
    assert {d.pays for d in decisions if d.unit == "history"} == {True, False}
    # The simulator's engines ask the same question at the same acceptance and cost.
    spec = sim_speculation_for(Speculation.of("suffix", 4))
    assert spec is not None
    speculator = EngineSpeculator(spec, PERF)
    assert speculator.spec.acceptance == gate.acceptance
    for d in decisions:
        assert speculator.pays(d.query) is d.pays, d
    # What reached each worker is exactly what the decisions let through.
    refused = sum(d.texts for d in decisions if not d.pays)
    assert stats["texts_refused"] == refused > 0
    sent = sum(len(s.texts) for s in feed.seen.values())
    assert stats["texts_sent"] == sent > 0 and stats["errors"] == 0
    history = {(d.engine, d.task_id): d.pays for d in decisions if d.unit == "history"}
    for (engine, task), pays in history.items():
        got = [t for on, t in feed.seen[engine].texts if on == task and t in HISTORY_TEXTS]
        assert bool(got) is pays, (engine, task, pays)


def test_without_the_gate_every_text_is_sent(
    sim_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    # The same run with no gate: nothing is refused, more goes out (the gate's effect).
    feed, stats = _run_session(sim_pool[1], tmp_path / "out.jsonl", None)
    assert stats["texts_refused"] == 0
    assert stats["texts_sent"] == sum(len(s.texts) for s in feed.seen.values()) > 0


def _simulated_verdict(job: Path, pool_file: Path, speculation: Speculation) -> tuple[str, str]:
    """The live decision and the simulator's for the same job: the simulator runs the
    predictor's prior sketch of the job, on the planned shape and routing."""
    local = prepare_job(job, pool_file)
    pool = local.pool
    perf = perf_model_for(pool)
    plan = plan_pool(local, perf)
    live = live_colocation(
        local, plan.shape, plan.policy, plan.max_trajectories_in_flight, perf, speculation
    )
    assert live is not None
    budget = PredictorConfig.for_budget(local.job.sampling.max_total_tokens)
    policy = get_policy(plan.policy)
    predictor = make_predictor(str(get_policy("heddle").predictor), budget)
    spec = sim_speculation_for(speculation)
    # The job's trajectories: its prompts and groups (lengths unknown to both deciders).
    from heddle.rollout._prior import prior_sketch

    sketch = prior_sketch(local, str(get_policy("heddle").predictor))
    scripts = workload_sketch(sketch.records, tool_latency_s=0.0)
    sim = Simulator(
        scripts,
        planner_cluster(perf, pool.gpus, pool.gpus_per_node, pool.tensor_parallel_sizes),
        policy,
        tool_means_s=sketch.tool_means_s,
        shape=plan.shape,
        perf=perf,
        predictor=predictor,
        config=SimConfig(speculation=spec),
    )
    return live.reason, sim.colocation


def test_the_live_session_and_the_simulator_take_the_same_colocation_verdict() -> None:
    examples = ROOT / "examples" / "synthetic"
    for speculation in (Speculation.of("suffix", 4), Speculation.of("ngram", 4)):
        live, simulated = _simulated_verdict(
            examples / "job.yaml", examples / "pool.yaml", speculation
        )
        assert live == simulated, speculation
    # A step-level baseline keeps its own routing (the simulator's baselines run stock vLLM).
    local = prepare_job(examples / "job.yaml", examples / "pool.yaml")
    verl = replace(local, job=replace(local.job, policy="verl"))
    plan = plan_pool(verl, perf_model_for(verl.pool))
    suffix = Speculation.of("suffix", 4)
    assert (
        live_colocation(verl, plan.shape, "verl", None, perf_model_for(verl.pool), suffix) is None
    )


@pytest.mark.slow
def test_build_session_keeps_groups_whole_where_the_verdict_is_on(tmp_path: Path) -> None:
    examples = ROOT / "examples" / "synthetic"
    local = prepare_job(examples / "job.yaml", examples / "pool.yaml")
    perf = perf_model_for(local.pool)
    plan = plan_pool(local, perf)
    workers = [WorkerEndpoint(f"w{i}", f"http://127.0.0.1:{9 + i}", 1) for i in range(2)]
    suffix = Speculation.of("suffix", 4)

    def build(verdict: ColocationVerdict | None) -> RolloutSession:
        sink = OutputSink(tmp_path / "out.jsonl")
        return build_session(
            local, workers, sink, plan=plan, perf=perf, speculation=suffix, colocation=verdict
        )

    kept = build(ColocationVerdict(True, "on"))
    assert isinstance(kept.placement, GroupStickyPlacement)
    assert kept.drafts is not None and kept.drafts.inserting
    # The session's view counts each worker's steps in flight, as the simulator's engines
    # count theirs: a later step spills off a worker 8 steps past the least loaded.
    resident = Trajectory("t0", "task-0", 100, instance="w0")
    kept._load.update(w0=7, w1=0)
    view = kept._view()
    assert view is not None and kept.placement.route(resident, view) == "w0"
    kept._load.update(w0=8, w1=0)
    view = kept._view()
    assert view is not None and kept.placement.route(resident, view) == "w1"
    # Kept whole and faster without insertions (the verdict's ``seed``): the feed sends none.
    unseeded = build(ColocationVerdict(True, "on", seed=False))
    assert isinstance(unseeded.placement, GroupStickyPlacement)
    assert unseeded.drafts is not None and not unseeded.drafts.inserting
    # Not given, it is decided there (off for this job: see the test above): the policy's own.
    session = build(None)
    assert type(session.placement) is type(make_placement(get_policy(plan.policy).placement))
    assert session.drafts is not None and session.drafts.gate is not None


def test_with_the_pools_previous_rollout_both_decide_on_it_alike() -> None:
    """The live session's decision from a previous rollout (rollout/_previous.py) and the
    simulator's from the same one (``Simulator(history=...)``): the same verdict for the
    same reason. The previous rollout: short trajectories (about 100 tokens of a
    3,000-token budget), far from what the prior expects."""
    from heddle.rollout._prior import prior_sketch

    examples = ROOT / "examples" / "synthetic"
    speculation = Speculation.of("suffix", 4)
    local = prepare_job(examples / "job.yaml", examples / "pool.yaml")
    previous = tuple(
        FinishedTrajectory(f"old-t{i // 4}", 150, 90 + i % 20, 2, (40, 50 + i % 20), (30,))
        for i in range(64)
    )
    pool, perf = local.pool, perf_model_for(local.pool)
    # The job's trajectories, as the simulator runs them: its prompts and groups (their
    # true lengths are known to neither decider).
    scripts = workload_sketch(prior_sketch(local, "sibling").records, tool_latency_s=0.0)
    seeded = replace(local, history=previous)
    plan = plan_pool(seeded, perf)
    live = live_colocation(
        seeded, plan.shape, plan.policy, plan.max_trajectories_in_flight, perf, speculation
    )
    assert live is not None
    budget = PredictorConfig.for_budget(local.job.sampling.max_total_tokens)
    sim = Simulator(
        scripts,
        planner_cluster(perf, pool.gpus, pool.gpus_per_node, pool.tensor_parallel_sizes),
        get_policy(plan.policy),
        tool_means_s=prior_sketch(seeded, "sibling").tool_means_s,
        history=previous,
        shape=plan.shape,
        perf=perf,
        predictor=make_predictor(str(get_policy("heddle").predictor), budget),
        config=SimConfig(speculation=sim_speculation_for(speculation)),
    )
    assert live.reason == sim.colocation, (live.reason, sim.colocation)
    # And not what the prior's sketch simulated (10 s against 2 s here): the previous
    # rollout is what both decided on.
    unseeded = live_colocation(
        local, plan.shape, plan.policy, plan.max_trajectories_in_flight, perf, speculation
    )
    assert unseeded is not None and unseeded.reason != live.reason
