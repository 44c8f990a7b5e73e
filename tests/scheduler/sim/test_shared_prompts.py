"""A GRPO group's prompt is held once per engine, as vLLM's prefix cache shares its blocks.

The simulator's engines count a group's prompt once in the KV cache and do not prefill it
again for a sibling admitted while another holds it (running or idle); attention still
reads it per sequence. Non-siblings share nothing.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heddle.rollout import load_cluster, load_workload
from heddle.scheduler import ClusterSpec, Trajectory, TrajectoryScript, generate, get_policy
from heddle.scheduler.sim import SimEngine, SimTrajectory, Simulator

# Qwen3-32B on one H100 keeps ~13K tokens of KV: two 8K-token prompts fit only as one.
_TIGHT = ClusterSpec("tight", 1, 1, "qwen3-32b", "h100-sxm", (1,), 1, batch_cap=8)


def _script(tid: str, group: str, prompt: int, turns: tuple[int, ...]) -> TrajectoryScript:
    tools = len(turns) - 1
    return TrajectoryScript(
        tid, group, 0, prompt, turns, ("x",) * tools, (0.0,) * tools, (50,) * tools
    )


def _engine(cluster: ClusterSpec = _TIGHT) -> SimEngine:
    perf = cluster.perf_model()
    return SimEngine(perf.instance("e", 1), perf, lambda t: float(t.prompt_tokens))


def _sim(script: TrajectoryScript) -> SimTrajectory:
    sim = SimTrajectory(script, Trajectory(script.id, script.group_id, script.prompt_tokens))
    sim.start_turn()
    return sim


@pytest.mark.parametrize(
    ("groups", "prefills", "kv"),
    [(("g", "g"), (3000, 0), 3000), (("g1", "g2"), (3000, 3000), 6000)],
    ids=["siblings prefill and hold their prompt once", "strangers share nothing"],
)
def test_a_prompt_is_prefilled_and_held_once_per_group(
    groups: tuple[str, str], prefills: tuple[int, int], kv: int
) -> None:
    engine = _engine()
    a, b = (_sim(_script(t, g, 3000, (100,))) for t, g in zip("ab", groups, strict=True))
    for sim in (a, b):
        engine.enqueue(sim, 0.0)
    engine.start_segment(0.0)
    assert sorted(engine.running) == ["a", "b"]
    assert (a.prefill_tokens, b.prefill_tokens) == prefills
    assert engine.running_context == 6000  # attention reads the prompt per sequence
    assert engine.kv_used_tokens == kv


def test_siblings_that_fit_only_as_one_prompt_run_together() -> None:
    capacity = _TIGHT.perf_model().instance("e", 1).kv_capacity_tokens
    prompt = capacity * 2 // 3  # two copies do not fit, one does with room to decode
    siblings = [_sim(_script(t, "g", prompt, (64,))) for t in "ab"]
    strangers = [_sim(_script(t, f"g{t}", prompt, (64,))) for t in "cd"]
    for group in (siblings, strangers):
        engine = _engine()
        for sim in group:
            engine.enqueue(sim, 0.0)
        engine.start_segment(0.0)
        assert len(engine.running) == (2 if group is siblings else 1)


def test_an_idle_sibling_lends_its_prompt_until_it_is_evicted() -> None:
    engine = _engine()
    first = _sim(_script("a", "g", 2000, (10, 10)))
    engine.enqueue(first, 0.0)
    now = engine.start_segment(0.0)
    assert now is not None
    (done,) = engine.finish_segment(now)
    done.traj.turns += 1
    engine.keep(done)  # in a tool call: its context stays cached
    late = _sim(_script("b", "g", 2000, (10,)))
    engine.enqueue(late, now)
    engine.start_segment(now)
    assert late.prefill_tokens == 0
    # Once the idle sibling is gone, the prompt is no longer held.
    engine.release_cache("a")
    assert engine.kv_used_tokens == engine.running_context == 2000


def _kv_by_scan(engine: SimEngine) -> int:
    """What the KV cache holds, counted from scratch: every context, each prompt once."""
    holders: dict[tuple[str, int], int] = {}
    for sim in engine.running.values():
        key = (sim.traj.group_id, sim.traj.prompt_tokens)
        holders[key] = holders.get(key, 0) + 1
    for _tokens, group, prompt in engine.cache.tokens.values():
        holders[(group, prompt)] = holders.get((group, prompt), 0) + 1
    shared = sum((n - 1) * prompt for (_, prompt), n in holders.items())
    return engine.running_context + engine.cache.total - shared


_groups = st.lists(
    st.tuples(
        st.integers(200, 5000),  # the group's prompt
        st.lists(st.lists(st.integers(1, 1500), min_size=1, max_size=3), min_size=1, max_size=4),
    ),
    min_size=1,
    max_size=4,
)


@pytest.mark.slow
@settings(max_examples=80, deadline=None)
@given(_groups, st.sampled_from([2, 8]))
def test_the_kv_count_matches_a_scan_and_nothing_is_lost(
    groups: list[tuple[int, list[list[int]]]], batch_cap: int
) -> None:
    engine = _engine(replace(_TIGHT, batch_cap=batch_cap))
    capacity = engine.instance.kv_capacity_tokens
    sims = [
        _sim(_script(f"g{g}s{i}", f"g{g}", prompt, tuple(turns)))
        for g, (prompt, samples) in enumerate(groups)
        for i, turns in enumerate(samples)
    ]
    sims = [s for s in sims if s.script.prompt_tokens + sum(s.script.turn_tokens) + 200 < capacity]
    now = 0.0
    for sim in sims:
        engine.enqueue(sim, now)
    while (end := engine.start_segment(now)) is not None:
        assert engine.kv_used_tokens == _kv_by_scan(engine) <= capacity
        now = end
        for sim in engine.finish_segment(now):
            sim.traj.turns += 1
            if sim.traj.turns < sim.script.turns:
                engine.keep(sim)
                sim.traj.context_tokens += sim.script.tool_output_tokens[sim.traj.turns - 1]
                sim.start_turn()
                engine.enqueue(sim, now)
        engine.relieve_kv_pressure(now)
        assert engine.kv_used_tokens == _kv_by_scan(engine)
    assert all(s.traj.generated_tokens == s.script.total_tokens for s in sims)
    engine.forget_idle()
    assert engine.kv_used_tokens == engine.cache.total == 0


@pytest.mark.slow
def test_a_whole_run_counts_the_prompts_siblings_found_held() -> None:
    """verl keeps a group where its first steps landed: some siblings share an engine."""
    workload = replace(load_workload("coding"), prompts=6, samples_per_prompt=8)
    scripts = generate(workload, 3)
    cluster = replace(load_cluster("64xh100"), gpus=2)
    sim = Simulator(scripts, cluster, get_policy("verl"), tool_means_s={"sandbox": 0.41})
    result = sim.run()
    shared = sum(s.shared_prompt_tokens for s in sim.sims.values())
    assert result.shared_prompt_tokens == shared > 0
