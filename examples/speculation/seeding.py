"""The drafting corpus on a real suffix engine: tokens per decode step with and without seeding.

    flock /work/vllm.lock .venv/bin/python examples/speculation/seeding.py --prompt 0

One SmolLM2 engine with vLLM's suffix decoding runs, for one prompt of
examples/tasks/code.jsonl (``--prompt``), at T=``--temperature``:

1. an earlier pass: a group of ``--group`` samples (the task's previous iteration);
2. the current group's first ``--first`` samples (siblings that ran on another engine);
3. the group's later ``--later`` samples, four times, each time from an engine whose
   suffix cache holds nothing (``heddle_clear_drafts``) but what the arm seeds through
   the worker's seeding call (``seed_drafts``, what ``POST /v1/drafts`` runs):
   ``own`` nothing; ``siblings`` the first samples' texts; ``history`` the earlier
   pass's texts; ``both`` the two.

Each arm prints one JSON line: output tokens, accepted drafts, and tokens per decode
step (tokens / (tokens - accepted)), from vLLM's own per-request counts. The later
samples run side by side, so every arm also drafts from those in progress on the
same engine, as a group co-located would.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from heddle.worker import Sampling, Speculation, VLLMConfig, VLLMEngine, named_model_dir

TASKS = Path(__file__).resolve().parents[1] / "tasks" / "code.jsonl"
ARMS = ("own", "siblings", "history", "both")


async def _samples(
    engine: VLLMEngine, ctx: list[int], n: int, name: str, args: argparse.Namespace
) -> list[tuple[list[int], int]]:
    sampling = Sampling(max_tokens=args.max_tokens, temperature=args.temperature, seed=None)
    outs = await asyncio.gather(*(engine.step(f"{name}-{i}", ctx, sampling, 0) for i in range(n)))
    return [(list(o.token_ids), o.accepted_tokens or 0) for o in outs]


async def _seed(engine: VLLMEngine, key: str, texts: list[list[int]]) -> int:
    return sum([await engine.seed_drafts(f"{key}-{i}", t) for i, t in enumerate(texts)])


async def run(args: argparse.Namespace) -> None:
    engine = VLLMEngine(
        VLLMConfig(
            model=str(named_model_dir("smollm2")),
            max_model_len=2048,
            block_size=32,
            max_num_seqs=max(args.group, args.later),
            speculation=Speculation.of("suffix", args.k),
        )
    )
    await engine.start()
    try:
        prompts = [json.loads(line) for line in TASKS.read_text().splitlines() if line]
        task = prompts[args.prompt]
        ctx = engine.encode(engine.render_chat([{"role": "user", "content": task["prompt"]}], True))
        clear = "heddle_clear_drafts"
        await engine._llm.collective_rpc(clear)
        earlier = [t for t, _ in await _samples(engine, ctx, args.group, "earlier", args)]
        await engine._llm.collective_rpc(clear)
        first = [t for t, _ in await _samples(engine, ctx, args.first, "first", args)]
        for arm in ARMS:
            await engine._llm.collective_rpc(clear)
            seeded = 0
            if arm in ("siblings", "both"):
                seeded += await _seed(engine, "sibling", first)
            if arm in ("history", "both"):
                seeded += await _seed(engine, "history", earlier)
            t0 = time.monotonic()
            later = await _samples(engine, ctx, args.later, arm, args)
            tokens = sum(len(t) for t, _ in later)
            accepted = sum(a for _, a in later)
            print(
                json.dumps(
                    {
                        "task": task["id"],
                        "arm": arm,
                        "seeded_texts": seeded,
                        "samples": args.later,
                        "temperature": args.temperature,
                        "k": args.k,
                        "tokens": tokens,
                        "accepted": accepted,
                        "tokens_per_decode_step": round(tokens / max(1, tokens - accepted), 3),
                        "wall_s": round(time.monotonic() - t0, 1),
                    }
                ),
                flush=True,
            )
    finally:
        await engine.shutdown()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompt", type=int, default=0, help="line of examples/tasks/code.jsonl")
    p.add_argument("--group", type=int, default=8, help="samples of the earlier pass")
    p.add_argument("--first", type=int, default=4, help="siblings that ran elsewhere")
    p.add_argument("--later", type=int, default=4, help="the samples measured, per arm")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--k", type=int, default=4, help="speculative tokens per step")
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
