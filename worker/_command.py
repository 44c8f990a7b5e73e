"""The ``heddle worker`` command line, defined once.

``heddle worker`` parses it (:func:`add_worker_arguments`), and everything that
starts a worker builds it from :class:`WorkerArgs`: the operator's worker pods,
``heddle run``'s local pool and the test kubelet. A flag renamed here is renamed
for all of them, and a test parses every command built back into the same
arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from heddle.scheduler import ENGINE_BATCH_CAP

from ._speculation import (
    SPECULATION_METHODS,
    Speculation,
    format_batch_size_table,
    parse_batch_size_table,
)

__all__ = [
    "DEFAULT_WORKER_ARGS",
    "WorkerArgs",
    "add_worker_arguments",
    "parse_worker_argv",
]

Engine = Literal["sim", "vllm"]


@dataclass(frozen=True)
class WorkerArgs:
    """Everything ``heddle worker`` takes; the defaults are the command's defaults."""

    engine: Engine = "sim"
    model: str | None = None  # vllm: model name or path
    tp: int = 1  # tensor-parallel degree
    host: str = "127.0.0.1"
    port: int = 8000
    max_model_len: int | None = None  # None: the model's own (vllm), the sim engine's default
    grace_s: float = 30.0  # seconds in-flight steps get to finish after SIGTERM
    cluster: str = "64xh100"  # sim: hardware and model whose performance model to run
    time_scale: float = 1.0  # sim: wall seconds per simulated second (0: as fast as possible)
    seed: int = 0
    scripted_replies: bool = False  # sim: answer turn k with the k-th <reply> block (tests)
    block_size: int | None = None  # vllm: KV block size
    max_num_seqs: int = ENGINE_BATCH_CAP  # vllm: batch cap
    gpu_memory_utilization: float = 0.9  # vllm: share of GPU memory
    vllm_args: tuple[str, ...] = field(default=())  # vllm: NAME=VALUE engine arguments
    kv_cache_gib: int = 1  # vllm CPU build: VLLM_CPU_KVCACHE_SPACE
    max_body_mib: float | None = None  # None: the worker's own MAX_BODY_BYTES
    token_file: str | None = None  # wins over $HEDDLE_WORKER_TOKEN
    max_resident: int | None = None  # None: the worker's own DEFAULT_MAX_RESIDENT
    resident_ttl_s: float | None = None  # None: the worker's own DEFAULT_RESIDENT_TTL_S
    weights_roots: tuple[str, ...] = field(default=())  # POST /v1/weights loads only under these
    speculation: str | None = None  # vllm: off|ngram|suffix|auto; None: Speculation's default
    num_speculative_tokens: int | None = None  # vllm: K; None: the table's largest, or default
    speculative_tokens_by_batch_size: str | None = None  # vllm: "1-8:4,9-32:2,33-256:0"

    def speculation_config(self) -> Speculation:
        """The engine's speculation from the three flags (ConfigError: one sentence)."""
        table = (
            parse_batch_size_table(self.speculative_tokens_by_batch_size)
            if self.speculative_tokens_by_batch_size
            else ()
        )
        return Speculation.of(
            self.speculation or Speculation().method, self.num_speculative_tokens, table
        )

    @staticmethod
    def speculation_flags(speculation: Speculation) -> dict[str, Any]:
        """The fields that give ``speculation`` (nothing for off): for a pod's command."""
        if not speculation.on:
            return {}
        return {
            "speculation": speculation.method,
            "num_speculative_tokens": speculation.num_speculative_tokens,
            "speculative_tokens_by_batch_size": (
                format_batch_size_table(speculation.by_batch_size)
                if speculation.by_batch_size
                else None
            ),
        }

    def argv(self) -> list[str]:
        """``worker`` and every flag that is set, in a stable order (explicit in a pod spec)."""
        out = ["worker"]
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None or value is False or value == ():
                continue
            flag = _FLAGS[f.name]
            if isinstance(value, bool):
                out.append(flag)
            elif isinstance(value, tuple):
                out += [f"{flag}={v}" for v in value]
            else:
                out += [flag, str(value)]
        return out

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> WorkerArgs:
        values: dict[str, Any] = {name: getattr(ns, _dest(flag)) for name, flag in _FLAGS.items()}
        values["vllm_args"] = tuple(values["vllm_args"])
        values["weights_roots"] = tuple(values["weights_roots"])
        return cls(**values)


DEFAULT_WORKER_ARGS = WorkerArgs()

# Field -> flag. argparse's dest is the flag without dashes (``_dest``).
_FLAGS = {
    "engine": "--engine",
    "model": "--model",
    "tp": "--tp",
    "host": "--host",
    "port": "--port",
    "max_model_len": "--max-model-len",
    "grace_s": "--grace",
    "cluster": "--cluster",
    "time_scale": "--time-scale",
    "seed": "--seed",
    "scripted_replies": "--scripted-replies",
    "block_size": "--block-size",
    "max_num_seqs": "--max-num-seqs",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "vllm_args": "--vllm-arg",
    "kv_cache_gib": "--kv-cache-gib",
    "max_body_mib": "--max-body-mib",
    "token_file": "--token-file",
    "max_resident": "--max-resident",
    "resident_ttl_s": "--resident-ttl",
    "weights_roots": "--weights-root",
    "speculation": "--speculation",
    "num_speculative_tokens": "--num-speculative-tokens",
    "speculative_tokens_by_batch_size": "--speculative-tokens-by-batch-size",
}


def _dest(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")


def add_worker_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``heddle worker`` (docs/cli.md), with :class:`WorkerArgs`' defaults."""
    d = DEFAULT_WORKER_ARGS
    p.add_argument("--engine", choices=("sim", "vllm"), default=d.engine)
    p.add_argument(
        "--model",
        default=d.model,
        help="vllm: a model directory, an HF id, or a named model (tiny, smollm2)",
    )
    p.add_argument("--tp", type=int, default=d.tp, help="tensor-parallel degree")
    p.add_argument("--host", default=d.host)
    p.add_argument("--port", type=int, default=d.port)
    p.add_argument(
        "--max-model-len",
        type=int,
        default=d.max_model_len,
        help="context tokens per trajectory at most (default: the model's own)",
    )
    p.add_argument(
        "--grace",
        type=float,
        default=d.grace_s,
        help="seconds in-flight steps get to finish after SIGTERM",
    )
    p.add_argument(
        "--cluster",
        default=d.cluster,
        help="sim: hardware and model whose performance model to run",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=d.time_scale,
        help="sim: wall seconds per simulated second (0: as fast as possible)",
    )
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument(
        "--scripted-replies",
        action="store_true",
        help="sim: answer turn k with the k-th <reply>...</reply> block of the context (tests)",
    )
    p.add_argument("--block-size", type=int, default=d.block_size, help="vllm: KV block size")
    p.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs, help="vllm: batch cap")
    p.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=d.gpu_memory_utilization,
        help="vllm: share of GPU memory",
    )
    p.add_argument(
        "--vllm-arg",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="vllm: one more engine argument (repeatable), e.g. enable_chunked_prefill=true",
    )
    p.add_argument(
        "--kv-cache-gib",
        type=int,
        default=d.kv_cache_gib,
        help="vllm CPU build: KV cache size in whole GiB (VLLM_CPU_KVCACHE_SPACE)",
    )
    p.add_argument(
        "--max-body-mib",
        type=float,
        default=d.max_body_mib,  # the worker's own default (heddle.worker MAX_BODY_BYTES)
        help="largest request body in MiB; larger ones get 413 (docs/worker-api.md)",
    )
    p.add_argument(
        "--max-resident",
        type=int,
        default=d.max_resident,
        help="trajectory contexts kept resident at most; the least recently used go first "
        "(default: 4096; docs/worker-api.md)",
    )
    p.add_argument(
        "--resident-ttl",
        type=float,
        default=d.resident_ttl_s,
        help="seconds an idle context stays resident (default: 1800)",
    )
    p.add_argument(
        "--weights-root",
        action="append",
        default=list(d.weights_roots),
        metavar="DIR",
        help="a directory under which POST /v1/weights may load checkpoints (repeatable); "
        "none: in-place loading is refused",
    )
    p.add_argument(
        "--speculation",
        choices=SPECULATION_METHODS,
        default=d.speculation,
        help="vllm: speculative decoding: ngram, suffix (vLLM's suffix decoding), auto (suffix "
        "where arctic-inference imports, else ngram; without a table, off on vLLM's CPU "
        "build); default off (docs/speculation.md)",
    )
    p.add_argument(
        "--num-speculative-tokens",
        type=int,
        default=d.num_speculative_tokens,
        metavar="K",
        help="vllm: draft tokens per step at most (default: 4, or the table's largest)",
    )
    p.add_argument(
        "--speculative-tokens-by-batch-size",
        default=d.speculative_tokens_by_batch_size,
        metavar="TABLE",
        help="vllm: K by running batch size, FIRST-LAST:K entries from 1, e.g. "
        "1-8:4,9-32:2,33-256:0 (0: no drafting at those sizes)",
    )
    p.add_argument(
        "--token-file",
        default=d.token_file,
        metavar="PATH",
        help="a file holding the token every call but /healthz, /readyz and /metrics must "
        "carry (Authorization: Bearer); wins over $HEDDLE_WORKER_TOKEN (docs/worker-api.md)",
    )


def parse_worker_argv(argv: Sequence[str]) -> WorkerArgs:
    """``argv`` as ``heddle worker`` reads it (without the leading ``worker``)."""
    p = argparse.ArgumentParser(prog="heddle worker")
    add_worker_arguments(p)
    return WorkerArgs.from_namespace(p.parse_args(list(argv)))
