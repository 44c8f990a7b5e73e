"""Import contexts into one worker until past its cap; print resident count and RSS.

The probe of issue 24 (a worker accepted 2,000 imports and kept them all):
``python -m tests.worker._resident_probe CAP TOKENS EXTRA`` imports CAP + EXTRA
contexts of TOKENS token ids each into an in-process worker app (sim engine,
over ASGI) and prints what stays resident and the process's RSS.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time

import httpx

from heddle.rollout import load_cluster
from heddle.worker import SimulatedEngine, create_app, trajectory_id


def rss_mib() -> float:
    with open(f"/proc/{os.getpid()}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def main(cap: int, tokens: int, extra: int) -> None:
    perf = load_cluster("64xh100").perf_model()
    engine = SimulatedEngine(perf, time_scale=0.01, max_model_len=65536)
    app = create_app(engine, max_resident=cap)
    rng = random.Random(0)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://w") as c,
    ):
        before = rss_mib()
        started = time.monotonic()
        for i in range(cap + extra):
            body = {"token_ids": [rng.randrange(0, engine.vocab_size) for _ in range(tokens)]}
            reply = await c.put(f"/v1/trajectories/{trajectory_id('probe', i, 0)}", json=body)
            assert reply.status_code == 200, reply.text
            if i + 1 in (cap // 2, cap, cap + extra):
                s = (await c.get("/v1/state")).json()
                print(
                    f"after {i + 1} imports: resident {s['resident_trajectories']} "
                    f"(cap {s['max_resident']}), dropped {s['dropped_contexts']}, "
                    f"RSS {rss_mib():.0f} MiB (+{rss_mib() - before:.0f} MiB)",
                    flush=True,
                )
        print(f"{cap + extra} imports of {tokens} tokens in {time.monotonic() - started:.1f} s")
        purged = (await c.delete("/v1/trajectories", params={"job": "probe"})).json()
        left = (await c.get("/v1/state")).json()["resident_trajectories"]
        print(f"purge: {purged}; resident after it: {left}")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])))
