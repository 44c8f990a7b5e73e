"""What version age buys Heddle in the multi-iteration simulator: each part switched off.

    .venv/bin/python examples/async/version_age.py --workload coding --over-sample 1.0

Runs the simulator's ``heddle`` iteration policy (docs/async.md) on one stream
of GRPO groups five ways: as it is; with its steps in the plain ordering (no
oldest-version-first priority); without unpinning after a load; with neither
(only the trainer's take of the oldest finished groups first); and with none of
the three. Prints trained samples per second, the mean and p90 length of what
the trainer received, the worst staleness and the samples trained past the
bound. A configuration takes 5 to 30 CPU-seconds at the default size.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace
from typing import Any

from heddle.rollout import load_bench_workload, load_cluster
from heddle.scheduler import VersionAgedOrdering
from heddle.scheduler.sim import IterationSimulator, iteration_policy, stream_of

VARIANTS = ("heddle", "steps-unaged", "no-unpin", "take-only", "none")


def simulate(args: argparse.Namespace, variant: str) -> dict[str, Any]:
    policy = iteration_policy(
        "heddle", args.max_staleness, cap=args.cap, over_sample=args.over_sample
    )
    if variant in ("no-unpin", "take-only"):
        policy = replace(policy, rebalance_on_update=False)
    if variant == "none":
        policy = replace(policy, age_priority=False, rebalance_on_update=False)
    ahead = max(policy.over_sample, policy.window_batches) + 1.0  # as `heddle bench` draws
    draws = [
        load_bench_workload(args.workload, args.seed + k, args.prompts)
        for k in range(args.iterations + math.ceil(ahead) + 1)
    ]
    groups = stream_of([d.scripts for d in draws])
    sim = IterationSimulator(
        groups,
        replace(load_cluster("64xh100"), gpus=args.gpus),
        policy,
        batch_groups=len(groups) // len(draws),
        iterations=args.iterations,
        max_staleness=args.max_staleness,
        tool_means_s=draws[0].tool_means_s,
        rollout_tp=4,
        history=draws[0].history,
    )
    if variant in ("steps-unaged", "take-only"):
        # The trainer still takes the oldest groups first (age_priority); the engines
        # rank steps with the step policy's own ordering.
        aged = sim.ordering
        assert isinstance(aged, VersionAgedOrdering)
        for engine in sim.engines.values():
            engine.priority = aged.base.priority
    return sim.run_iterations().as_dict()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="coding", help="coding, math or search")
    parser.add_argument("--prompts", type=int, default=32, help="groups of 16 an iteration")
    parser.add_argument("--gpus", type=int, default=16, help="simulated H100s (TP4 engines)")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--max-staleness", type=int, default=1)
    parser.add_argument("--over-sample", type=float, default=0.25)
    parser.add_argument("--cap", type=int, default=128, help="in-flight trajectories per engine")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    print(f"{'variant':13} {'samples/s':>9} {'mean':>7} {'p90':>7} {'stale':>5} {'past':>5}")
    for variant in VARIANTS:
        r = simulate(args, variant)
        print(
            f"{variant:13} {r['trained_samples_per_s']:9.3f} {r['trained_mean_tokens']:7.0f} "
            f"{r['trained_p90_tokens']:7.0f} {r['staleness_max']:5d} {r['samples_over_bound']:5d}",
            flush=True,
        )


if __name__ == "__main__":
    main()
