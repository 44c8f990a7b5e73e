"""Speculation's configuration, defined once: flags, the EnginePool field, vLLM's config,
the operator's pod command and heddle run's workers all mean the same thing."""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest

from heddle.api import EnginePoolSpec
from heddle.exceptions import ConfigError, ManifestError
from heddle.operator import spec_hash, worker_pod
from heddle.rollout import LocalPool, LocalWorkerOptions
from heddle.worker import (
    DEFAULT_SPECULATIVE_TOKENS,
    SPECULATION_METHODS,
    Speculation,
    VLLMConfig,
    WorkerArgs,
    parse_worker_argv,
    suffix_available,
)
from heddle.worker._speculation import MAX_SPECULATIVE_TOKENS, parse_batch_size_table
from heddle.worker._vllm_engine import WORKER_EXTENSION, engine_kwargs, parse_engine_arg

POOL: dict[str, Any] = {
    "apiVersion": "heddle.dev/v1alpha1",
    "kind": "EnginePool",
    "metadata": {"name": "p", "namespace": "default", "uid": "u-1"},
    "spec": {"model": "Qwen/Qwen3-8B", "gpus": 4},
}
TABLE = [
    {"minBatchSize": 1, "maxBatchSize": 8, "numSpeculativeTokens": 4},
    {"minBatchSize": 9, "maxBatchSize": 64, "numSpeculativeTokens": 2},
    {"minBatchSize": 65, "maxBatchSize": 256, "numSpeculativeTokens": 0},
]


def _pool(speculation: dict[str, Any] | None) -> dict[str, Any]:
    doc = copy.deepcopy(POOL)
    if speculation is not None:
        doc["spec"]["speculation"] = speculation
    return doc


def test_the_batch_size_table_reads_as_vllm_wants_it() -> None:
    assert parse_batch_size_table("1-8:4, 9-32:2,33-256:0") == ((1, 8, 4), (9, 32, 2), (33, 256, 0))
    for text, says in [
        ("2-8:4", "must start at batch size 1"),
        ("1-8:4,8-16:2", "must start at batch size 9"),
        ("1-8:4,10-16:2", "must start at batch size 9"),
        ("1-8", "write each entry as FIRST-LAST:K"),
        ("1-8:0", "drafts no token at any batch size"),
        (f"1-8:{MAX_SPECULATIVE_TOKENS + 1}", "must be in 0.."),
        ("", "is empty"),
    ]:
        with pytest.raises(ConfigError, match=says):
            parse_batch_size_table(text)


def test_k_defaults_once_and_the_table_caps_it() -> None:
    assert Speculation.of("ngram").num_speculative_tokens == DEFAULT_SPECULATIVE_TOKENS
    assert Speculation.of("ngram", None, ((1, 4, 6), (5, 9, 1))).num_speculative_tokens == 6
    with pytest.raises(ConfigError, match="more than num_speculative_tokens=2"):
        Speculation.of("suffix", 2, ((1, 4, 6),))
    with pytest.raises(ConfigError, match="is not a method"):
        Speculation.of("eagle")


def test_auto_is_suffix_where_arctic_inference_imports_else_ngram() -> None:
    assert suffix_available()  # make setup builds it (requirements/build-arctic-inference.sh)
    assert Speculation.of("auto", 3).resolved() == Speculation.of("suffix", 3)
    assert Speculation.of("ngram").resolved() == Speculation.of("ngram")


def test_vllm_gets_the_method_k_and_table_and_per_request_counts() -> None:
    spec = Speculation.of("suffix", None, ((1, 8, 4), (9, 64, 0)))
    kwargs = engine_kwargs(VLLMConfig(model="m", speculation=spec), cpu_build=True)
    assert kwargs["speculative_config"] == {
        "method": "suffix",
        "num_speculative_tokens": 4,
        "num_speculative_tokens_per_batch_size": [[1, 8, 4], [9, 64, 0]],
    }
    assert kwargs["per_request_spec_decode_metrics"] == "summary"
    assert kwargs["worker_extension_cls"] == WORKER_EXTENSION
    plain = engine_kwargs(VLLMConfig(model="m"), cpu_build=True)
    assert "speculative_config" not in plain and "per_request_spec_decode_metrics" not in plain
    assert plain["worker_extension_cls"] == WORKER_EXTENSION  # the fixes apply either way


@pytest.mark.parametrize(
    "text", ['speculative_config={"method": "ngram"}', "worker_extension_cls=x.Y"]
)
def test_speculation_is_set_by_its_flag_not_by_an_engine_argument(text: str) -> None:
    with pytest.raises(ConfigError, match="cannot be set"):
        parse_engine_arg(text)


def test_the_worker_flags_parse_back_and_build_the_same_speculation() -> None:
    spec = Speculation.of("suffix", 6, ((1, 8, 6), (9, 100, 2)))
    args = WorkerArgs(engine="vllm", model="m", **WorkerArgs.speculation_flags(spec))
    assert args.argv()[-6:] == [
        "--speculation",
        "suffix",
        "--num-speculative-tokens",
        "6",
        "--speculative-tokens-by-batch-size",
        "1-8:6,9-100:2",
    ]
    back = parse_worker_argv(args.argv()[1:])
    assert back == args and back.speculation_config() == spec
    assert parse_worker_argv([]).speculation_config() == Speculation()  # off
    assert WorkerArgs.speculation_flags(Speculation()) == {}


def test_the_pool_field_reaches_the_worker_pods_command() -> None:
    doc = _pool({"method": "ngram", "numSpeculativeTokens": 5, "byBatchSize": TABLE})
    pool = EnginePoolSpec.from_manifest(doc)
    assert pool.speculation == Speculation.of("ngram", 5, ((1, 8, 4), (9, 64, 2), (65, 256, 0)))
    (container,) = worker_pod(pool, doc, "p-tp1-0", 1)["spec"]["containers"]
    args = parse_worker_argv(container["command"][2:])
    assert args.speculation_config() == pool.speculation
    # A pool that never speculates keeps its pods (their hash); turning it on replaces them.
    off = EnginePoolSpec.from_manifest(_pool(None))
    assert spec_hash(off) == spec_hash(EnginePoolSpec.from_manifest(_pool({"method": "off"})))
    assert spec_hash(off) != spec_hash(pool)


def test_heddle_runs_local_workers_speculate_as_the_pool_says() -> None:
    spec = Speculation.of("ngram", 3)
    command = LocalPool([1], LocalWorkerOptions(model="m", speculation=spec))._command(1, 18000)
    assert command[:4] == [sys.executable, "-m", "heddle", "worker"]
    assert parse_worker_argv(command[4:]).speculation_config() == spec


@pytest.mark.parametrize(
    ("speculation", "api_says", "parser_says"),
    [
        ({"method": "eagle"}, "is not one of", r"choose one of \['off'"),
        ({"method": "ngram", "numSpeculativeTokens": 0}, "less than the minimum", "must be"),
        (
            {"method": "ngram", "byBatchSize": TABLE[1:]},
            "a range starting at batch size 1",
            "must start at batch size 1",
        ),
        (
            {"method": "ngram", "byBatchSize": [{**TABLE[0], "minBatchSize": 9}]},
            "minBatchSize <= maxBatchSize",
            "give 1 <= first <= last",
        ),
        (
            {"method": "suffix", "numSpeculativeTokens": 2, "byBatchSize": TABLE},
            "above numSpeculativeTokens",
            "more than num_speculative_tokens=2",
        ),
    ],
)
def test_a_bad_speculation_is_refused_by_the_api_server_and_the_parser(
    speculation: dict[str, Any], api_says: str, parser_says: str
) -> None:
    from ..operator._cluster import validate

    doc = _pool(speculation)
    with pytest.raises(jsonschema.ValidationError, match=api_says):
        validate("enginepools", doc)
    with pytest.raises(ManifestError, match=parser_says):
        EnginePoolSpec.from_manifest(doc)


def test_the_crds_speculation_schema_is_the_parsers() -> None:
    from ..operator._cluster import crd_schemas, validate

    schema = crd_schemas()["enginepools"]["properties"]["spec"]["properties"]["speculation"]
    assert tuple(schema["properties"]["method"]["enum"]) == SPECULATION_METHODS
    assert schema["properties"]["numSpeculativeTokens"]["maximum"] == MAX_SPECULATIVE_TOKENS
    k = schema["properties"]["byBatchSize"]["items"]["properties"]["numSpeculativeTokens"]
    assert k["maximum"] == MAX_SPECULATIVE_TOKENS
    for method in SPECULATION_METHODS:
        doc = _pool({"method": method, "byBatchSize": TABLE})
        validate("enginepools", doc)
        assert EnginePoolSpec.from_manifest(doc).speculation.method == method


@pytest.mark.anyio
@pytest.mark.parametrize("name", ["min_p", "logit_bias"])
async def test_min_p_and_logit_bias_get_a_sentence_at_the_worker(
    sim_engine: Callable[..., Any], name: str
) -> None:
    from .conftest import worker

    async with worker(sim_engine()) as client:
        reply = await client.post(
            "/v1/trajectories/t/generate",
            json={"append_token_ids": [1, 2], "sampling": {name: 0.1}},
        )
    assert reply.status_code == 422
    assert (
        f"sampling.{name} is not supported: vLLM refuses min_p and logit_bias"
        in (reply.json()["error"])
    )


@pytest.mark.parametrize("name", ["minP", "logitBias"])
def test_min_p_and_logit_bias_get_a_sentence_in_a_job(name: str) -> None:
    from heddle.api import RolloutJobSpec

    job = {
        "apiVersion": "heddle.dev/v1alpha1",
        "kind": "RolloutJob",
        "metadata": {"name": "j"},
        "spec": {
            "enginePool": "p",
            "tasks": {"path": "tasks.jsonl"},
            "environment": {"type": "synthetic", "synthetic": {"workload": "quickstart"}},
            "output": {"path": "/data/out.jsonl"},
            "sampling": {name: 0.1},
        },
    }
    with pytest.raises(ManifestError, match=f"sampling.{name} is not supported"):
        RolloutJobSpec.from_manifest(job)


def test_a_sim_worker_or_local_sim_pool_refuses_speculation_in_a_sentence() -> None:
    from heddle.rollout._local import _speculation

    with pytest.raises(ConfigError, match="needs --engine vllm"):
        _speculation(Speculation.of("ngram"), None, "sim")
    assert _speculation(Speculation.of("ngram"), "off", "sim") == Speculation.of("off")


@pytest.mark.anyio
async def test_drafting_texts_are_remembered_once_per_job_and_task_and_purged_with_the_job(
    sim_engine: Callable[..., Any],
) -> None:
    from .conftest import worker

    async with worker(sim_engine()) as client:
        body = {"job": "j", "task_id": "t0", "texts": [[1, 2, 3], [4, 5]]}
        first = (await client.post("/v1/drafts", json=body)).json()
        again = (await client.post("/v1/drafts", json={**body, "texts": [[1, 2, 3], [6]]})).json()
        # The sim engine drafts from nothing: nothing is inserted, but the texts are known.
        assert (first, again) == ({"seeded": 0, "held": 2}, {"seeded": 0, "held": 3})
        bad = await client.post("/v1/drafts", json={**body, "texts": [[10**6]]})
        assert bad.status_code == 422 and "outside the model's vocabulary" in bad.json()["error"]
        await client.delete("/v1/trajectories", params={"job": "j"})
        after = (await client.post("/v1/drafts", json={**body, "texts": [[1, 2, 3]]})).json()
        assert after == {"seeded": 0, "held": 1}


def test_the_drafting_history_is_bounded_per_task() -> None:
    from heddle.worker._drafts import DraftHistory

    history = DraftHistory(per_task=2)
    assert [k for k, _ in history.new("j", "t", [[1], [2], [3]])][-1].startswith("j/t/")
    assert history.held("j", "t") == 2 and history.held("j", "u") == 0
    assert history.new("j", "t", [[3]]) == []  # still held: not inserted again
    assert history.purge("j") == 1 and history.held("j", "t") == 0
