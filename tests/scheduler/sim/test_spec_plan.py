"""Heddle's speculation decisions in the simulator: co-location judged against the pool's
routing, and the drafting corpus the session seeds (siblings after a push, history)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

import pytest

from heddle.exceptions import ConfigError
from heddle.scheduler import (
    ACCEPTANCE_PRESETS,
    AUTO_MAX_K,
    ClusterSpec,
    ClusterView,
    FinishedTrajectory,
    PoolShape,
    ShapeConfig,
    SpeculationConfig,
    Trajectory,
    TrajectoryScript,
    acceptance_model,
    auto_k_table,
    geometric_tokens_per_step,
    get_policy,
    k_by_batch_size,
)
from heddle.scheduler.sim import (
    GroupStickyPlacement,
    SimConfig,
    SimSpeculation,
    SimulatedShapePlanner,
    Simulator,
    heddle_speculation,
    judge_colocation,
)
from heddle.scheduler.sim._minis import Wave
from heddle.scheduler.sim._plan import ReplicaRun, group_replica
from heddle.scheduler.sim._simulator import MiniRun
from heddle.scheduler.sim._spec_plan import ColocationDecision, decide_colocation

from ...conftest import make_instance

SUFFIX = SpeculationConfig("suffix", None)
DEFAULT = ACCEPTANCE_PRESETS["default"]
# Four TP1 engines running at most 8 sequences each (so an engine's work, not only its
# longest sequence, sets when it finishes); small enough that a simulation of the whole
# pool judges co-location.
CLUSTER = ClusterSpec("four", 4, 4, "qwen3-8b", "h100-sxm", (1,), 1, batch_cap=8)


def groups_of(lengths: list[int], size: int = 16, turns: int = 2) -> list[TrajectoryScript]:
    """One GRPO group per entry of ``lengths``, every sample that many output tokens."""
    scripts = []
    for g, total in enumerate(lengths):
        per_turn = (total // turns,) * turns
        for i in range(size):
            scripts.append(
                TrajectoryScript(
                    f"g{g}-{i}",
                    f"g{g}",
                    i,
                    200,
                    per_turn,
                    ("tool",) * (turns - 1),
                    (0.2,) * (turns - 1),
                    (50,) * (turns - 1),
                )
            )
    return scripts


def history_of(scripts: list[TrajectoryScript]) -> list[FinishedTrajectory]:
    """The previous iteration, as the session keeps it: the same tasks, the same lengths."""
    return [
        FinishedTrajectory(s.group_id, s.prompt_tokens, s.total_tokens, s.turns, s.turn_tokens)
        for s in scripts
    ]


def heddle_run(
    scripts: list[TrajectoryScript], spec: SimSpeculation, shape: PoolShape | None = None
) -> Simulator:
    """Heddle's run; with ``shape`` its own scheduling there (no planned fallback)."""
    return Simulator(
        scripts,
        CLUSTER,
        get_policy("heddle"),
        tool_means_s={"tool": 0.2},
        history=history_of(scripts),
        shape=shape,
        config=SimConfig(speculation=spec),
    )


def stock_run(scripts: list[TrajectoryScript], spec: SimSpeculation) -> Simulator:
    return Simulator(
        scripts,
        CLUSTER,
        get_policy("verl"),
        tool_means_s={"tool": 0.2},
        shape=PoolShape.of({1: 4}),
        config=SimConfig(speculation=spec),
    )


NO_SEEDING = {"seed_siblings": False, "seed_history": 0, "k_table": False}


def test_colocation_is_taken_where_whole_groups_balance() -> None:
    # Eight equal groups of 16 on four engines: two whole groups per engine balance
    # exactly, and a group's 15 siblings in one tree beat the ~3 the routing leaves it.
    sim = heddle_run(groups_of([1200] * 8), heddle_speculation(SUFFIX, DEFAULT, **NO_SEEDING))
    assert sim.colocation.startswith("on (simulated")
    colocated = sim.run()
    assert colocated.speculation["tokens_per_step"] > 1.9


@pytest.mark.slow
def test_colocation_is_refused_where_whole_groups_pile_up() -> None:
    # Long and short groups alternate: the closed form pairs each long group with a short
    # one (balanced, and it predicts a gain), but placing groups as they arrive puts two
    # long groups on each of two engines, twice the waves of long sequences the pool's
    # routing gives an engine; spilling their last steps to the idle engines does not
    # make up for it. The simulation of the pool sees it: refused.
    sim = heddle_run(groups_of([4000, 400] * 4), heddle_speculation(SUFFIX, DEFAULT, **NO_SEEDING))
    assert sim.colocation.startswith("off (simulated")
    assert "closed form" in sim.colocation
    # and the simulation was right: co-locating anyway finishes later.
    forced = heddle_run(
        groups_of([4000, 400] * 4), heddle_speculation(SUFFIX, DEFAULT, **NO_SEEDING)
    )
    forced.placement = GroupStickyPlacement()
    assert forced.run().makespan_s > sim.run().makespan_s


def loads_view(loads: dict[str, int]) -> ClusterView:
    return ClusterView([make_instance(n) for n in loads], loads)


def member(group: str, instance: str | None = None) -> Trajectory:
    return Trajectory(f"{group}-{instance}", group, 100, instance=instance)


def test_a_kept_whole_group_starts_on_one_engine_however_loaded_it_grows() -> None:
    placement = GroupStickyPlacement()
    assert placement.route(member("g0"), loads_view({"e0": 3, "e1": 0})) == "e1"
    # The group's next members follow its first, even 40 requests past the least loaded.
    assert placement.route(member("g0"), loads_view({"e0": 0, "e1": 40})) == "e1"
    assert placement.route(member("g1"), loads_view({"e0": 0, "e1": 40})) == "e0"


@pytest.mark.parametrize(
    ("loads", "goes_to"),
    [
        ({"e0": 7, "e1": 0}, "e0"),  # 7 more than an idle engine: under the margin of 8
        ({"e0": 8, "e1": 0}, "e1"),  # 8 more, and 8 times an idle engine's 1
        ({"e0": 128, "e1": 112}, "e0"),  # 16 more at a full batch, but not twice as many
        ({"e0": 40, "e1": 20}, "e1"),  # 20 more and twice as many
    ],
)
def test_a_later_step_spills_to_the_least_loaded_engine_past_margin_and_ratio(
    loads: dict[str, int], goes_to: str
) -> None:
    placement = GroupStickyPlacement()
    assert placement.route(member("g0", instance="e0"), loads_view(loads)) == goes_to


def test_without_a_spill_margin_a_group_stays_whole_to_the_end() -> None:
    placement = GroupStickyPlacement(spill_margin=None)
    assert placement.route(member("g0", instance="e0"), loads_view({"e0": 90, "e1": 0})) == "e0"
    with pytest.raises(ConfigError, match="spill_margin=0"):
        GroupStickyPlacement(spill_margin=0)
    with pytest.raises(ConfigError, match=r"spill_ratio=0\.5"):
        GroupStickyPlacement(spill_ratio=0.5)


@pytest.mark.slow
def test_spilling_the_tail_finishes_sooner_than_groups_held_whole() -> None:
    # Long and short groups alternate on four engines of 8 slots: kept whole as they
    # arrive, two long groups share each of two engines while the other two run short
    # ones and go idle. Spilled, the long groups' later steps move to the idle engines
    # (and re-prefill their contexts there).
    scripts = groups_of([4000, 400] * 4, turns=4)
    spec = heddle_speculation(SUFFIX, DEFAULT, **NO_SEEDING)
    whole = heddle_run(scripts, spec)
    whole.placement = GroupStickyPlacement(spill_margin=None)
    spilled = heddle_run(scripts, spec)
    spilled.placement = GroupStickyPlacement()
    held, moved = whole.run(), spilled.run()
    assert moved.makespan_s < 0.8 * held.makespan_s
    assert sum(s.prefill_tokens for s in spilled.sims.values()) > sum(
        s.prefill_tokens for s in whole.sims.values()
    )


def test_with_seeded_siblings_only_a_simulation_of_the_pool_decides() -> None:
    # The closed form cannot weigh what the insertions cost: the simulation decides.
    spec = heddle_speculation(SUFFIX, DEFAULT, seed_history=0, k_table=False)
    sim = heddle_run(groups_of([1200] * 8), spec)
    assert "simulated" in sim.colocation
    assert "siblings seeded" in sim.colocation


@pytest.mark.slow
def test_seeded_siblings_count_only_after_their_text_is_pushed() -> None:
    scripts = groups_of([1200] * 8, turns=3)
    alone = {"colocate_groups": False, "seed_history": 0, "k_table": False}
    # One routing for all three (the planner scores its fallbacks with each run's
    # speculation, and a routing that moves steps would make the texts differ by timing).
    own = PoolShape.of({1: 4})
    plain = heddle_run(
        scripts, heddle_speculation(SUFFIX, DEFAULT, seed_siblings=False, **alone), own
    ).run()
    late = SimSpeculation(SUFFIX, DEFAULT, seed_siblings=True, push_interval_s=1e9, **alone)
    never = heddle_run(scripts, late, own).run()
    pushed = heddle_run(scripts, heddle_speculation(SUFFIX, DEFAULT, **alone), own).run()
    # Texts that never arrive draft nothing; their insertion still costs the engines.
    assert never.speculation["tokens_per_step"] == plain.speculation["tokens_per_step"]
    assert never.makespan_s >= plain.makespan_s
    assert pushed.speculation["tokens_per_step"] > plain.speculation["tokens_per_step"]
    assert pushed.speculation["seeded"]["tokens"] > 0
    assert pushed.speculation["seeded"]["engine_s"] > 0


def _judged(
    makespans: dict[tuple[bool, bool], float], seeds: bool
) -> tuple[ColocationDecision, list[tuple[bool, bool]]]:
    """decide_colocation on eight equal groups of four engines, the simulation replaced
    by ``makespans[(colocate, seed)]``; the decision and the runs it asked for (one wave,
    in order)."""
    asked: list[tuple[bool, bool]] = []

    def simulate(wave: Sequence[tuple[bool, bool]]) -> list[float]:
        assert not asked, "the verdict's simulations are one wave"
        asked.extend(wave)
        return [makespans[run] for run in wave]

    groups = {f"g{g}": [1000.0] * 16 for g in range(8)}
    decision = decide_colocation(
        groups, 4, 0.01, 2.1, 1.5, siblings_seeded=seeds,
        simulate=simulate, seeds=seeds,
    )  # fmt: skip
    return decision, asked


@pytest.mark.parametrize(
    ("seeded", "plain", "colocate", "seed"),
    [
        (98.0, 80.0, True, False),  # kept whole, insertions only cost: dropped
        (80.0, 90.0, True, True),  # insertions still pay: kept
        (85.0, 85.0, True, False),  # a tie: nothing to gain from the insertions' cost
        (99.0, 97.0, False, True),  # neither beats the routing by the margin: scattered
    ],
)
def test_where_texts_are_seeded_the_kept_whole_candidate_is_the_faster_with_or_without(
    seeded: float, plain: float, colocate: bool, seed: bool
) -> None:
    makespans = {(False, True): 100.0, (True, True): seeded, (True, False): plain}
    decision, asked = _judged(makespans, seeds=True)
    assert (decision.colocate, decision.seed) == (colocate, seed)
    assert sorted(asked) == sorted(makespans)
    if colocate:
        assert decision.predicted_colocated_s == min(seeded, plain)
        assert ("without seeding" in decision.reason) is not seed


def test_without_seeding_configured_two_simulations_decide() -> None:
    decision, asked = _judged({(False, True): 100.0, (True, True): 80.0}, seeds=False)
    assert decision.colocate and decision.seed
    assert asked == [(False, True), (True, True)]


def test_a_run_kept_whole_without_seeding_inserts_nothing() -> None:
    # Insertions priced so high that the co-located sketch runs faster without them:
    # the verdict drops seeding, and the run that follows inserts nothing.
    spec = replace(heddle_speculation(SUFFIX, DEFAULT, k_table=False), seed_s_per_token=1e-3)
    sim = heddle_run(groups_of([1200] * 8), spec)
    assert sim.colocation.startswith("on (simulated") and "without seeding" in sim.colocation
    result = sim.run()
    assert result.speculation["seeded"]["tokens"] == 0
    assert not result.speculation["seeded"]["siblings"]


def test_a_replica_keeps_every_scale_th_group_whole_the_longest_included() -> None:
    scripts = groups_of([300, 1200, 600, 900, 1500, 100], size=3)
    kept = group_replica(scripts, 2)
    # By total length: g4 1500, g1 1200, g3 900, g2 600, g0 300, g5 100 -> g4, g3, g0.
    assert [s.group_id for s in kept] == ["g0"] * 3 + ["g3"] * 3 + ["g4"] * 3
    assert group_replica(scripts, 1) == scripts


def test_a_pool_larger_than_the_replica_is_judged_on_one_replica_of_whole_groups() -> None:
    # 64 equal groups on 32 engines: the shape planner's replica is half of it (16 GPUs,
    # 512 trajectories), so the decision simulates that half, groups whole, and asks
    # the same 5% margin as for the whole pool.
    big = replace(CLUSTER, name="thirty-two", gpus=32, gpus_per_node=8)
    scripts = groups_of([1200] * 64)
    sim = Simulator(
        scripts, big, get_policy("heddle"), tool_means_s={"tool": 0.2},
        history=history_of(scripts), shape=PoolShape.of({1: 32}),
        config=SimConfig(speculation=heddle_speculation(SUFFIX, DEFAULT, **NO_SEEDING)),
    )  # fmt: skip
    assert "on a 1/2 replica, margin 5%" in sim.colocation


class PoolSizedAnswers:
    """Stands in for the decision's runner: answers each simulation by the GPUs it runs
    on (a replica or the whole pool) and whether groups are kept whole, and records the
    pools each wave ran on."""

    def __init__(self, answers: dict[tuple[int, bool], float]) -> None:
        self.answers = answers
        self.asked: list[set[int]] = []

    def run_wave(self, runs: Sequence[MiniRun]) -> tuple[list[float], Wave]:
        self.asked.append({r.cluster.gpus for r in runs})
        found = [self.answers[(r.cluster.gpus, r.keep_groups)] for r in runs]
        return found, Wave(tuple(100 for _ in runs))


def _judged_on_32(
    answers: dict[tuple[int, bool], float],
) -> tuple[ColocationDecision, list[set[int]]]:
    big = replace(CLUSTER, name="thirty-two", gpus=32, gpus_per_node=8)
    scripts = groups_of([1200] * 64)
    shape = PoolShape.of({1: 32})
    probe = Simulator(
        scripts, big, get_policy("heddle"), tool_means_s={"tool": 0.2},
        history=history_of(scripts), shape=shape,
    )  # fmt: skip
    runner = PoolSizedAnswers(answers)
    verdict = judge_colocation(
        [s.traj for s in probe.sims.values()], history_of(scripts), cluster=big,
        policy="verl", shape=shape, perf=big.perf_model(),
        config=SimConfig(speculation=heddle_speculation(SUFFIX, DEFAULT, **NO_SEEDING)),
        tool_means_s={"tool": 0.2}, predictor="sibling", runner=runner,
    )[1]  # fmt: skip
    return verdict, runner.asked


def test_a_replicas_no_is_asked_again_of_the_whole_pool() -> None:
    # The 1/2 replica sees co-location 2% ahead (under the 5% margin); the whole pool's
    # sketch sees 10%: taken, on the pool's answer, and both waves are charged.
    verdict, asked = _judged_on_32({(16, False): 100.0, (16, True): 98.0,
                                    (32, False): 200.0, (32, True): 180.0})  # fmt: skip
    assert asked == [{16}, {32}]
    assert verdict.colocate
    assert (verdict.predicted_scattered_s, verdict.predicted_colocated_s) == (200.0, 180.0)
    assert "a 1/2 replica had said 98s co-located vs 100s" in verdict.reason
    assert len(verdict.waves) == 2
    # The pool may refuse too: then it is refused on the pool's figures.
    verdict, asked = _judged_on_32({(16, False): 100.0, (16, True): 98.0,
                                    (32, False): 200.0, (32, True): 199.0})  # fmt: skip
    assert asked == [{16}, {32}] and not verdict.colocate
    assert verdict.predicted_colocated_s == 199.0


def test_a_replicas_yes_stands_without_asking_the_pool() -> None:
    verdict, asked = _judged_on_32({(16, False): 100.0, (16, True): 90.0})
    assert asked == [{16}]
    assert verdict.colocate and "on a 1/2 replica" in verdict.reason
    assert len(verdict.waves) == 1


def test_the_decisions_runs_seed_as_the_run_will_under_a_routing_without_a_predictor() -> None:
    # Heddle runs verl's routing (the planner's fallback) with its own predictor, which
    # the seeding gate reads. Judged without it, the scattered sketch seeded no sibling
    # (verl predicts nothing) and co-location looked 14% ahead; seeded as the run
    # will be, scattered groups draft from their siblings and history too and its
    # lead shrinks (to 8%: whole groups, their history inserted, still win here).
    scripts = groups_of([1200] * 8, turns=3)
    shape = PoolShape.of({1: 4})
    probe = Simulator(
        scripts, CLUSTER, get_policy("heddle"), tool_means_s={"tool": 0.2},
        history=history_of(scripts), shape=shape,
    )  # fmt: skip
    spec = heddle_speculation(SUFFIX, DEFAULT, k_table=False)

    def judged(predictor: str | None) -> ColocationDecision:
        return judge_colocation(
            [s.traj for s in probe.sims.values()], history_of(scripts), cluster=CLUSTER,
            policy="verl", shape=shape, perf=CLUSTER.perf_model(),
            config=SimConfig(speculation=spec), tool_means_s={"tool": 0.2}, predictor=predictor,
        )[1]  # fmt: skip

    blind, seeded = judged(None), judged("sibling")
    assert seeded.predicted_scattered_s < 0.9 * blind.predicted_scattered_s
    assert seeded.simulated_events > 0  # what deciding cost, charged to the run's start
    lead = seeded.predicted_scattered_s / seeded.predicted_colocated_s
    assert lead < blind.predicted_scattered_s / blind.predicted_colocated_s - 0.03


def test_history_is_seeded_where_it_pays_and_not_for_a_predicted_nothing() -> None:
    scripts = groups_of([1200] * 8)
    stock = stock_run(scripts, SimSpeculation(SUFFIX, DEFAULT, seed_history=16)).run()
    # verl predicts no remaining length: no insertion is predicted to pay.
    assert stock.speculation["seeded"]["tokens"] == 0
    alone = {"colocate_groups": False, "seed_siblings": False, "k_table": False}
    plain = heddle_run(scripts, heddle_speculation(SUFFIX, DEFAULT, seed_history=0, **alone))
    seeded = heddle_run(scripts, heddle_speculation(SUFFIX, DEFAULT, **alone)).run()
    assert seeded.speculation["seeded"]["tokens"] > 0
    # 16 samples of 1,200 tokens per group, at most once for each engine and group.
    assert seeded.speculation["seeded"]["tokens"] <= 4 * 8 * 16 * 1200
    assert seeded.speculation["tokens_per_step"] > plain.run().speculation["tokens_per_step"]


def test_an_engine_is_credited_the_pools_share_of_a_tasks_earlier_samples_uninserted() -> None:
    # A whole group of 4 on one of four engines: its 3 siblings are in the tree, but
    # its home was chosen afresh this iteration, so the previous iteration's 4 samples
    # are there one time in four (4 / 4 = 1 on average), not 4. Crediting a whole group
    # all its earlier samples uninserted flattered co-location by 5-9% on the paper's
    # workloads. A scattered member is credited the same share.
    scripts = groups_of([1200] * 2, size=4)
    spec = heddle_speculation(SUFFIX, DEFAULT, colocate_groups=False, **NO_SEEDING)
    sim = heddle_run(scripts, spec, PoolShape.of({1: 4}))
    assert sim.speculator is not None
    whole, alone = list(sim.engines.values())[:2]
    for one in sim.sims.values():
        if one.traj.group_id == "g0":
            whole.running[one.id] = one
        elif one.id == "g1-0":
            alone.running[one.id] = one
    assert sim.speculator._corpus(whole, 0.0) == Counter({(3, 1.0, 0.0): 4})
    assert sim.speculator._corpus(alone, 0.0) == Counter({(0, 1.0, 0.0): 1})
    # A replica of a larger pool is credited the pool's share (judge_colocation sets it).
    replica = heddle_run(scripts, replace(spec, pool_engines=16), PoolShape.of({1: 4}))
    assert replica.speculator is not None
    engine = next(iter(replica.engines.values()))
    for one in replica.sims.values():
        if one.traj.group_id == "g0":
            engine.running[one.id] = one
    assert replica.speculator._corpus(engine, 0.0) == Counter({(3, 0.25, 0.0): 4})


def test_history_reaches_groups_that_start_with_the_run() -> None:
    # One group of 4 on four engines: each engine's only task arrives with its first
    # batch. The insertion is asked a push interval later, as the live feed sends, at
    # the K the engine drafts with then; asked at the first step, it read K = 0 (the
    # engine had chosen none yet) and the first task on every engine never got its
    # history.
    scripts = groups_of([1200], size=4)
    alone = {"colocate_groups": False, "seed_siblings": False, "k_table": False}
    own = PoolShape.of({1: 4})
    plain = heddle_run(scripts, heddle_speculation(SUFFIX, DEFAULT, seed_history=0, **alone), own)
    seeded = heddle_run(scripts, heddle_speculation(SUFFIX, DEFAULT, **alone), own).run()
    assert seeded.speculation["seeded"]["tokens"] > 0
    assert seeded.speculation["tokens_per_step"] > plain.run().speculation["tokens_per_step"]
    # Asked only once the feed would send (here: never), nothing is inserted.
    late = replace(heddle_speculation(SUFFIX, DEFAULT, **alone), push_interval_s=1e9)
    assert heddle_run(scripts, late, own).run().speculation["seeded"]["tokens"] == 0


def test_the_shape_planner_scores_its_candidates_with_the_runs_speculation() -> None:
    # The run speculates whichever fallback and cap the planner picks, so each candidate's
    # mini-simulation speculates too (a cap that wins on plain decode can lose with drafts).
    scripts = groups_of([1200, 300] * 4)
    spec = heddle_speculation(SUFFIX, DEFAULT, **NO_SEEDING)
    config = ShapeConfig(gpu_budget=4, gpus_per_node=4, tensor_parallel_sizes=(1,))
    run = ReplicaRun(scripts, CLUSTER, "verl", {"tool": 0.2}, (), PoolShape.of({1: 4}), 8)
    perf = CLUSTER.perf_model()
    scored = SimulatedShapePlanner(perf, config, speculation=spec)._makespan(run)
    plain = SimulatedShapePlanner(perf, config)._makespan(run)
    direct = Simulator(
        scripts, CLUSTER, get_policy("verl"), tool_means_s={"tool": 0.2},
        shape=PoolShape.of({1: 4}), perf=perf,
        config=SimConfig(
            max_trajectories_per_engine=8, planner_cost=None,
            speculation=replace(spec, colocate_groups=False),  # the co-location decision's, later
        ),
    ).run()  # fmt: skip
    assert scored == direct.makespan_s < plain


def test_a_replica_is_credited_the_pools_share_of_history() -> None:
    # A task's earlier samples were spread over the whole pool's engines: a replica of a
    # quarter of it holds the pool's share (group size / pool engines) uninserted, not
    # four times as much, as the co-location verdict's replica is credited.
    scripts = groups_of([1200, 300] * 4, size=8)
    spec = heddle_speculation(SUFFIX, DEFAULT, **NO_SEEDING)
    config = ShapeConfig(gpu_budget=16, gpus_per_node=4, tensor_parallel_sizes=(1,))
    planner = SimulatedShapePlanner(CLUSTER.perf_model(), config, speculation=spec)
    replica = ReplicaRun(scripts, CLUSTER, "verl", {"tool": 0.2}, (), PoolShape.of({1: 4}), 8)
    own = planner._makespan(replica)  # the replica's 4 engines: 2 earlier samples each
    pooled = planner._makespan(replace(replica, pool_engines=16))  # the pool's: 0.5
    assert pooled > own


def test_the_k_table_is_the_one_an_auto_worker_builds_whatever_the_runs_acceptance() -> None:
    # A worker started with `auto` builds its table before any job runs, on the
    # acceptance it assumes (auto_k_table); a run whose drafts are accepted more (the
    # default preset here) must not draft by a table built on that, which no worker has.
    # Fixed (k_measured off) the run drafts by that table all along.
    sim = heddle_run(groups_of([1200] * 8), heddle_speculation(SUFFIX, DEFAULT, k_measured=False))
    result = sim.run()
    table = auto_k_table(sim.perf, 1, "suffix", max_num_seqs=sim.perf.batch_cap)
    used = {int(k) for k in result.speculation["k_segments"]}
    assert used and used <= {k for _, k in table}, (used, table)
    assert max(used) <= AUTO_MAX_K
    assert result.speculation["measured_alpha"] is None
    # The run's own acceptance would have drafted more at a batch of one.
    own = k_by_batch_size(sim.perf, 1, 1024.0,
                          lambda k: DEFAULT.tokens_per_step("suffix", k, siblings=15),
                          sim.perf.batch_cap)  # fmt: skip
    assert own[0][1] > table[0][1]


def test_each_engine_rebuilds_its_table_from_what_its_drafts_gave() -> None:
    # As the worker does (MeasuredKTable in vLLM's process): from the auto table, each
    # engine's table is rebuilt on the acceptance its own segments gave. The default
    # preset is taken more than the table assumes, so the engines learn it and draft more.
    scripts = groups_of([1200] * 8)
    fixed = heddle_run(scripts, heddle_speculation(SUFFIX, DEFAULT, k_measured=False)).run()
    sim = heddle_run(scripts, heddle_speculation(SUFFIX, DEFAULT))
    result = sim.run()
    speculator = sim.speculator
    assert speculator is not None and len(speculator.measured) == len(sim.engines)
    start = auto_k_table(sim.perf, 1, "suffix", max_num_seqs=sim.perf.batch_cap)
    for table in speculator.measured.values():
        assert table.rebuilds > 0 and table.alpha is not None
        # Between the preset's own-text and full-group acceptance (0.30 and 0.50 per draft).
        assert 0.25 <= table.alpha <= 0.55, table.alpha
        assert table.table == k_by_batch_size(
            sim.perf, 1, 1024.0,
            lambda k, a=table.alpha: geometric_tokens_per_step(a, k),
            sim.perf.batch_cap, (1, 2, 3, 4),
        )  # fmt: skip
        assert table.k_at(1) >= start[0][1]
    alpha = result.speculation["measured_alpha"]
    assert alpha["engines"] == len(sim.engines) and alpha["rebuilds"] > 0
    k_fixed = sum(int(k) * n for k, n in fixed.speculation["k_segments"].items())
    k_measured = sum(int(k) * n for k, n in result.speculation["k_segments"].items())
    assert k_measured / sum(result.speculation["k_segments"].values()) > k_fixed / sum(
        fixed.speculation["k_segments"].values()
    )


def test_an_engine_whose_drafts_are_not_taken_stops_drafting_but_at_a_batch_of_one() -> None:
    # tau:1.0: drafts that are never accepted. The start table drafts (it assumes
    # pessimistic acceptance); measured, each engine turns K off at every batch but one.
    sim = heddle_run(groups_of([1200] * 8), heddle_speculation(SUFFIX, acceptance_model("tau:1")))
    sim.run()
    assert sim.speculator is not None
    for table in sim.speculator.measured.values():
        assert table.alpha is not None and table.alpha <= 0.02  # the prior, faded
        assert table.k_at(1) == 1 and all(table.k_at(b) == 0 for b in range(2, 9))
