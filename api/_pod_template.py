"""EnginePool.spec.podTemplate: what a cluster adds to every worker pod, and what it may not.

Precedence (docs/resources.md, "The worker pod"): the template is the base; the
pool's own fields (resources, nodeSelector, tolerations, volumes, volumeMounts)
are added to it; what the operator owns is set last and may not appear in the
template at all, so nothing it relies on (the GPU count, the probes, the
command, the labels it selects pods by) can be overridden by accident. Lists a
cluster commonly extends (env, volumes, tolerations, imagePullSecrets, ...) are
concatenated; maps (labels, annotations, nodeSelector) are merged.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

from heddle.exceptions import ManifestError
from heddle.worker import TOKEN_ENV

__all__ = [
    "WORKER_CONTAINER",
    "apply_pod_template",
    "check_pod_template",
    "check_quantity",
    "guaranteed_resources",
]

WORKER_CONTAINER = "worker"
# Set by the operator on every worker pod; a template naming one is refused.
OWNED_POD_FIELDS = ("restartPolicy", "hostname", "subdomain")
OWNED_CONTAINER_FIELDS = (
    "image", "command", "args", "ports", "resources",
    "readinessProbe", "startupProbe", "livenessProbe",
)  # fmt: skip
OWNED_LABEL_PREFIX = "heddle.dev/"
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)?$")


def check_quantity(value: Any, where: str) -> str:
    if not isinstance(value, str | int) or not _QUANTITY.match(str(value)):
        raise ManifestError(f"{where}={value!r} is not a Kubernetes quantity such as 16Gi")
    return str(value)


def check_pod_template(raw: Any, where: str) -> dict[str, Any]:
    """The template as given, refused with a sentence if it sets what the operator owns."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping) or set(raw) - {"metadata", "spec"}:
        raise ManifestError(f"{where} must be a pod template: an object with metadata and spec")
    meta = raw.get("metadata") or {}
    if not isinstance(meta, Mapping) or set(meta) - {"labels", "annotations"}:
        raise ManifestError(f"{where}.metadata may hold labels and annotations only")
    for key in ("labels", "annotations"):
        values = meta.get(key) or {}
        if not isinstance(values, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in values.items()
        ):
            raise ManifestError(f"{where}.metadata.{key} must map strings to strings")
        owned = sorted(k for k in values if k.startswith(OWNED_LABEL_PREFIX))
        if owned:
            raise ManifestError(f"{where}.metadata.{key}: {owned} belong to the operator")
    spec = raw.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise ManifestError(f"{where}.spec must be a pod spec (an object)")
    owned = [k for k in OWNED_POD_FIELDS if k in spec]
    if owned:
        raise ManifestError(f"{where}.spec.{owned[0]} is set by the operator; remove it")
    containers = spec.get("containers") or []
    if not isinstance(containers, list) or not all(isinstance(c, Mapping) for c in containers):
        raise ManifestError(f"{where}.spec.containers must be a list of containers")
    for i, c in enumerate(containers):
        if not isinstance(c.get("name"), str) or not c["name"]:
            raise ManifestError(f"{where}.spec.containers[{i}] needs a name")
        if c["name"] != WORKER_CONTAINER:
            continue  # a sidecar: the cluster's own business
        env = c.get("env") or []
        if any(isinstance(e, Mapping) and e.get("name") == TOKEN_ENV for e in env):
            raise ManifestError(
                f"{where}.spec.containers[{i}].env: {TOKEN_ENV} of the worker container is set "
                "by the operator from the Secret <pool>-worker-token; remove it (to choose the "
                "token, write that Secret yourself)"
            )
        owned = [k for k in OWNED_CONTAINER_FIELDS if k in c]
        if owned:
            hint = " (use spec.resources)" if owned[0] == "resources" else ""
            raise ManifestError(
                f"{where}.spec.containers[{i}].{owned[0]} of the worker container is set by "
                f"the operator{hint}; remove it"
            )
    return copy.deepcopy(dict(raw))


def guaranteed_resources(raw: Any, where: str) -> dict[str, Any]:
    """cpu and memory with requests equal to limits (Guaranteed QoS), from either side.

    A GPU worker evicted or CPU-throttled under node pressure loses every
    trajectory's KV cache; Guaranteed pods go last and may get exclusive cores.
    """
    if raw is None:
        return {}
    if not isinstance(raw, Mapping) or set(raw) - {"requests", "limits"}:
        raise ManifestError(f"{where} must be an object with requests and/or limits")
    requests = dict(raw.get("requests") or {})
    limits = dict(raw.get("limits") or {})
    for name in sorted(set(requests) | set(limits)):
        if name == "nvidia.com/gpu":
            raise ManifestError(f"{where}: nvidia.com/gpu comes from each instance's tp; remove it")
        req, lim = requests.get(name), limits.get(name)
        if req is not None and lim is not None and str(req) != str(lim):
            raise ManifestError(
                f"{where}: {name} requests={req} and limits={lim} differ; give one value "
                "(workers run with requests equal to limits, Guaranteed QoS)"
            )
        value = check_quantity(req if req is not None else lim, f"{where}.{name}")
        requests[name] = limits[name] = value
    return {"requests": requests, "limits": limits} if requests else {}


def apply_pod_template(pod: dict[str, Any], template: Mapping[str, Any]) -> dict[str, Any]:
    """``pod`` (the operator's) laid over ``template``; see the module's precedence."""
    if not template:
        return pod
    merged = copy.deepcopy(dict(template.get("spec") or {}))
    ours = pod["spec"]
    theirs_containers = merged.pop("containers", [])
    for key, value in ours.items():
        if key == "containers":
            continue
        old = merged.get(key)
        if isinstance(value, list) and isinstance(old, list):
            merged[key] = [*old, *value]
        elif isinstance(value, dict) and isinstance(old, dict):
            merged[key] = {**old, **value}
        else:
            merged[key] = value
    worker = ours["containers"][0]
    sidecars = [c for c in theirs_containers if c["name"] != WORKER_CONTAINER]
    extra: Mapping[str, Any] = next(
        (c for c in theirs_containers if c["name"] == WORKER_CONTAINER), {}
    )
    combined = copy.deepcopy(dict(extra))
    for key, value in worker.items():
        old = combined.get(key)
        if isinstance(value, list) and isinstance(old, list):
            combined[key] = [*old, *value]
        elif isinstance(value, dict) and isinstance(old, dict):
            combined[key] = {**old, **value}
        else:
            combined[key] = value
    merged["containers"] = [combined, *sidecars]
    meta = template.get("metadata") or {}
    for key in ("labels", "annotations"):
        if meta.get(key):
            pod["metadata"][key] = {**meta[key], **pod["metadata"].get(key, {})}
    pod["spec"] = merged
    return pod
