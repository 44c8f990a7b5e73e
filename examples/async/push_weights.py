"""New weights under a running rollout: three weight versions, pushed mid-rollout.

    .venv/bin/python examples/async/push_weights.py                     # sim workers, a minute
    .venv/bin/python examples/async/push_weights.py --engine vllm --model smollm2

One rollout of the synthetic quickstart workload (multi-turn, with tool gaps) on
two local workers starts on weights version 0. After ``--every`` steps the
script pushes version 1 (``RolloutSession.push_weights``), after as many more
version 2: each worker leaves the rotation, finishes the steps it runs, loads
the checkpoint in place and takes steps again; trajectories in a tool gap just
wait. Versions 1 and 2 are copies of the starting weights under new labels
(folders of links to the same files: a real trainer would write new weights
there). At the end it prints, per version, how many steps and tokens each
produced and how many trajectories crossed versions, from the records'
``segments`` (docs/async.md, docs/rollouts.md "Output").
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from heddle.api import WeightsSpec
from heddle.exceptions import HeddleError
from heddle.rollout import (
    LocalPool,
    LocalWorkerOptions,
    OutputSink,
    PoolPlan,
    build_session,
    local_model_dir,
    perf_model_for,
    prepare_manifests,
    read_records,
)
from heddle.scheduler import PoolShape

HERE = Path(__file__).resolve().parent


def checkpoint(source: Path, target: Path) -> Path:
    """A checkpoint folder holding ``source``'s files (links): the same weights, a new label."""
    target.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        link = target / item.name
        if not link.exists():
            link.symlink_to(item.resolve())
    return target


def manifests(model: str, args: argparse.Namespace, weights: Path) -> list[dict[str, Any]]:
    pool = {
        "apiVersion": "heddle.dev/v1alpha1",
        "kind": "EnginePool",
        "metadata": {"name": "async"},
        "spec": {"model": model, "gpus": 2, "gpusPerNode": 2, "shape": [{"tp": 1, "replicas": 2}],
                 "vllm": {"maxModelLen": 2048}},
    }  # fmt: skip
    job = {
        "apiVersion": "heddle.dev/v1alpha1",
        "kind": "RolloutJob",
        "metadata": {"name": "async-push"},
        "spec": {
            "enginePool": "async",
            "samplesPerTask": args.samples,
            "environment": {"type": "synthetic",
                            "synthetic": {"workload": "quickstart", "seed": 0,
                                          "toolTimeScale": args.tool_scale}},
            "sampling": {"temperature": 1.0, "maxTokensPerTurn": 64, "maxTotalTokens": 256},
            "maxTurns": 4,
            "weights": {"path": str(weights), "version": 0},
            "output": {"path": str(args.out / "rollout.jsonl")},
        },
    }  # fmt: skip
    return [pool, job]


async def main(args: argparse.Namespace) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "rollout.jsonl").unlink(missing_ok=True)
    if args.engine == "vllm":
        model_dir = Path(local_model_dir(args.model, None))
    else:
        model_dir = args.out / "ckpt" / "start"  # the sim engine has no weights: any folder
        model_dir.mkdir(parents=True, exist_ok=True)
    versions = [model_dir] + [checkpoint(model_dir, args.out / "ckpt" / f"v{n}") for n in (1, 2)]
    options = LocalWorkerOptions(
        engine=args.engine,
        model=str(model_dir) if args.engine == "vllm" else None,
        max_model_len=2048,
        weights_roots=(str(model_dir), str(args.out / "ckpt")),
        log_dir=args.out / "logs",
        startup_timeout_s=900.0,
    )
    pool = LocalPool([1, 1], options)
    workers = await pool.start()
    try:
        docs = manifests(str(model_dir), args, versions[0])
        local = prepare_manifests(docs, docs, base=args.out)
        session = build_session(
            local,
            workers,
            OutputSink(local.output),
            plan=PoolPlan(PoolShape.of({1: 2}), "heddle"),
            perf=perf_model_for(local.pool, options),
        )
        run = asyncio.create_task(session.run())
        for n in (1, 2):
            while session.steps < n * args.every and not run.done():
                await asyncio.sleep(0.05)
            if run.done():
                break
            print(f"after {session.steps} steps: pushing weights version {n}", flush=True)
            session.push_weights(WeightsSpec(str(versions[n]), str(n)))
        await run
    finally:
        await asyncio.shield(pool.stop())
    records = read_records(local.output)
    steps: Counter[str] = Counter()
    tokens: Counter[str] = Counter()
    for r in records:
        for s in r["segments"]:
            steps[s["weight_version"]] += 1
            tokens[s["weight_version"]] += s["response_end"] - s["response_start"]
    crossed = sum(len(r["weight_versions"]) > 1 for r in records)
    keys = {(r["task_id"], r["sample"]) for r in records}
    print(f"{len(records)} records ({len(keys)} distinct trajectories), {crossed} crossed versions")
    for version in sorted(steps):
        print(f"  version {version}: {steps[version]} steps, {tokens[version]} tokens")
    print(f"output: {local.output}")
    return 0 if len(keys) == len(records) == len(session.runs) else 1


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=("sim", "vllm"), default="sim")
    p.add_argument("--model", default="smollm2", help="with --engine vllm: smollm2, tiny or a dir")
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--every", type=int, default=30, help="steps between weight pushes")
    p.add_argument("--tool-scale", type=float, default=0.5, help="tool latency x")
    p.add_argument("--out", type=Path, default=HERE / "out")
    return p.parse_args(argv)


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(main(parse())))
    except HeddleError as exc:
        print(f"push_weights: error: {exc}", file=sys.stderr)
        sys.exit(2)
