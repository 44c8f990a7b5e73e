"""vLLM engine arguments: Heddle's defaults per build, the pool's extraArgs over them, and the
ones Heddle depends on refused when the pool is applied, not when its pods start."""

from __future__ import annotations

import pytest

from heddle.api import EnginePoolSpec
from heddle.exceptions import ConfigError, ManifestError
from heddle.worker import VLLMConfig
from heddle.worker._vllm_engine import engine_kwargs, parse_engine_arg


def test_gpus_capture_cuda_graphs_and_the_cpu_build_runs_eagerly() -> None:
    config = VLLMConfig(model="m")
    assert engine_kwargs(config, cpu_build=False)["enforce_eager"] is False
    assert engine_kwargs(config, cpu_build=True)["enforce_eager"] is True
    kwargs = engine_kwargs(config, cpu_build=False)
    assert kwargs["scheduling_policy"] == "priority" and kwargs["enable_prefix_caching"] is True


def test_extra_args_override_the_defaults_instead_of_crashing() -> None:
    args = (parse_engine_arg("max_num_seqs=256"), parse_engine_arg("--enforce-eager=true"))
    kwargs = engine_kwargs(VLLMConfig(model="m", engine_args=args), cpu_build=False)
    assert kwargs["max_num_seqs"] == 256 and kwargs["enforce_eager"] is True
    assert parse_engine_arg("kv_cache_dtype=fp8") == ("kv_cache_dtype", "fp8")


@pytest.mark.parametrize(
    "text",
    ["scheduling_policy=fcfs", "enable-prefix-caching=false", "model=x", "tensor_parallel_size=2"],
)
def test_arguments_heddle_depends_on_are_refused_with_the_reason(text: str) -> None:
    with pytest.raises(ConfigError, match="cannot be set: "):
        parse_engine_arg(text)


def test_a_pool_with_a_protected_or_malformed_extra_arg_is_refused_when_applied() -> None:
    pool = {
        "apiVersion": "heddle.dev/v1alpha1",
        "kind": "EnginePool",
        "metadata": {"name": "p"},
        "spec": {"model": "m", "gpus": 8, "vllm": {"extraArgs": ["max_num_seqs=64"]}},
    }
    assert EnginePoolSpec.from_manifest(pool).vllm.extra_args == ("max_num_seqs=64",)
    pool["spec"]["vllm"]["extraArgs"] = ["max_num_seqs=64", "scheduling_policy=fcfs"]  # type: ignore[index]
    with pytest.raises(ManifestError) as err:
        EnginePoolSpec.from_manifest(pool)
    assert str(err.value) == (
        "EnginePool 'p' spec.vllm.extraArgs[1] 'scheduling_policy' cannot be set: "
        "Heddle's priorities need 'priority'"
    )
    pool["spec"]["vllm"]["extraArgs"] = ["no-equals-sign"]  # type: ignore[index]
    with pytest.raises(ManifestError, match=r"write it as name=value"):
        EnginePoolSpec.from_manifest(pool)


@pytest.mark.parametrize(
    ("text", "hint"),
    [("max_num_seq=8", "did you mean 'max_num_seqs'"), ("no_such_thing=1", "EngineArgs")],
)
def test_an_unknown_engine_argument_is_refused_naming_the_closest(text: str, hint: str) -> None:
    with pytest.raises(ConfigError, match="is not an engine argument of vLLM") as err:
        parse_engine_arg(text)
    assert hint in str(err.value)


def test_a_pool_with_an_unknown_extra_arg_is_refused_when_applied() -> None:
    pool = {
        "apiVersion": "heddle.dev/v1alpha1",
        "kind": "EnginePool",
        "metadata": {"name": "p"},
        "spec": {"model": "m", "gpus": 8, "vllm": {"extraArgs": ["enable_chunked_prefil=true"]}},
    }
    with pytest.raises(ManifestError, match=r"extraArgs\[0\] 'enable_chunked_prefil' is not an"):
        EnginePoolSpec.from_manifest(pool)


@pytest.mark.slow
def test_the_pinned_names_are_the_installed_vllms_engine_arguments() -> None:
    from heddle.worker._engine_arg_names import (
        VLLM_ENGINE_ARG_NAMES,
        VLLM_LINE,
        installed_engine_arg_names,
    )

    line, installed = installed_engine_arg_names()
    assert line == VLLM_LINE, f"vLLM {line} installed; worker/engine_arg_names.json has {VLLM_LINE}"
    assert installed == VLLM_ENGINE_ARG_NAMES, (
        "run python -m heddle.worker._engine_arg_names to update worker/engine_arg_names.json: "
        f"add {sorted(installed - VLLM_ENGINE_ARG_NAMES)}, "
        f"remove {sorted(VLLM_ENGINE_ARG_NAMES - installed)}"
    )
