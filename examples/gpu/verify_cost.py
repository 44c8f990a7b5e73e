"""Time one speculative verification step of a Qwen3-shaped model on a GPU.

A decode step with speculation runs b sequences x (k+1) query tokens through
the model: the weights are read once, each sequence's KV cache is read once,
and the matrix work grows with b*(k+1). This script measures that step with
random ("dummy") weights in plain PyTorch, captured as a CUDA graph the way
vLLM runs decode, so the figures are the engine's forward time without
scheduling or sampling. It needs only torch with CUDA (vLLM is not used: it
cannot be installed on the lent GPU machines, which have no network).

What it leaves out, on purpose: rotary embeddings and the q/k norms
(elementwise, under 2% of a step), the causal mask among the k+1 new tokens
(the kernel reads the same KV either way), and tensor parallelism (one GPU).

Usage: python examples/gpu/verify_cost.py --out verify.json [--model qwen3-8b]
       [--budget-s 300]
Writes one JSON object: the device, the model shape and one row per
(batch, k, context) with the median, p10 and p90 step time in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as nnf


@dataclass(frozen=True)
class Shape:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int


# From the models' config.json on the Hugging Face hub (Qwen/Qwen3-8B, -14B, -32B).
SHAPES = {
    "qwen3-8b": Shape("qwen3-8b", 36, 4096, 32, 8, 128, 12288, 151936),
    "qwen3-14b": Shape("qwen3-14b", 40, 5120, 40, 8, 128, 17408, 151936),
    "qwen3-32b": Shape("qwen3-32b", 64, 5120, 64, 8, 128, 25600, 151936),
}

L2_BYTES = 64 << 20  # KV buffers re-used across layers must each be larger than L2


class Stack:
    """The layer stack with random bf16 weights and one KV buffer per layer (or a ring)."""

    def __init__(self, shape: Shape, device: torch.device) -> None:
        self.shape = shape
        dt = torch.bfloat16
        h, hd = shape.hidden, shape.head_dim
        qkv_out = (shape.heads + 2 * shape.kv_heads) * hd

        def w(rows: int, cols: int) -> torch.Tensor:
            return torch.randn(rows, cols, device=device, dtype=dt) * 0.02

        self.layers = [
            {
                "qkv": w(qkv_out, h),
                "o": w(h, shape.heads * hd),
                "gate_up": w(2 * shape.intermediate, h),
                "down": w(h, shape.intermediate),
                "n1": torch.ones(h, device=device, dtype=dt),
                "n2": torch.ones(h, device=device, dtype=dt),
            }
            for _ in range(shape.layers)
        ]
        self.lm_head = w(shape.vocab, h)
        self.device = device

    def kv_ring(self, batch: int, context: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        s = self.shape
        per_layer = 2 * batch * s.kv_heads * context * s.head_dim * 2
        free = torch.cuda.mem_get_info(self.device)[0] - (8 << 30)
        n = s.layers if per_layer * s.layers <= free else max(2, int(free // per_layer))
        if per_layer * n > free:
            raise MemoryError("KV does not fit")
        if n < s.layers and per_layer < L2_BYTES:
            n = s.layers
        shape = (batch, s.kv_heads, context, s.head_dim)
        return [
            (
                torch.randn(shape, device=self.device, dtype=torch.bfloat16),
                torch.randn(shape, device=self.device, dtype=torch.bfloat16),
            )
            for _ in range(n)
        ]

    def forward(self, x: torch.Tensor, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """x: (batch, q, hidden); each query attends to its context plus the q new tokens."""
        s = self.shape
        b, q, _ = x.shape
        for i, layer in enumerate(self.layers):
            k_cache, v_cache = kv[i % len(kv)]
            hn = nnf.rms_norm(x, (s.hidden,), layer["n1"])
            qkv = hn @ layer["qkv"].t()
            kv_width = s.kv_heads * s.head_dim
            qh, kh, vh = qkv.split([s.heads * s.head_dim, kv_width, kv_width], -1)
            # Grouped-query attention as plain attention: the query heads that share a KV
            # head become extra query rows of it (exact without a mask among new tokens).
            group = s.heads // s.kv_heads
            qh = qh.view(b, q, s.kv_heads, group, s.head_dim).permute(0, 2, 1, 3, 4)
            qh = qh.reshape(b, s.kv_heads, q * group, s.head_dim)
            kh = kh.view(b, q, s.kv_heads, s.head_dim).transpose(1, 2)
            vh = vh.view(b, q, s.kv_heads, s.head_dim).transpose(1, 2)
            # The new tokens' KV is written where the cache ends, as a paged cache would.
            ctx = k_cache.shape[2]
            k_cache[:, :, ctx - q :, :] = kh
            v_cache[:, :, ctx - q :, :] = vh
            att = nnf.scaled_dot_product_attention(qh, k_cache, v_cache)
            att = att.view(b, s.kv_heads, q, group, s.head_dim).permute(0, 2, 1, 3, 4)
            x = x + att.reshape(b, q, s.heads * s.head_dim) @ layer["o"].t()
            hn = nnf.rms_norm(x, (s.hidden,), layer["n2"])
            gate, up = (hn @ layer["gate_up"].t()).chunk(2, -1)
            x = x + (nnf.silu(gate) * up) @ layer["down"].t()
        return x @ self.lm_head.t()


def time_step(stack: Stack, batch: int, q: int, context: int, reps: int) -> list[float]:
    kv = stack.kv_ring(batch, context)
    x = torch.randn(batch, q, stack.shape.hidden, device=stack.device, dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            stack.forward(x, kv)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        stack.forward(x, kv)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    del graph, kv, x
    torch.cuda.empty_cache()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default="qwen3-8b", choices=sorted(SHAPES))
    parser.add_argument("--batches", default="1,4,16,32,64,128,256")
    parser.add_argument("--ks", default="0,1,2,4,8")
    parser.add_argument("--contexts", default="1024,8192")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--budget-s", type=float, default=300.0)
    args = parser.parse_args()
    device = torch.device("cuda")
    torch.manual_seed(0)
    stack = Stack(SHAPES[args.model], device)
    result: dict[str, object] = {
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "model": asdict(stack.shape),
        "weights": "random bf16 (dummy), CUDA graph per configuration",
        "rows": [],
    }
    rows: list[dict[str, object]] = result["rows"]  # type: ignore[assignment]
    began = time.monotonic()
    for context in (int(c) for c in args.contexts.split(",")):
        for batch in (int(b) for b in args.batches.split(",")):
            for k in (int(k) for k in args.ks.split(",")):
                if time.monotonic() - began > args.budget_s:
                    result["stopped"] = "time budget reached"
                    break
                try:
                    times = time_step(stack, batch, k + 1, context, args.reps)
                except (MemoryError, torch.OutOfMemoryError) as err:
                    error = str(err)[:120]
                    rows.append({"batch": batch, "k": k, "context": context, "error": error})
                    torch.cuda.empty_cache()
                    continue
                qs = statistics.quantiles(times, n=10)
                row = {
                    "batch": batch,
                    "k": k,
                    "context": context,
                    "ms_median": round(statistics.median(times), 4),
                    "ms_p10": round(qs[0], 4),
                    "ms_p90": round(qs[-1], 4),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
                args.out.write_text(json.dumps(result, indent=1))
    result["elapsed_s"] = round(time.monotonic() - began, 1)
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
