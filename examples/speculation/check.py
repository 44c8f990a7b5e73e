"""Speculation on and off on one engine each, SmolLM2: greedy tokens, T=1 statistics, tok/s.

    flock /work/vllm.lock .venv/bin/python examples/speculation/check.py off,ngram,ngram-unpatched

Prints JSON lines per engine: the greedy 64 tokens, the mean logprob per token over 24
T=1 samples (and the SD of a sample's mean), accepted/drafted at T=1, then tokens/s and
tokens per decode step on the code tasks at 1 and 32 sequences. ``ngram-unpatched``
runs with HEDDLE_VLLM_PATCHES=0 (vLLM's faults left in: docs/speculation.md).
"""

import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

from heddle.worker import Sampling, Speculation, VLLMConfig, VLLMEngine, named_model_dir

LIST = [
    {
        "role": "user",
        "content": "Repeat this list three times: apples, pears, plums, cherries, grapes, "
        "lemons, limes, melons.",
    }
]
TASKS = Path(__file__).resolve().parents[1] / "tasks" / "code.jsonl"
CODE = [json.loads(line)["prompt"] for line in TASKS.read_text().splitlines() if line]


async def run(
    label: str, method: str, table: tuple[tuple[int, int, int], ...], patches: str
) -> None:
    os.environ["HEDDLE_VLLM_PATCHES"] = patches
    e = VLLMEngine(
        VLLMConfig(
            model=str(named_model_dir("smollm2")),
            max_model_len=1024,
            block_size=32,
            max_num_seqs=32,
            speculation=Speculation.of(method, None, table),
        )
    )
    t = time.monotonic()
    await e.start()
    start_s = time.monotonic() - t
    out = {"label": label, "start_s": round(start_s, 1)}
    ctx = e.encode(e.render_chat(LIST, True))
    g = await e.step("g", ctx, Sampling(max_tokens=64, temperature=0.0, ignore_eos=True), 0)
    out["greedy"] = g.token_ids
    out["greedy_accepted"] = g.accepted_tokens
    t = time.monotonic()
    ss = await asyncio.gather(
        *(
            e.step(
                f"s{i}",
                ctx,
                Sampling(max_tokens=48, temperature=1.0, logprobs=True, ignore_eos=True),
                0,
            )
            for i in range(24)
        )
    )
    out["t1_wall"] = round(time.monotonic() - t, 2)
    out["t1_mean_logprob"] = round(statistics.fmean(x for s in ss for x in s.logprobs), 4)
    out["t1_sd_of_sample_means"] = round(
        statistics.stdev(statistics.fmean(s.logprobs) for s in ss), 4
    )
    out["t1_drafted"] = sum(s.drafted_tokens or 0 for s in ss)
    out["t1_accepted"] = sum(s.accepted_tokens or 0 for s in ss)
    out["t1_text0"] = e.decode(ss[0].token_ids)[:120]
    print(json.dumps(out), flush=True)
    for conc in () if label.endswith("unpatched") else (1, 32):
        ctxs = [
            e.encode(e.render_chat([{"role": "user", "content": CODE[(i // 8) % len(CODE)]}], True))
            for i in range(conc)
        ]
        t = time.monotonic()
        rs = await asyncio.gather(
            *(
                e.step(f"c{conc}-{i}", c, Sampling(max_tokens=128, temperature=1.0), 0)
                for i, c in enumerate(ctxs)
            )
        )
        wall = time.monotonic() - t
        tok = sum(len(r.token_ids) for r in rs)
        acc = sum(r.accepted_tokens or 0 for r in rs)
        dr = sum(r.drafted_tokens or 0 for r in rs)
        print(
            json.dumps(
                {
                    "label": label,
                    "concurrency": conc,
                    "tokens": tok,
                    "wall_s": round(wall, 2),
                    "tokens_per_s": round(tok / wall, 1),
                    "drafted": dr,
                    "accepted": acc,
                    "tokens_per_decode_step": round(tok / max(1, tok - acc), 3),
                }
            ),
            flush=True,
        )
    print(json.dumps({"label": label, "stats": str(e.stats())}), flush=True)
    await e.shutdown()


if __name__ == "__main__":
    plan = {
        "off": ("off", (), "1"),
        "ngram": ("ngram", (), "1"),
        "suffix": ("suffix", ((1, 4, 4), (5, 64, 2)), "1"),
        "ngram-unpatched": ("ngram", (), "0"),
    }
    for label in sys.argv[1].split(","):
        asyncio.run(run(label, *plan[label]))
