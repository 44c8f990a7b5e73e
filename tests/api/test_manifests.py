"""EnginePool and RolloutJob manifests: defaults, and errors that name the field to fix."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from heddle.api import (
    MAX_SAMPLES_PER_TASK,
    MAX_TRAJECTORIES,
    REPLAN_INTERVAL_S,
    EnginePoolSpec,
    RolloutJobSpec,
    SamplingSpec,
    check_trajectories,
    load_manifests,
)
from heddle.exceptions import ManifestError
from heddle.scheduler import SAMPLING_DEFAULTS, SAMPLING_LIMITS, PoolShape
from heddle.worker import Sampling, SamplingParams

ROOT = Path(__file__).resolve().parents[2]

POOL: dict[str, Any] = {
    "apiVersion": "heddle.dev/v1alpha1",
    "kind": "EnginePool",
    "metadata": {"name": "p"},
    "spec": {"model": "Qwen/Qwen3-14B", "gpus": 16, "tensorParallelSizes": [1, 2, 4, 8]},
}
JOB: dict[str, Any] = {
    "apiVersion": "heddle.dev/v1alpha1",
    "kind": "RolloutJob",
    "metadata": {"name": "j"},
    "spec": {
        "enginePool": "p",
        "tasks": {"path": "tasks.jsonl"},
        "environment": {
            "type": "tools",
            "tools": {"endpoints": [{"name": "s", "url": "http://s"}]},
        },
        "output": {"path": "/data/out.jsonl"},
    },
}


def _with(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    *parents, last = path.split(".")
    node = doc
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return doc


def test_pool_defaults_and_auto_shape() -> None:
    pool = EnginePoolSpec.from_manifest(POOL)
    assert pool.shape is None  # auto
    assert pool.gpus_per_node == 8
    assert pool.vllm.max_model_len is None  # the model's own


def test_pinned_shape_is_parsed() -> None:
    doc = _with(POOL, "spec.shape", [{"tp": 4, "replicas": 2}, {"tp": 1, "replicas": 8}])
    assert EnginePoolSpec.from_manifest(doc).shape == PoolShape.of({4: 2, 1: 8})


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("spec.gpus", 0, "spec.gpus=0 must be >= 1"),
        ("spec.gpus", "eight", "spec.gpus='eight' must be an integer"),
        ("spec.shape", [{"tp": 4, "replicas": 5}], "uses 20 GPUs but spec.gpus=16"),
        ("spec.shape", [{"tp": 3}], "spec.shape[0].tp=3 is not in tensorParallelSizes"),
        ("spec.tensorParallelSizes", [3], "tensorParallelSizes"),
        ("spec.vllm.gpuMemoryUtilization", 1.5, "gpuMemoryUtilization=1.5 must be in (0, 1]"),
        ("spec.replicas", 3, "unknown field(s) ['replicas']"),
    ],
)
def test_bad_pool_fields_are_named(path: str, value: Any, message: str) -> None:
    with pytest.raises(ManifestError, match=None) as err:
        EnginePoolSpec.from_manifest(_with(POOL, path, value))
    assert message in str(err.value)


def test_job_defaults() -> None:
    job = RolloutJobSpec.from_manifest(JOB)
    assert (job.policy, job.samples_per_task, job.max_turns) == ("heddle", 1, 8)
    assert job.environment.tools is not None and job.environment.tools.parser == "hermes"
    assert job.deadline_s is None
    assert job.output_trace is False


def test_output_trace_is_a_boolean() -> None:
    job = RolloutJobSpec.from_manifest(_with(JOB, "spec.output.trace", True))
    assert job.output_trace is True
    with pytest.raises(ManifestError, match=r"spec.output.trace"):
        RolloutJobSpec.from_manifest(_with(JOB, "spec.output.trace", "yes"))


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("spec.scheduling.policy", "fastest", "policy='fastest'; choose one of"),
        ("spec.scheduling.policy", "heddle-oracle", "choose one of"),
        ("spec.sampling.topP", 0, "spec.sampling.topP=0 must be in (0, 1]"),
        ("spec.sampling.topP", 1.5, "spec.sampling.topP=1.5 must be in (0, 1]"),
        ("spec.sampling.temperature", 2.5, "spec.sampling.temperature=2.5 must be in [0, 2]"),
        ("spec.sampling.temperature", -0.1, "spec.sampling.temperature=-0.1 must be in [0, 2]"),
        ("spec.sampling.temperature", float("inf"), "temperature=inf must be a finite number"),
        ("spec.sampling.temperature", float("nan"), "temperature=nan must be a finite number"),
        ("spec.sampling.maxTokensPerTurn", 0, "spec.sampling.maxTokensPerTurn=0 must be >= 1"),
        (
            "spec.sampling.maxTokensPerTurn",
            9000,
            "spec.sampling.maxTokensPerTurn=9000 must be <= maxTotalTokens=8192",
        ),
        (
            "spec.sampling.seed",
            2**64,
            "spec.sampling.seed=18446744073709551616 must be in [0, 9223372036854775807]",
        ),
        ("spec.sampling.seed", -1, "spec.sampling.seed=-1 must be in [0, 9223372036854775807]"),
        ("spec.sampling.seed", 1.5, "spec.sampling.seed=1.5 must be an integer"),
        ("spec.samplesPerTask", 0, "samplesPerTask=0 must be in [1, 1024]"),
        ("spec.tasks", {}, "give tasks"),
        ("spec.tasks", {"path": "a", "inline": [{}]}, "not ['inline', 'path']"),
        ("spec.environment.type", "gym", "type='gym'; choose one of"),
        (
            "spec.environment.tools.endpoints",
            [{"name": "s", "url": "s:80"}],
            "must start with http",
        ),
        ("spec.output", {}, "output.path is required"),
        ("spec.deadlineSeconds", -5, "deadlineSeconds=-5 must be > 0"),
        ("spec.enginePool", None, "enginePool is required"),
    ],
)
def test_bad_job_fields_are_named(path: str, value: Any, message: str) -> None:
    with pytest.raises(ManifestError) as err:
        RolloutJobSpec.from_manifest(_with(JOB, path, value))
    assert message in str(err.value)
    assert "RolloutJob 'j' spec" in str(err.value) or "RolloutJob" in str(err.value)


@pytest.mark.parametrize(
    ("session", "message"),
    [
        ({"volumeMounts": [{"name": "x", "mountPath": "/data"}]},
         "spec.session.volumeMounts[0] mounts volume 'x', which "
         "RolloutJob 'j' spec.session.volumes "
         "does not define; known: []"),
        ({"volumes": [{"emptyDir": {}}]}, "spec.session.volumes[0] needs name"),
        ({"volumes": ["data"]}, "spec.session.volumes[0]='data' must be a mapping"),
        ({"volumeMounts": [{"name": "x"}]}, "spec.session.volumeMounts[0] needs mountPath"),
        ({"resources": {"limits": {"memory": "lots"}}}, "spec.session.resources.limits.memory"),
        ({"resources": {"maximum": {}}}, "is not one of requests, limits"),
        ({"nodeSelector": {"zone": 1}}, "spec.session.nodeSelector must map label names"),
        ({"image": ""}, "spec.session.image"),
        ({"volume": []}, "spec.session has unknown field(s) ['volume']"),
        ("pod", "spec.session"),
    ],
)  # fmt: skip
def test_a_bad_session_block_is_one_sentence(session: Any, message: str) -> None:
    with pytest.raises(ManifestError) as err:
        RolloutJobSpec.from_manifest(_with(JOB, "spec.session", session))
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_the_session_block_is_parsed() -> None:
    session = {
        "image": "registry/heddle:1",
        "serviceAccountName": "mine",
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "rl"}}],
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        "resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "8Gi"}},
        "nodeSelector": {"pool": "cpu"},
        "tolerations": [{"key": "rl", "operator": "Exists"}],
    }
    spec = RolloutJobSpec.from_manifest(_with(JOB, "spec.session", session)).session
    assert spec.image == "registry/heddle:1" and spec.service_account_name == "mine"
    assert spec.volumes[0]["persistentVolumeClaim"] == {"claimName": "rl"}
    assert spec.volume_mounts == ({"name": "data", "mountPath": "/data"},)
    assert spec.resources["limits"] == {"memory": "8Gi"}
    assert spec.node_selector == {"pool": "cpu"} and len(spec.tolerations) == 1
    default = RolloutJobSpec.from_manifest(JOB).session
    assert default.image is None and default.volumes == () and default.resources == {}


def test_sampling_at_its_limits_is_accepted() -> None:
    sampling = {"temperature": 2, "topP": 1, "maxTokensPerTurn": 64, "maxTotalTokens": 64}
    job = RolloutJobSpec.from_manifest(_with(JOB, "spec.sampling", {**sampling, "seed": 2**63 - 1}))
    assert (job.sampling.temperature, job.sampling.seed) == (2.0, 2**63 - 1)


def _crd_sampling() -> dict[str, Any]:
    crd = yaml.safe_load((ROOT / "crds" / "rolloutjobs.heddle.dev.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return dict(schema["properties"]["spec"]["properties"]["sampling"]["properties"])


def test_crd_sampling_ranges_are_the_parsers() -> None:
    crd, lim = _crd_sampling(), SAMPLING_LIMITS
    assert (crd["temperature"]["minimum"], crd["temperature"]["maximum"]) == (
        lim.temperature_min,
        lim.temperature_max,
    )
    assert crd["topP"]["exclusiveMinimum"] is True
    assert (crd["topP"]["minimum"], crd["topP"]["maximum"]) == (
        lim.top_p_exclusive_min,
        lim.top_p_max,
    )
    for key in ("maxTokensPerTurn", "maxTotalTokens"):
        assert crd[key]["minimum"] == lim.max_tokens_min, key
    assert (crd["seed"]["minimum"], crd["seed"]["maximum"]) == (lim.seed_min, lim.seed_max)


def test_crd_sampling_defaults_are_the_one_source() -> None:
    """The CRD's defaults, the parser's, the worker's and the engine's are SAMPLING_DEFAULTS."""
    crd, default = _crd_sampling(), SAMPLING_DEFAULTS
    assert (crd["temperature"]["default"], crd["topP"]["default"]) == (
        default.temperature,
        default.top_p,
    )
    assert crd["maxTokensPerTurn"]["default"] == default.max_tokens_per_turn
    assert crd["maxTotalTokens"]["default"] == default.max_total_tokens
    assert RolloutJobSpec.from_manifest(_with(JOB, "spec.sampling", {})).sampling == SamplingSpec()
    request = SamplingParams()
    assert (request.max_tokens, request.temperature, request.top_p) == (
        default.max_tokens_per_request,
        default.temperature,
        default.top_p,
    )
    assert Sampling() == Sampling(
        default.max_tokens_per_request, default.temperature, default.top_p
    )


@pytest.mark.parametrize(
    ("key", "value"),
    [("temperature", 2.5), ("temperature", -1), ("topP", 0), ("seed", 2**64), ("seed", -1)],
)
def test_crd_schema_rejects_sampling_out_of_range(key: str, value: Any) -> None:
    import jsonschema

    from ..operator._cluster import validate

    with pytest.raises(jsonschema.ValidationError):
        validate("rolloutjobs", _with(JOB, f"spec.sampling.{key}", value))
    validate("rolloutjobs", JOB)  # the same job in range passes


def test_synthetic_job_needs_no_tasks() -> None:
    doc = _with(JOB, "spec.tasks", None)
    doc = _with(doc, "spec.environment", {"type": "synthetic", "synthetic": {"workload": "coding"}})
    job = RolloutJobSpec.from_manifest(doc)
    assert job.environment.synthetic is not None and job.environment.synthetic.workload == "coding"


def test_manifest_file_checks_kind_and_api_version(tmp_path: Path) -> None:
    bad = tmp_path / "x.yaml"
    bad.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n")
    with pytest.raises(ManifestError, match=r"use 'heddle\.dev/v1alpha1'"):
        load_manifests(bad)
    bad.write_text("a: [1, 2\n")
    with pytest.raises(ManifestError, match="not valid YAML"):
        load_manifests(bad)


@pytest.mark.parametrize("example", ["quickstart", "synthetic"])
def test_quickstart_manifests_parse(example: str) -> None:
    quick = ROOT / "examples" / example
    (job_doc,) = load_manifests(quick / "job.yaml")
    (pool_doc,) = load_manifests(quick / "pool.yaml")
    job = RolloutJobSpec.from_manifest(job_doc)
    pool = EnginePoolSpec.from_manifest(pool_doc)
    assert job.engine_pool == pool.name
    assert pool.shape is not None and pool.shape.gpus <= pool.gpus


def test_example_manifests_pass_the_crd_schemas() -> None:
    from ..operator._cluster import validate

    examples = sorted((ROOT / "examples").rglob("*.yaml"))
    checked = 0
    for path in examples:
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("apiVersion") == "heddle.dev/v1alpha1":
                plural = {"EnginePool": "enginepools", "RolloutJob": "rolloutjobs"}[doc["kind"]]
                validate(plural, doc)
                parser = EnginePoolSpec if doc["kind"] == "EnginePool" else RolloutJobSpec
                parser.from_manifest(doc)  # and what the schema cannot say
                checked += 1
    assert checked >= 8


def test_quickstart_preset_is_the_example_workload() -> None:
    preset = ROOT / "scheduler" / "presets" / "quickstart.yaml"
    example = ROOT / "examples" / "synthetic" / "workload.yaml"
    assert preset.read_text() == example.read_text(), (
        "cp examples/synthetic/workload.yaml scheduler/presets/quickstart.yaml"
    )


def test_the_replan_interval_has_one_default_in_the_parser_the_crd_and_the_session() -> None:
    from heddle.rollout import SessionConfig

    from ..operator._cluster import crd_schemas

    spec = crd_schemas()["rolloutjobs"]["properties"]["spec"]["properties"]
    assert spec["scheduling"]["properties"]["replanIntervalSeconds"]["default"] == (
        REPLAN_INTERVAL_S
    )
    job = copy.deepcopy(JOB)
    job["spec"].pop("scheduling", None)
    assert RolloutJobSpec.from_manifest(job).replan_interval_s == REPLAN_INTERVAL_S
    assert SessionConfig().replan_interval_s == REPLAN_INTERVAL_S


def test_samples_per_task_has_one_documented_maximum_in_the_parser_and_the_crd() -> None:
    from ..operator._cluster import crd_schemas

    spec = crd_schemas()["rolloutjobs"]["properties"]["spec"]["properties"]
    assert spec["samplesPerTask"]["maximum"] == MAX_SAMPLES_PER_TASK
    ok = RolloutJobSpec.from_manifest(_with(JOB, "spec.samplesPerTask", MAX_SAMPLES_PER_TASK))
    assert ok.samples_per_task == MAX_SAMPLES_PER_TASK
    with pytest.raises(
        ManifestError, match=rf"samplesPerTask=10000000 must be in \[1, {MAX_SAMPLES_PER_TASK}\]"
    ):
        RolloutJobSpec.from_manifest(_with(JOB, "spec.samplesPerTask", 10**7))
    with pytest.raises(ManifestError, match="split it into several jobs"):
        check_trajectories(MAX_TRAJECTORIES, 2, "RolloutJob 'j'")


@pytest.mark.parametrize(
    "name", ["a/b", "step 1", "what?", "Upper", "-dash", "名前", "x" * 254, "a..b", "dot."]
)
def test_names_are_checked_as_kubernetes_checks_them(name: str) -> None:
    with pytest.raises(ManifestError, match=r"is not a valid Kubernetes name; use at most 253"):
        RolloutJobSpec.from_manifest(_with(JOB, "metadata.name", name))


def test_valid_names_and_a_bad_namespace() -> None:
    for name in ("j", "step-0001", "a.b-c.d9", "x" * 253):
        assert RolloutJobSpec.from_manifest(_with(JOB, "metadata.name", name)).name == name
    with pytest.raises(ManifestError, match=r"metadata.namespace='a_b' is not a valid namespace"):
        RolloutJobSpec.from_manifest(_with(JOB, "metadata.namespace", "a_b"))


def test_yaml_aliases_are_refused_with_their_line(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    text = yaml.safe_dump(JOB) + "---\nbig: &b [1, 2]\nbigger: [*b, *b]\n"
    path.write_text(text)
    line = text.splitlines().index("bigger: [*b, *b]") + 1
    with pytest.raises(
        ManifestError, match=rf"{path} line {line}: YAML aliases \(\*name\) are not allowed"
    ):
        load_manifests(path)


def test_yaml_syntax_errors_give_a_position_not_the_text(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("apiVersion: heddle.dev/v1alpha1\nkind: [s3cr3t\n")
    with pytest.raises(ManifestError) as info:
        load_manifests(path)
    assert str(info.value) == f"{path} is not valid YAML at line 3, column 1"


@pytest.mark.parametrize(
    "text",
    [
        "apiVersion: v1\nkind: Config\nusers: [{name: me, user: {token: s3cr3t}}]\n",
        "apiVersion: s3cr3t\n",
        "apiVersion: heddle.dev/v1alpha1\nkind: s3cr3t\n",
        "s3cr3t\n",
        "- s3cr3t\n",
    ],
)
def test_a_file_that_is_not_a_manifest_is_refused_without_quoting_it(
    tmp_path: Path, text: str
) -> None:
    path = tmp_path / "config"
    path.write_text(text)
    with pytest.raises(ManifestError) as info:
        load_manifests(path)
    assert "s3cr3t" not in str(info.value)
    assert "is not a Heddle manifest" in str(info.value) or "is not a mapping" in str(info.value)


def _without(doc: dict[str, Any], path: str) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    *parents, last = path.split(".")
    node = doc
    for key in parents:
        node = node[key]
    del node[last]
    return doc


SYNTHETIC = {"type": "synthetic", "synthetic": {"workload": "coding"}}

# Cross-field rules: the CRD's CEL rule refuses each at `kubectl apply` with the
# message shown, and the parser (local mode, no API server) refuses it too.
CROSS_FIELD = [
    ("enginepools", _with(POOL, "spec.shape", [{"tp": 8, "replicas": 3}]),
     "more GPUs", "uses 24 GPUs but spec.gpus=16"),
    ("enginepools", _with(POOL, "spec.shape", [{"tp": 4, "replicas": 2}, {"tp": 4, "replicas": 1}]),
     "Duplicate value", "appears twice"),
    ("enginepools", _with(_with(POOL, "spec.tensorParallelSizes", [1, 2]), "spec.shape",
                          [{"tp": 4, "replicas": 1}]),
     "one of tensorParallelSizes", "not in tensorParallelSizes"),
    ("enginepools", _with(_with(POOL, "spec.gpusPerNode", 4), "spec.tensorParallelSizes", [1, 8]),
     "must divide gpusPerNode", "does not divide"),
    ("rolloutjobs", _without(JOB, "spec.tasks"), "spec.tasks is required", "tasks"),
    ("rolloutjobs", _with(JOB, "spec.tasks", {"path": "a.jsonl", "inline": [{"prompt": "x"}]}),
     "exactly one of tasks", "give one of inline, path or configMap"),
    ("rolloutjobs", _with(_without(JOB, "spec.tasks"), "spec.environment", {"type": "synthetic"}),
     "environment.synthetic", "workload"),
    ("rolloutjobs", _with(JOB, "spec.environment.tools.endpoints",
                          [{"name": "s", "url": "http://a"}, {"name": "s", "url": "http://b"}]),
     "Duplicate value", "must be unique"),
    ("rolloutjobs", _with(JOB, "spec.sampling", {"maxTokensPerTurn": 9000}),
     "maxTokensPerTurn must be <= maxTotalTokens", "maxTotalTokens"),
]  # fmt: skip


@pytest.mark.parametrize(("plural", "doc", "api_says", "parser_says"), CROSS_FIELD)
def test_cross_field_rules_are_refused_by_the_api_server_and_the_parser(
    plural: str, doc: dict[str, Any], api_says: str, parser_says: str
) -> None:
    import jsonschema

    from ..operator._cluster import validate

    with pytest.raises(jsonschema.ValidationError, match=api_says):
        validate(plural, doc)
    parser = EnginePoolSpec if plural == "enginepools" else RolloutJobSpec
    with pytest.raises(ManifestError, match=parser_says):
        parser.from_manifest(doc)


@pytest.mark.parametrize(
    ("plural", "doc"),
    [
        ("enginepools", POOL),
        ("enginepools", _with(POOL, "spec.shape", [{"tp": 8, "replicas": 1}, {"tp": 4}])),
        ("rolloutjobs", JOB),
        ("rolloutjobs", _with(_without(JOB, "spec.tasks"), "spec.environment", SYNTHETIC)),
        ("rolloutjobs", _with(JOB, "spec.tasks", {"configMap": {"name": "t"}})),
    ],
)
def test_valid_manifests_pass_every_cel_rule(plural: str, doc: dict[str, Any]) -> None:
    from ..operator._cluster import validate

    validate(plural, doc)


def test_the_old_auto_shape_gets_a_sentence_saying_what_to_write() -> None:
    with pytest.raises(ManifestError, match="omit it to let the planner decide"):
        EnginePoolSpec.from_manifest(_with(POOL, "spec.shape", "auto"))


def test_a_job_with_no_task_left_is_refused() -> None:
    with pytest.raises(ManifestError, match="no task to run"):
        check_trajectories(0, 4, "RolloutJob 'j'")


def test_readme_resources_pass_the_crds_and_the_parser() -> None:
    import re

    from ..operator._cluster import validate

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    docs = [
        d
        for block in re.findall(r"```yaml\n(.*?)```", text, flags=re.S)
        for d in yaml.safe_load_all(block)
        if isinstance(d, dict) and d.get("apiVersion") == "heddle.dev/v1alpha1"
    ]
    assert {d["kind"] for d in docs} == {"EnginePool", "RolloutJob"}
    for doc in docs:
        plural = {"EnginePool": "enginepools", "RolloutJob": "rolloutjobs"}[doc["kind"]]
        validate(plural, doc)
        (EnginePoolSpec if doc["kind"] == "EnginePool" else RolloutJobSpec).from_manifest(doc)


@pytest.mark.parametrize(
    ("kind", "stray"),
    [
        ("tools", "synthetic"),
        ("tools", "external"),
        ("synthetic", "tools"),
        ("synthetic", "external"),
    ],
)
def test_a_block_of_another_environment_type_is_refused_not_ignored(kind: str, stray: str) -> None:
    environment = {
        "type": kind,
        "tools": JOB["spec"]["environment"]["tools"],
        "synthetic": {"workload": "quickstart"},
        "external": {"idleTimeoutSeconds": 5},
    }
    doc = _with(JOB, "spec.environment", {k: v for k, v in environment.items() if k in (
        "type", kind, stray)})  # fmt: skip
    with pytest.raises(ManifestError) as caught:
        RolloutJobSpec.from_manifest(doc)
    assert str(caught.value) == (
        f"RolloutJob 'j' spec.environment.{stray} does not apply to environment.type {kind}; "
        "remove it, "
        f"or set type: {stray}"
    )


def test_external_environment_parses_with_defaults_and_refuses_tools() -> None:
    from ..operator._cluster import validate

    doc = _with(JOB, "spec.environment", {"type": "external"})
    validate("rolloutjobs", doc)
    external = RolloutJobSpec.from_manifest(doc).environment.external
    assert external is not None and external.idle_timeout_s == 300.0
    assert external.hand_out_again == 0 and external.episode_timeout_s is None
    custom = {"type": "external", "external": {"toolParser": "qwen3_coder",
              "idleTimeoutSeconds": 5, "episodeTimeoutSeconds": 60, "handOutAgain": 2}}  # fmt: skip
    doc = _with(JOB, "spec.environment", custom)
    validate("rolloutjobs", doc)
    external = RolloutJobSpec.from_manifest(doc).environment.external
    assert external is not None and external.tool_parser == "qwen3_coder"
    assert (external.episode_timeout_s, external.hand_out_again) == (60.0, 2)
    both = _with(JOB, "spec.environment.type", "external")  # JOB's tools stay
    with pytest.raises(ManifestError, match="does not apply to environment"):
        RolloutJobSpec.from_manifest(both)
    with pytest.raises(ManifestError, match="idleTimeoutSeconds=0 must be > 0"):
        RolloutJobSpec.from_manifest(
            _with(
                JOB, "spec.environment", {"type": "external", "external": {"idleTimeoutSeconds": 0}}
            )
        )
