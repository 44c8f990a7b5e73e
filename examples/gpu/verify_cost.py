"""Time one speculative verification step of a Qwen3-shaped model on a GPU.

A decode step with speculation runs b sequences x (k+1) query tokens through
the model: the weights are read once, each sequence's KV cache is read once,
and the matrix work grows with b*(k+1). This script measures that step with
random ("dummy") weights in plain PyTorch, captured as a CUDA graph the way
vLLM runs decode, so the figures are the engine's forward time without
scheduling or sampling. It needs only torch with CUDA (vLLM is not used: it
cannot be installed on the lent GPU machines, which have no network).

With ``--tp N`` it times what one GPU of an N-way tensor-parallel engine
runs, laid out as vLLM shards it: a 1/N share of the query heads, the KV
heads (each replicated where there are fewer than N), the MLP's intermediate
width and the vocabulary. The two all-reduces per layer that join the shards
are not timed (one GPU has no peer); the performance model costs them apart.

What it leaves out, on purpose: rotary embeddings and the q/k norms
(elementwise, under 2% of a step), the causal mask among the k+1 new tokens
(the kernel reads the same KV either way), and the all-reduces (above).

Usage: python examples/gpu/verify_cost.py --out verify.json [--model qwen3-8b]
       [--tp 1] [--budget-s 300]
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

    def shard(self, tp: int) -> Shape:
        """The share one GPU of a ``tp``-way tensor-parallel engine holds (vLLM's layout)."""
        if tp < 1 or self.heads % tp or self.intermediate % tp or self.vocab % tp:
            raise SystemExit(
                f"--tp {tp} does not divide {self.name}'s {self.heads} heads, "
                f"{self.intermediate} intermediate width and {self.vocab} vocabulary; "
                "pass 1, 2, 4 or 8"
            )
        return Shape(
            self.name,
            self.layers,
            self.hidden,
            self.heads // tp,
            max(1, self.kv_heads // tp),  # vLLM replicates KV heads when tp exceeds them
            self.head_dim,
            self.intermediate // tp,
            self.vocab // tp,
        )


# From the models' config.json on the Hugging Face hub (Qwen/Qwen3-8B, -14B, -32B).
SHAPES = {
    "qwen3-8b": Shape("qwen3-8b", 36, 4096, 32, 8, 128, 12288, 151936),
    "qwen3-14b": Shape("qwen3-14b", 40, 5120, 40, 8, 128, 17408, 151936),
    "qwen3-32b": Shape("qwen3-32b", 64, 5120, 64, 8, 128, 25600, 151936),
}

L2_BYTES = 64 << 20  # KV buffers re-used across layers must each be larger than L2


class Stack:
    """The layer stack with random bf16 weights and one KV buffer per layer (or a ring)."""

    def __init__(
        self, shape: Shape, device: torch.device, attention: str = "sdpa", sms: int = 132
    ) -> None:
        self.shape = shape
        self.attention = attention
        self.sms = sms
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

    def splits(self, batch: int, context: int) -> int:
        """Pieces each sequence's context is cut into for ``--attention split``.

        Decode attention has one block of work per (sequence, KV head): at a small
        batch, or with the few KV heads one GPU of a TP engine holds, that leaves most of
        the GPU idle. vLLM's decode kernels (FlashAttention's split-KV, FlashInfer) cut
        the context into pieces until the GPU is filled, then join them by their
        log-sum-exp; this does the same, with pieces of at least 256 tokens.
        """
        if self.attention != "split":
            return 1
        pieces = 1
        while (
            batch * self.shape.kv_heads * pieces < self.sms
            and context % (pieces * 2) == 0
            and context // (pieces * 2) >= 256
        ):
            pieces *= 2
        return pieces

    def kv_ring(self, batch: int, context: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        s = self.shape
        per_layer = 2 * batch * s.kv_heads * context * s.head_dim * 2
        free = torch.cuda.mem_get_info(self.device)[0] - (8 << 30)
        n = s.layers if per_layer * s.layers <= free else max(2, int(free // per_layer))
        if per_layer * n > free:
            raise MemoryError("KV does not fit")
        if n < s.layers and per_layer < L2_BYTES:
            n = s.layers
        pieces = self.splits(batch, context)
        # (sequence, piece, KV head, token, dim): each piece is contiguous, as a paged
        # cache's blocks are, so cutting the context costs no copy.
        shape = (batch, pieces, s.kv_heads, context // pieces, s.head_dim)
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
            piece = k_cache.shape[3]
            k_cache[:, -1, :, piece - q :, :] = kh
            v_cache[:, -1, :, piece - q :, :] = vh
            if self.attention == "split":
                att = attend_in_pieces(qh, k_cache, v_cache)
            else:
                att = nnf.scaled_dot_product_attention(qh, k_cache[:, 0], v_cache[:, 0])
            att = att.view(b, s.kv_heads, q, group, s.head_dim).permute(0, 2, 1, 3, 4)
            x = x + att.reshape(b, q, s.heads * s.head_dim) @ layer["o"].t()
            hn = nnf.rms_norm(x, (s.hidden,), layer["n2"])
            gate, up = (hn @ layer["gate_up"].t()).chunk(2, -1)
            x = x + (nnf.silu(gate) * up) @ layer["down"].t()
        return x @ self.lm_head.t()


def _attend_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flash attention's output and per-row log-sum-exp, (B, H, L, D) and (B, H, L)."""
    if q.is_cuda:
        out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v)
    else:
        out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)
    return out[0], out[1][..., : q.shape[2]]


def attend_in_pieces(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
    """Attention of q (B, H, L, D) over a cache cut into pieces (B, P, H, T, D): each piece
    attends on its own, in parallel, and the pieces are joined by their log-sum-exp."""
    b, pieces, h, t, d = k_cache.shape
    rows = q.shape[2]
    if pieces == 1:
        return _attend_with_lse(q, k_cache[:, 0], v_cache[:, 0])[0]
    qp = q.unsqueeze(1).expand(b, pieces, h, rows, d).reshape(b * pieces, h, rows, d)
    out, lse = _attend_with_lse(
        qp, k_cache.view(b * pieces, h, t, d), v_cache.view(b * pieces, h, t, d)
    )
    weight = torch.softmax(lse.view(b, pieces, h, rows).float(), dim=1).unsqueeze(-1)
    joined = (out.view(b, pieces, h, rows, d).float() * weight).sum(1)
    return joined.to(q.dtype)


def pieces_error(device: torch.device) -> float:
    """Relative error of ``attend_in_pieces`` against whole-context attention (a check that
    the joined pieces compute the same function before they are timed)."""
    b, h, rows, t, d, pieces = 3, 2, 10, 2048, 128, 8
    q = torch.randn(b, h, rows, d, device=device, dtype=torch.bfloat16)
    k = torch.randn(b, h, t, d, device=device, dtype=torch.bfloat16)
    v = torch.randn(b, h, t, d, device=device, dtype=torch.bfloat16)

    def cut(x: torch.Tensor) -> torch.Tensor:
        return x.view(b, h, pieces, t // pieces, d).transpose(1, 2).contiguous()

    got = attend_in_pieces(q, cut(k), cut(v)).double()
    want = nnf.scaled_dot_product_attention(q.double(), k.double(), v.double())
    return float((got - want).norm() / want.norm())


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
    parser.add_argument("--tp", type=int, default=1, help="time one GPU's shard of TP N")
    parser.add_argument(
        "--attention",
        choices=("sdpa", "split"),
        default="sdpa",
        help="sdpa: one block of work per sequence and KV head; split: the context cut "
        "into pieces until the GPU is full, as vLLM's decode kernels do",
    )
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--budget-s", type=float, default=300.0)
    args = parser.parse_args()
    device = torch.device("cuda")
    torch.manual_seed(0)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    stack = Stack(SHAPES[args.model].shard(args.tp), device, args.attention, sms)
    result: dict[str, object] = {
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "tp": args.tp,
        "attention": args.attention,
        "model": asdict(stack.shape),
        "weights": "random bf16 (dummy), CUDA graph per configuration",
        "rows": [],
    }
    if args.attention == "split":
        error = pieces_error(device)
        result["pieces_relative_error"] = error
        if not error < 1e-2:
            raise SystemExit(f"attention in pieces is off by {error:.2e}; not timing it")
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
                    "pieces": stack.splits(batch, context),
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
