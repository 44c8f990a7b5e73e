"""Speculation on a real vLLM engine: tokens/s and tokens per decode step, by method.

    flock /work/vllm.lock .venv/bin/python examples/speculation/measure.py \\
        --methods off,ngram,suffix --concurrency 1,32 --temperature 1.0

For each method one engine (SmolLM2 by default) runs the code tasks of
examples/tasks/code.jsonl at each concurrency: ``concurrency`` sequences at once,
``--rounds`` times, ``--max-tokens`` each. It prints one JSON line per (method,
concurrency): output tokens/s over the batch's wall time, and tokens per decode step
(generated tokens / (generated - accepted drafts): 1.0 means speculation gained
nothing) from vLLM's own per-request counts. ``--methods suffix --seed-experiment``
measures the drafting corpus instead: per prompt, a group's tokens per decode step
with an empty suffix cache, unseeded against seeded with another group of the same
prompt (the engine's seed_drafts, as siblings run elsewhere would be).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from heddle.worker import Sampling, Speculation, VLLMConfig, VLLMEngine, named_model_dir

TASKS = Path(__file__).resolve().parents[1] / "tasks" / "code.jsonl"


async def _measure(args: argparse.Namespace, method: str) -> list[dict[str, Any]]:
    engine = VLLMEngine(
        VLLMConfig(
            model=str(named_model_dir(args.model)),
            max_model_len=2048,
            block_size=32,
            max_num_seqs=max(args.concurrency),
            speculation=Speculation.of(method, args.k),
        )
    )
    started = time.monotonic()
    await engine.start()
    start_s = time.monotonic() - started
    prompts = [json.loads(line)["prompt"] for line in TASKS.read_text().splitlines() if line]
    contexts = [
        engine.encode(engine.render_chat([{"role": "user", "content": p}], True)) for p in prompts
    ]
    if args.seed_experiment:
        await _seed_experiment(args, engine, contexts)
        await engine.shutdown()
        return []
    results = []
    for concurrency in args.concurrency:
        tokens = accepted = drafted = 0
        wall = 0.0
        for r in range(args.rounds):
            # Siblings: `concurrency` samples spread over a few prompts, as GRPO groups.
            batch = [
                contexts[(r * 3 + i // args.group) % len(contexts)] for i in range(concurrency)
            ]
            t0 = time.monotonic()
            outs = await asyncio.gather(
                *(
                    engine.step(
                        f"m{method}-c{concurrency}-r{r}-{i}",
                        ctx,
                        Sampling(max_tokens=args.max_tokens, temperature=args.temperature),
                        0,
                    )
                    for i, ctx in enumerate(batch)
                )
            )
            wall += time.monotonic() - t0
            for o in outs:
                tokens += len(o.token_ids)
                accepted += o.accepted_tokens or 0
                drafted += o.drafted_tokens or 0
        results.append(
            {
                "method": method,
                "k": args.k,
                "concurrency": concurrency,
                "temperature": args.temperature,
                "rounds": args.rounds,
                "tokens": tokens,
                "tokens_per_s": round(tokens / wall, 1),
                "accepted": accepted,
                "drafted": drafted,
                "tokens_per_decode_step": round(tokens / max(1, tokens - accepted), 3),
                "engine_start_s": round(start_s, 1),
            }
        )
        print(json.dumps(results[-1]), flush=True)
    await engine.shutdown()
    return results


async def _group(
    engine: VLLMEngine, args: argparse.Namespace, ctx: list[int], name: str
) -> tuple[list[list[int]], int, int]:
    """One GRPO group: ``args.group`` samples of one prompt at once. (texts, tokens, accepted)"""
    outs = await asyncio.gather(
        *(
            engine.step(
                f"{name}-{i}",
                ctx,
                Sampling(max_tokens=args.max_tokens, temperature=args.temperature, seed=None),
                0,
            )
            for i in range(args.group)
        )
    )
    return (
        [o.token_ids for o in outs],
        sum(len(o.token_ids) for o in outs),
        sum(o.accepted_tokens or 0 for o in outs),
    )


async def _seed_experiment(
    args: argparse.Namespace, engine: VLLMEngine, contexts: list[list[int]]
) -> None:
    """Per prompt: a group run elsewhere (here, then forgotten), then the same prompt's
    group with an empty suffix cache, unseeded and seeded with the first group's text."""
    totals = {"unseeded": [0, 0], "seeded": [0, 0]}
    for p, ctx in enumerate(contexts[: args.prompts]):
        await engine._llm.collective_rpc("heddle_clear_drafts")
        elsewhere, _, _ = await _group(engine, args, ctx, f"x{p}")
        for arm in ("unseeded", "seeded"):
            await engine._llm.collective_rpc("heddle_clear_drafts")
            if arm == "seeded":
                for i, text in enumerate(elsewhere):
                    await engine.seed_drafts(f"p{p}-{i}", text)
            _, tokens, accepted = await _group(engine, args, ctx, f"{arm}{p}")
            totals[arm][0] += tokens
            totals[arm][1] += accepted
    for arm, (tokens, accepted) in totals.items():
        print(
            json.dumps(
                {
                    "arm": arm,
                    "prompts": args.prompts,
                    "group": args.group,
                    "temperature": args.temperature,
                    "tokens": tokens,
                    "accepted": accepted,
                    "tokens_per_decode_step": round(tokens / max(1, tokens - accepted), 3),
                }
            ),
            flush=True,
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--methods", default="off,ngram,suffix")
    p.add_argument("--concurrency", default="1,32")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--group", type=int, default=8, help="samples per prompt (siblings)")
    p.add_argument("--k", type=int, default=4, help="speculative tokens per step")
    p.add_argument(
        "--seed-experiment",
        action="store_true",
        help="suffix: a group's tokens per decode step unseeded against seeded with an "
        "earlier group of the same prompt (run elsewhere)",
    )
    p.add_argument("--prompts", type=int, default=4, help="--seed-experiment: prompts")
    args = p.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    for method in args.methods.split(","):
        asyncio.run(_measure(args, method))


if __name__ == "__main__":
    main()
