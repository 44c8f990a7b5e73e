"""A whole RL loop on one machine: GRPO on a real model, rolled out by Heddle, trained with torch.

    .venv/bin/python examples/training-loop/grpo.py                     # 8 iterations
    .venv/bin/python examples/training-loop/grpo.py --iterations 2 --prompts 4 --samples 4

Each iteration rolls out math tasks (GRPO groups of ``--samples`` per prompt,
exact-answer reward) on local vLLM workers (CPU build) that stay up for the
whole run, takes one policy-gradient step on the full model with torch (all
135M parameters of SmolLM2-135M-Instruct, AdamW; no LoRA), writes the new
weights as a checkpoint, and names it in the next rollout's ``spec.weights``:
the session pushes it to every worker with ``POST /v1/weights`` (loaded in
place, no restart) before the first step, and every record carries its
``weight_version``. At the end it prints the reward per iteration and plots
it (``OUT/reward.png``). docs/client.md ("A whole RL loop on one machine")
has a run's figures.

The loss is GRPO's on-policy form: per group, advantage = (reward - group
mean) / (group std + 1e-4); loss = -mean over trajectories of advantage times
the mean log-probability of the tokens the model generated (the records'
``response_token_ids`` where ``response_mask`` is 1), the very tokens vLLM
sampled at temperature 1. One update per rollout, so the ratio to the sampling
policy is 1 and no clipping or KL term is needed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

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
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def math_tasks(prompts: int, seed: int) -> list[dict[str, Any]]:
    """Arithmetic word problems with their exact answers (seeded)."""
    rng = random.Random(seed)
    tasks = []
    for i in range(prompts):
        a, b = rng.randint(2, 40), rng.randint(2, 40)
        kind = i % 3
        if kind == 0:
            question, answer = f"What is {a} + {b}?", a + b
        elif kind == 1:
            question, answer = f"Tom has {a + b} apples and gives {b} to Ann. How many are left?", a
        else:
            n = b % 8 + 2
            question, answer = f"A box holds {a} pens. How many pens are in {n} boxes?", a * n
        prompt = f"{question} Answer with the number only."
        tasks.append({"id": f"math-{i:03d}", "prompt": prompt, "metadata": {"answer": answer}})
    return tasks


def reward_of(record: dict[str, Any]) -> float:
    """1.0 when the last number of the answer is the task's answer, else 0.0."""
    if record["status"] != "done":
        return 0.0
    text = str(record["messages"][-1].get("content") or "")
    numbers = NUMBER.findall(text.replace(",", ""))
    return float(bool(numbers) and float(numbers[-1]) == float(record["metadata"]["answer"]))


def manifests(
    model: str, tasks: list[dict[str, Any]], args: argparse.Namespace, it: int, ckpt: Path
) -> list[dict[str, Any]]:
    pool = {
        "apiVersion": "heddle.dev/v1alpha1",
        "kind": "EnginePool",
        "metadata": {"name": "grpo"},
        "spec": {"model": model, "gpus": args.workers, "gpusPerNode": args.workers,
                 "shape": [{"tp": 1, "replicas": args.workers}],
                 "vllm": {"maxModelLen": 1024}},
    }  # fmt: skip
    job = {
        "apiVersion": "heddle.dev/v1alpha1",
        "kind": "RolloutJob",
        "metadata": {"name": f"grpo-{it}"},
        "spec": {
            "enginePool": "grpo",
            "tasks": {"inline": tasks},
            "samplesPerTask": args.samples,
            "environment": {"type": "tools"},  # no tools: one answer per trajectory
            "sampling": {"temperature": 1.0, "topP": 1.0, "seed": args.seed + it,
                         "maxTokensPerTurn": args.max_tokens, "maxTotalTokens": args.max_tokens},
            "maxTurns": 1,
            "weights": {"path": str(ckpt), "version": it},
            "output": {"path": str(args.out / f"iter-{it}.jsonl"), "trace": True},
        },
    }  # fmt: skip
    return [pool, job]


def grpo_step(
    model: Any, optimizer: Any, records: list[dict[str, Any]], rewards: list[float]
) -> float:
    """One policy-gradient step on the groups; returns the loss."""
    import torch  # noqa: PLC0415 - the example's own dependency

    groups: dict[str, list[int]] = {}
    for i, r in enumerate(records):
        groups.setdefault(r["task_id"], []).append(i)
    advantages = [0.0] * len(records)
    for members in groups.values():
        values = [rewards[i] for i in members]
        mean, std = statistics.fmean(values), statistics.pstdev(values)
        for i in members:
            advantages[i] = (rewards[i] - mean) / (std + 1e-4)
    used = [i for i, a in enumerate(advantages) if a != 0.0 and records[i]["response_token_ids"]]
    optimizer.zero_grad()
    total = 0.0
    for i in used:  # one sequence at a time: memory stays flat on a small machine
        r = records[i]
        prompt, response = r["prompt_token_ids"], r["response_token_ids"]
        ids = torch.tensor([prompt + response])
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
        logp = torch.log_softmax(logits, dim=-1)
        target = torch.tensor(response)
        mask = torch.tensor(r["response_mask"], dtype=torch.float32)
        token_logp = logp.gather(1, target[:, None])[:, 0]
        seq_logp = (token_logp * mask).sum() / mask.sum().clamp(min=1.0)
        loss = -advantages[i] * seq_logp / len(used)
        loss.backward()
        total += float(loss.detach())
    if used:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    return total


def save_checkpoint(model: Any, path: Path) -> None:
    """The weights as the workers hold them (bf16), in the layout they loaded at start."""
    import torch  # noqa: PLC0415

    state = {k: v.detach().to(torch.bfloat16) for k, v in model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)  # tied to the embeddings: not in the checkpoint
    model.save_pretrained(path, state_dict=state)


def plot(rewards: list[float], path: Path) -> bool:
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot(range(len(rewards)), rewards, marker="o")
    ax.set_xticks(range(len(rewards)))
    ax.set_xlabel("iteration (weight version)")
    ax.set_ylabel("mean reward (exact answer)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    import torch  # noqa: PLC0415
    from transformers import AutoModelForCausalLM  # noqa: PLC0415

    torch.manual_seed(args.seed)
    model_dir = Path(local_model_dir(args.model, None))  # "smollm2": converted once, cached
    tasks = math_tasks(args.prompts, args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    # Trained in float32 (bf16 Adam steps of 1e-5 round away); pushed as the workers' bf16.
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    policy.train()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=args.lr, weight_decay=0.0)
    options = LocalWorkerOptions(
        model=str(model_dir),
        max_model_len=1024,
        # The workers load in place only under their weights roots: the starting weights
        # (iteration 0) and the folder this loop saves its checkpoints in.
        weights_roots=(str(model_dir), str(args.out / "ckpt")),
        log_dir=args.out / "logs",
        startup_timeout_s=900.0,  # a shared 2-core machine can take minutes to start vLLM
    )
    pool = LocalPool([1] * args.workers, options)
    history: list[dict[str, Any]] = []
    started = time.monotonic()
    workers = await pool.start()
    print(f"{args.workers} workers up in {time.monotonic() - started:.0f} s", flush=True)
    try:
        ckpt = model_dir  # iteration 0 rolls out the starting weights
        for it in range(args.iterations):
            t0 = time.monotonic()
            docs = manifests(str(model_dir), tasks, args, it, ckpt)
            local = prepare_manifests(docs, docs, base=args.out)
            session = build_session(
                local,
                workers,
                OutputSink(local.output),
                plan=PoolPlan(PoolShape.of({1: args.workers}), "heddle"),
                perf=perf_model_for(local.pool, options),
            )
            await session.run()
            rollout_s = time.monotonic() - t0
            records = sorted(
                read_records(local.output), key=lambda r: (r["task_index"], r["sample"])
            )
            rewards = [reward_of(r) for r in records]
            assert {r["weight_version"] for r in records} == {str(it)}
            t1 = time.monotonic()
            loss = await asyncio.to_thread(grpo_step, policy, optimizer, records, rewards)
            ckpt = args.out / "ckpt" / f"iter-{it + 1}"
            await asyncio.to_thread(save_checkpoint, policy, ckpt)
            train_s = time.monotonic() - t1
            row = {
                "iteration": it,
                "weight_version": str(it),
                "mean_reward": statistics.fmean(rewards),
                "trajectories": len(records),
                "mean_response_tokens": statistics.fmean(
                    len(r["response_token_ids"]) for r in records
                ),
                "loss": loss,
                "rollout_s": rollout_s,
                "train_s": train_s,
            }
            history.append(row)
            print(
                f"iteration {it}: reward {row['mean_reward']:.3f} over {len(records)} "
                f"trajectories (weights version {it}), {row['mean_response_tokens']:.0f} tokens "
                f"each; rollout {rollout_s:.0f} s, train + save {train_s:.0f} s",
                flush=True,
            )
    finally:
        await asyncio.shield(pool.stop())
    total = time.monotonic() - started
    (args.out / "history.json").write_text(json.dumps({"iterations": history, "total_s": total}))
    print(f"total {total:.0f} s for {args.iterations} iterations")
    if plot([h["mean_reward"] for h in history], args.out / "reward.png"):
        print(f"plot: {args.out / 'reward.png'}")
    return history


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="a named model or a model directory")
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=16, help="tasks per rollout")
    parser.add_argument("--samples", type=int, default=8, help="GRPO group size")
    parser.add_argument("--max-tokens", type=int, default=64, help="per answer")
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--workers", type=int, default=2, help="TP1 workers, one CPU core each")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=HERE / "out-grpo")
    cli = parser.parse_args()
    try:
        asyncio.run(main(cli))
    except HeddleError as exc:
        sys.exit(f"grpo.py: error: {exc}")
