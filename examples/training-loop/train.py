"""A training loop on Heddle: roll out, train on GRPO groups as they finish, write weights, repeat.

    .venv/bin/python examples/training-loop/train.py                 # vLLM's CPU build, tiny model
    .venv/bin/python examples/training-loop/train.py --engine sim    # the simulated engine

Each step submits examples/training-loop/job.yaml on the tiny pool (examples/synthetic) with
``spec.weights`` naming the checkpoint of that step; the workers load it in
place (no restart) and every record carries its ``weight_version``. The
trainer takes each task's group of samples as soon as all of them are written,
while the rest of the rollout still runs. The update step here is a stand-in:
it averages the group's rewards and writes the next checkpoint with
``heddle model tiny`` (new random weights of the pool's model). The sim engine
has no weights and records only the version, so on sim the stand-in writes an
empty checkpoint directory instead.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
from pathlib import Path

from heddle.client import Group, Rollout
from heddle.exceptions import HeddleError
from heddle.export import read_rollouts

HERE = Path(__file__).resolve().parent
POOL = HERE.parent / "synthetic" / "pool.yaml"


def write_checkpoint(path: Path, step: int, engine: str) -> None:
    """The stand-in for a trainer's update: the weights the next rollout uses."""
    if engine == "sim":
        path.mkdir(parents=True, exist_ok=True)  # the sim checks the directory, loads nothing
        return
    subprocess.run(  # same architecture and shapes as the pool's tiny model: loads in place
        [sys.executable, "-m", "heddle", "model", "tiny", str(path), "--seed", str(step)],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def train_on(group: Group) -> float:
    """The stand-in for a gradient step on one GRPO group: its mean response length."""
    return statistics.fmean(len(r["response_token_ids"]) for r in group.records)


async def rollout_step(step: int, out: Path, engine: str, time_scale: float) -> Path:
    checkpoint = out / "ckpt" / f"step-{step}"
    write_checkpoint(checkpoint, step, engine)
    output = out / f"step-{step}.jsonl"
    rollout = await Rollout.submit_local(
        HERE / "job.yaml",
        pool=POOL,
        engine=engine,
        time_scale=time_scale,
        spec={
            "weights": {"path": str(checkpoint), "version": step},
            "output": {"path": str(output)},
        },
    )
    early = 0
    async for group in rollout.groups():
        p = await rollout.progress()
        if p.done + p.failed < p.total:
            early += 1  # trained on while other trajectories were still running
        train_on(group)
    summary = await rollout.wait()
    done = summary["progress"]
    print(
        f"step {step}: {done['done']} trajectories with weights version {step}; "
        f"{early} of {done['total'] // rollout.samples_per_task} groups trained on "
        "while trajectories were still running"
    )
    return output


async def main(steps: int, out: Path, engine: str, time_scale: float) -> None:
    outputs = [await rollout_step(step, out, engine, time_scale) for step in range(1, steps + 1)]
    for output in outputs:  # what a trainer reads afterwards: the export reader, slime's fields
        rows = read_rollouts(output, "slime")
        versions = sorted({v for row in rows for v in row["weight_versions"]})
        print(f"{output}: weight versions {versions}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("vllm", "sim"), default="vllm")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--out", type=Path, default=HERE / "out")
    parser.add_argument("--time-scale", type=float, default=1.0, help="sim: scale its times")
    args = parser.parse_args()
    try:
        asyncio.run(main(args.steps, args.out, args.engine, args.time_scale))
    except HeddleError as exc:
        sys.exit(f"train.py: error: {exc}")
