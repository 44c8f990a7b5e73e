"""A trainer that streams finished GRPO groups off a running rollout, over HTTP.

    .venv/bin/python examples/async/stream_groups.py                          # sim worker
    flock /work/vllm.lock .venv/bin/python examples/async/stream_groups.py --engine vllm

One rollout spans three RL iterations. The job sets ``spec.asynchrony``:
``groupsPerIteration`` (the trainer's batch, the quota that ends an iteration),
``overSample`` (groups started beyond it) and ``maxStalenessVersions``. The
session serves its trainer API (``TrainerServer``); the trainer, with
``heddle.client.TrainerClient``, takes each batch as soon as its groups have
finished (the oldest weight version first), "trains" on it (a stand-in: it sleeps) and
pushes the next weights version over HTTP, while the rollout keeps running:
groups that did not make the batch carry over and go on under the new weights.
Versions 1 and 2 are the starting weights under new labels (folders of links
to the same files; a real trainer writes new weights there), loaded in place.

At the end it checks what the live test checks (nothing lost or duplicated,
every segment's version one that was served then, every batch within the
staleness bound) and prints the length distribution of what the trainer
received against what was started; ``--summary`` writes it all as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from heddle.client import TrainerClient
from heddle.exceptions import HeddleError
from heddle.rollout import (
    LocalPool,
    LocalWorkerOptions,
    OutputSink,
    PoolPlan,
    TrainerServer,
    build_session,
    length_report,
    local_model_dir,
    perf_model_for,
    prepare_manifests,
    read_records,
)
from heddle.scheduler import PoolShape

HERE = Path(__file__).resolve().parent
ITERATIONS = 3


def checkpoint(source: Path, target: Path) -> Path:
    """A checkpoint folder holding ``source``'s files (links): the same weights, a new label."""
    target.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        link = target / item.name
        if not link.exists():
            link.symlink_to(item.resolve())
    return target


def workload(args: argparse.Namespace) -> dict[str, Any]:
    """The quickstart's long-tailed multi-turn shape, at this example's size (workloads.md)."""
    return {
        "name": "stream-groups",
        "prompts": args.tasks,
        "samples_per_prompt": args.samples,
        "prompt_tokens": {"median": 80, "sigma": 0.3, "min": 32, "max": 200},
        "output_tokens": {"median": 2 * args.max_tokens, "group_sigma": 0.7, "within_sigma": 0.5,
                          "max": args.max_tokens * args.turns},
        "turns": {"median": 2, "length_exponent": 0.5, "sigma": 0.3, "max": args.turns},
        "tools": [{"name": "sandbox", "latency_s": {"mean": 0.4, "sigma": 0.5, "max": 3},
                   "output_tokens": {"median": 30, "sigma": 0.5, "min": 8, "max": 100}}],
    }  # fmt: skip


def manifests(model: str, args: argparse.Namespace, weights: Path) -> list[dict[str, Any]]:
    pool = {
        "apiVersion": "heddle.dev/v1alpha1",
        "kind": "EnginePool",
        "metadata": {"name": "stream"},
        "spec": {"model": model, "gpus": 1, "gpusPerNode": 1, "shape": [{"tp": 1, "replicas": 1}],
                 "vllm": {"maxModelLen": 2048}},
    }  # fmt: skip
    job = {
        "apiVersion": "heddle.dev/v1alpha1",
        "kind": "RolloutJob",
        "metadata": {"name": "stream-groups"},
        "spec": {
            "enginePool": "stream",
            "samplesPerTask": args.samples,
            "environment": {"type": "synthetic",
                            "synthetic": {"workload": workload(args), "seed": 0,
                                          "toolTimeScale": args.tool_scale}},
            "sampling": {"temperature": 1.0, "maxTokensPerTurn": args.max_tokens,
                         "maxTotalTokens": args.max_tokens * args.turns},
            "maxTurns": args.turns,
            "weights": {"path": str(weights), "version": 0},
            "asynchrony": {"maxStalenessVersions": args.staleness, "pastBound": "restart",
                           "groupsPerIteration": args.quota, "overSample": args.over_sample},
            "output": {"path": str(args.out / "rollout.jsonl")},
        },
    }  # fmt: skip
    return [pool, job]


def tokens(record: dict[str, Any]) -> int:
    return sum(record["response_mask"])


async def trainer(url: str, token: str, versions: list[Path], args: argparse.Namespace) -> Any:
    """The trainer's loop, all over HTTP: take a batch, train on it, push the next weights."""
    batches, pushes = [], 0
    async with TrainerClient(url, token=token, poll_s=10.0) as client:
        async for batch in client.batches():
            took = time.monotonic()
            state = await client.state()
            groups = batch["groups"]
            lengths = [tokens(r) for g in groups for r in g["records"]]
            print(
                f"iteration {batch['iteration']}: took {len(groups)} groups on version "
                f"{batch['weight_version']} (completion places "
                f"{[g['completed'] for g in groups]}, staleness "
                f"{[g['staleness'] for g in groups]}, mean length "
                f"{sum(lengths) / len(lengths):.1f}); {state['admitted'] - state['taken']} "
                "groups open for the next (over-sampled ones carried over, new ones started)",
                flush=True,
            )
            batches.append({**batch, "open_after_take": state["admitted"] - state["taken"]})
            await asyncio.sleep(args.train_s)  # the stand-in for a gradient step
            following = batch["iteration"] + 1
            if following < len(versions) and not batch["last"]:
                await client.push_weights(str(versions[following]), following)
                pushes += 1
                print(f"  trained {time.monotonic() - took:.1f} s; pushed version {following}")
        final = await client.state()
    return batches, final, pushes


def check(records: list[dict[str, Any]], batches: list[dict[str, Any]], args: argparse.Namespace,
          pushed: int) -> list[str]:  # fmt: skip
    """What must hold; one sentence per breach."""
    wrong = []
    keys = [(r["task_id"], r["sample"]) for r in records]
    if len(keys) != len(set(keys)) or len(keys) != args.tasks * args.samples:
        wrong.append(f"{len(keys)} records, {len(set(keys))} distinct, "
                     f"{args.tasks * args.samples} expected")  # fmt: skip
    groups = [g for b in batches for g in b["groups"]]
    taken = [(g["task_id"], r["sample"]) for g in groups for r in g["records"]]
    if sorted(taken) != sorted(keys):
        wrong.append("the trainer did not get exactly the records in the output")
    if [len(b["groups"]) for b in batches] != [args.quota] * (args.tasks // args.quota):
        wrong.append(f"batch sizes {[len(b['groups']) for b in batches]}")
    for b in batches:
        for g in b["groups"]:
            if g["staleness"] > args.staleness:
                wrong.append(f"group {g['task_id']} trained at staleness {g['staleness']}")
            for r in g["records"]:
                versions = [int(s["weight_version"]) for s in r["segments"]]
                # Each step on a version served when it ran: never newer than the trainer's
                # at the take, never going back, and each one pushed.
                if (
                    versions != sorted(versions)
                    or (versions and versions[-1] > int(b["weight_version"]))
                    or not set(versions) <= set(range(pushed + 1))
                ):
                    wrong.append(f"{r['task_id']}#{r['sample']}: segment versions {versions}")
    return wrong


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
        time_scale=args.time_scale,
    )
    started = time.monotonic()
    pool = LocalPool([1], options)
    workers = await pool.start()
    print(f"worker up in {time.monotonic() - started:.1f} s", flush=True)
    try:
        docs = manifests(str(model_dir), args, versions[0])
        local = prepare_manifests(docs, docs, base=args.out)
        session = build_session(
            local,
            workers,
            OutputSink(local.output),
            plan=PoolPlan(PoolShape.of({1: 1}), "heddle"),
            perf=perf_model_for(local.pool, options),
        )
        server = TrainerServer(session)  # the session's trainer API; a trainer will take
        url = await server.start()
        rolled = time.monotonic()
        run = asyncio.create_task(session.run())
        try:
            batches, final, pushes = await trainer(url, server.token, versions, args)
            await run
        finally:
            run.cancel()
            await server.stop()
        elapsed = time.monotonic() - rolled
    finally:
        await asyncio.shield(pool.stop())
    records = read_records(local.output)
    wrong = check(records, batches, args, pushes)
    crossed = sum(len(r["weight_versions"]) > 1 for r in records)
    first = length_report([tokens(r) for g in batches[0]["groups"] for r in g["records"]],
                          [tokens(r) for r in records])  # fmt: skip
    summary = {
        "elapsed_s": round(elapsed, 1),
        "records": len(records),
        "crossed_versions": crossed,
        "past_bound_restarts": session.past_bound_restarts,
        "steps": session.steps,
        "pushes": pushes,
        "batches": [
            {
                "iteration": b["iteration"],
                "weight_version": b["weight_version"],
                "groups": [g["task_id"] for g in b["groups"]],
                "staleness": [g["staleness"] for g in b["groups"]],
                "open_after_take": b["open_after_take"],
            }
            for b in batches
        ],
        "lengths": final["lengths"],
        "first_batch_vs_all": first.as_json(),
        "wrong": wrong,
    }
    lengths = final["lengths"]
    print(f"{len(records)} records in {elapsed:.1f} s of rollout, {crossed} crossed versions, "
          f"{session.past_bound_restarts} restarted past the bound")  # fmt: skip
    print(f"trained {lengths['trained']} trajectories (mean {lengths['trained_mean_tokens']:.1f} "
          f"tokens, p90 {lengths['trained_p90_tokens']:.0f}) of {lengths['started']} started "
          f"(mean {lengths['started_mean_tokens']:.1f}, p90 {lengths['started_p90_tokens']:.0f}); "
          f"the first batch alone: mean {first.trained_mean_tokens:.1f}, "
          f"p90 {first.trained_p90_tokens:.0f}")  # fmt: skip
    for line in wrong:
        print(f"WRONG: {line}")
    if args.summary is not None:
        args.summary.write_text(json.dumps(summary, indent=1))
    return 1 if wrong else 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=("sim", "vllm"), default="sim")
    p.add_argument("--model", default="smollm2", help="with --engine vllm: smollm2, tiny or a dir")
    p.add_argument("--tasks", type=int, default=6, help="GRPO groups in all (3 x --quota)")
    p.add_argument("--samples", type=int, default=2, help="samples per task (group size)")
    p.add_argument("--quota", type=int, default=2, help="groupsPerIteration")
    p.add_argument("--over-sample", type=float, default=0.5, help="overSample")
    p.add_argument("--staleness", type=int, default=1, help="maxStalenessVersions")
    p.add_argument("--max-tokens", type=int, default=16, help="maxTokensPerTurn")
    p.add_argument("--turns", type=int, default=3, help="maxTurns")
    p.add_argument("--tool-scale", type=float, default=0.3, help="tool latency x")
    p.add_argument("--time-scale", type=float, default=0.05, help="sim engine's time x")
    p.add_argument("--train-s", type=float, default=0.5, help="seconds the stand-in trains")
    p.add_argument("--out", type=Path, default=HERE / "out" / "stream-groups")
    p.add_argument("--summary", type=Path, default=None, help="write the figures as JSON here")
    args = p.parse_args(argv)
    if args.tasks % args.quota or args.tasks // args.quota != ITERATIONS:
        p.error(f"--tasks must be {ITERATIONS} x --quota: the example runs {ITERATIONS} iterations")
    return args


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(main(parse())))
    except HeddleError as exc:
        print(f"stream_groups: error: {exc}", file=sys.stderr)
        sys.exit(2)
