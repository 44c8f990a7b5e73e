"""The worker's command line is defined once: what the operator, ``heddle run`` and the
test kubelet build is what ``heddle worker`` parses back."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from heddle.api import EnginePoolSpec
from heddle.operator import WORKER_PORT, worker_pod
from heddle.rollout import LocalPool, LocalWorkerOptions
from heddle.worker import DEFAULT_WORKER_ARGS, WorkerArgs, parse_worker_argv

_flag_values = st.text(alphabet="abcdefghij_=0123456789", min_size=1, max_size=12)


@pytest.mark.slow
@given(
    engine=st.sampled_from(["sim", "vllm"]),
    tp=st.sampled_from([1, 2, 4, 8]),
    port=st.integers(1, 65535),
    model=st.none() | st.just("/models/qwen3"),
    time_scale=st.floats(0, 10, allow_nan=False),
    scripted=st.booleans(),
    block_size=st.none() | st.sampled_from([16, 32]),
    vllm_args=st.lists(_flag_values, max_size=3).map(tuple),
    token_file=st.none() | st.just("/var/run/heddle/token"),
)
def test_every_command_built_parses_back_to_the_same_arguments(
    engine: str,
    tp: int,
    port: int,
    model: str | None,
    time_scale: float,
    scripted: bool,
    block_size: int | None,
    vllm_args: tuple[str, ...],
    token_file: str | None,
) -> None:
    args = WorkerArgs(
        engine="vllm" if engine == "vllm" else "sim",
        tp=tp,
        port=port,
        model=model,
        time_scale=time_scale,
        scripted_replies=scripted,
        block_size=block_size,
        vllm_args=vllm_args,
        token_file=token_file,
    )
    argv = args.argv()
    assert argv[0] == "worker"
    assert parse_worker_argv(argv[1:]) == args


def test_the_defaults_are_the_commands_defaults() -> None:
    assert parse_worker_argv([]) == DEFAULT_WORKER_ARGS


@pytest.mark.slow
def test_every_flag_is_in_heddle_worker_help() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "heddle", "worker", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    full = WorkerArgs(
        engine="vllm",
        model="m",
        block_size=32,
        scripted_replies=True,
        vllm_args=("a=1",),
        max_body_mib=1.0,
        token_file="t",
    ).argv()
    for flag in (a.split("=")[0] for a in full[1:] if a.startswith("--")):
        assert flag in shown, flag


def test_the_operators_worker_pod_runs_a_command_heddle_worker_takes() -> None:
    body = {
        "apiVersion": "heddle.dev/v1alpha1",
        "kind": "EnginePool",
        "metadata": {"name": "p", "namespace": "default", "uid": "u-1"},
        "spec": {
            "model": "Qwen/Qwen3-8B",
            "gpus": 4,
            "vllm": {"extraArgs": ["enable_chunked_prefill=true"]},
        },
    }
    pool = EnginePoolSpec.from_manifest(body)
    (container,) = worker_pod(pool, body, "p-tp2-0", 2)["spec"]["containers"]
    command = [*container["command"], *container.get("args", [])]
    assert command[:2] == ["heddle", "worker"]
    args = parse_worker_argv(command[2:])
    assert (args.engine, args.model, args.tp) == ("vllm", "Qwen/Qwen3-8B", 2)
    assert args.port == WORKER_PORT and args.vllm_args == ("enable_chunked_prefill=true",)
    assert args.host == "0.0.0.0"
    assert args.max_model_len == pool.vllm.max_model_len


def test_the_local_pools_worker_runs_a_command_heddle_worker_takes(tmp_path: Path) -> None:
    options = LocalWorkerOptions(engine="sim", time_scale=0.5, scripted_replies=True)
    command = LocalPool([1], options)._command(2, 18123)
    assert command[:4] == [sys.executable, "-m", "heddle", "worker"]
    args = parse_worker_argv(command[4:])
    assert (args.engine, args.tp, args.port, args.time_scale) == ("sim", 2, 18123, 0.5)
    assert args.scripted_replies and args.model is None
