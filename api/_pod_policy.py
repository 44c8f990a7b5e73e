"""What a tenant's manifest may put in a pod the operator makes (docs/security.md).

The operator creates worker pods (``EnginePool``) and session pods
(``RolloutJob``) with its own rights, so whoever may create those resources
would otherwise create any pod. By default a manifest may ask only for what a
tenant could do anyway: PVC, ConfigMap, emptyDir and downwardAPI volumes
(projected ones from ConfigMaps and the downward API), images from the
operator's allow-list, the namespace's default ServiceAccount (and the
session's own). Everything else needs an admin's opt-in in the operator's
settings (:class:`PodPolicy`); a few things no setting allows, and the CRDs
refuse them too (CEL rules, ``crds/``): privileged containers, privilege
escalation, the host's PID and IPC namespaces and Windows host processes.

Secret volumes are refused by default: the session reads its task files from
its volumes and copies prompts into the output, so a Secret mounted there
would reach whoever reads the job's output (a confused deputy).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from heddle.exceptions import ConfigError, ManifestError

from ._manifests import EnginePoolSpec, RolloutJobSpec

__all__ = [
    "ALLOWED_IMAGES_ENV",
    "ALLOWED_SERVICE_ACCOUNTS_ENV",
    "DEFAULT_ALLOWED_IMAGES",
    "POD_ALLOW_ENV",
    "POD_EXEMPTIONS",
    "PodPolicy",
    "check_pod_spec",
    "check_pool_policy",
    "check_session_policy",
    "check_volumes",
]

ALLOWED_IMAGES_ENV = "HEDDLE_ALLOWED_IMAGES"
ALLOWED_SERVICE_ACCOUNTS_ENV = "HEDDLE_ALLOWED_SERVICE_ACCOUNTS"
POD_ALLOW_ENV = "HEDDLE_POD_ALLOW"
DEFAULT_ALLOWED_IMAGES = ("ghcr.io/heddle-dev/",)  # the project's own images
# What an admin may opt into (operator --pod-allow, chart operator.podPolicy.allow).
POD_EXEMPTIONS = (
    "hostNetwork",  # hostNetwork and container hostPorts
    "hostPath",  # hostPath volumes
    "secretVolumes",  # secret volumes and projected secret sources
    "serviceAccountToken",  # projected ServiceAccount tokens
    "otherVolumes",  # volume types beyond the tenant's own (nfs, csi, iscsi, ...)
    "capabilities",  # capabilities added to a container
)
# Volume types a tenant with no pod rights may use through Heddle: storage of its own
# namespace that it could read anyway, or nothing of the node's or the cluster's.
TENANT_VOLUMES = frozenset({"persistentVolumeClaim", "configMap", "emptyDir", "downwardAPI"})
_TENANT_PROJECTIONS = frozenset({"configMap", "downwardAPI"})
_CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")
# Settings, as the refusal names them: the operator flag and the Helm chart value.
_SETTING = {
    "images": f"--allowed-images / {ALLOWED_IMAGES_ENV} (chart: operator.podPolicy.allowedImages)",
    "accounts": (
        f"--allowed-service-accounts / {ALLOWED_SERVICE_ACCOUNTS_ENV} "
        "(chart: operator.podPolicy.serviceAccounts)"
    ),
}
_NEVER = "no setting allows it (docs/security.md, 'What no setting allows')"


def _allow_setting(exemption: str) -> str:
    return f"--pod-allow={exemption} / {POD_ALLOW_ENV} (chart: operator.podPolicy.allow)"


def _entries(text: str) -> tuple[str, ...]:
    return tuple(e for e in re.split(r"[,\s]+", text.strip()) if e)


@dataclass(frozen=True)
class PodPolicy:
    """The operator's settings for tenant pod fields; the defaults allow only a tenant's own."""

    allowed_images: tuple[str, ...] = DEFAULT_ALLOWED_IMAGES  # prefixes ending in / or repos
    service_accounts: frozenset[str] = frozenset()  # besides "default" (and heddle-session)
    allow: frozenset[str] = frozenset()  # of POD_EXEMPTIONS

    def __post_init__(self) -> None:
        unknown = sorted(set(self.allow) - set(POD_EXEMPTIONS))
        if unknown:
            raise ConfigError(
                f"pod policy exemption(s) {unknown} unknown; choose from {list(POD_EXEMPTIONS)}"
            )

    @classmethod
    def parse(cls, images: str, service_accounts: str, allow: str) -> PodPolicy:
        """From comma- or space-separated lists; no images: :data:`DEFAULT_ALLOWED_IMAGES`."""
        return cls(
            allowed_images=_entries(images) or DEFAULT_ALLOWED_IMAGES,
            service_accounts=frozenset(_entries(service_accounts)),
            allow=frozenset(_entries(allow)),
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> PodPolicy:
        return cls.parse(
            environ.get(ALLOWED_IMAGES_ENV, ""),
            environ.get(ALLOWED_SERVICE_ACCOUNTS_ENV, ""),
            environ.get(POD_ALLOW_ENV, ""),
        )

    def image_allowed(self, image: str) -> bool:
        """``*`` allows any; ``reg/`` any image under it; ``reg/repo`` that repository's tags
        and digests; anything else the image exactly."""
        for entry in self.allowed_images:
            if entry in ("*", image):
                return True
            if entry.endswith("/") and image.startswith(entry):
                return True
            if image.startswith((f"{entry}:", f"{entry}@")):
                return True
        return False

    def check_image(self, image: str, where: str) -> None:
        if not self.image_allowed(image):
            raise ManifestError(
                f"{where}={image!r} is not among the images this operator runs "
                f"({', '.join(self.allowed_images)}); use one of them or ask an admin to add "
                f"it with {_SETTING['images']}"
            )

    def check_service_account(self, name: str, where: str, own: Iterable[str] = ()) -> None:
        if name in ("default", *own) or name in self.service_accounts:
            return
        raise ManifestError(
            f"{where}={name!r}: pods the operator makes run only as the namespace's default "
            f"ServiceAccount{''.join(f' or {o}' for o in own)}; ask an admin to allow "
            f"{name!r} with {_SETTING['accounts']}"
        )

    def need(self, exemption: str, where: str, what: str) -> None:
        if exemption not in self.allow:
            raise ManifestError(
                f"{where}: {what} is refused by default; an admin allows it with "
                f"{_allow_setting(exemption)}"
            )


def _truthy(spec: Mapping[str, Any], key: str) -> bool:
    return spec.get(key) is True


def check_volumes(volumes: Any, where: str, policy: PodPolicy) -> None:
    """Each volume's type within the tenant's (or the admin's opt-ins)."""
    for i, volume in enumerate(volumes or ()):
        if not isinstance(volume, Mapping):
            raise ManifestError(f"{where}[{i}] must be a volume (a mapping with a name)")
        at = f"{where}[{i}]"
        kinds = [k for k in volume if k != "name"]
        for kind in kinds:
            if kind in TENANT_VOLUMES:
                continue
            if kind == "hostPath":
                policy.need("hostPath", f"{at}.hostPath", "a hostPath volume (the node's files)")
            elif kind == "secret":
                policy.need("secretVolumes", f"{at}.secret", "a Secret volume")
            elif kind == "projected":
                _check_projected(volume.get("projected"), f"{at}.projected", policy)
            else:
                policy.need("otherVolumes", f"{at}.{kind}", f"a {kind} volume")


def _check_projected(projected: Any, where: str, policy: PodPolicy) -> None:
    sources = (projected or {}).get("sources") if isinstance(projected, Mapping) else None
    for j, source in enumerate(sources or ()):
        if not isinstance(source, Mapping):
            raise ManifestError(f"{where}.sources[{j}] must be a mapping")
        for kind in source:
            at = f"{where}.sources[{j}].{kind}"
            if kind in _TENANT_PROJECTIONS:
                continue
            if kind == "serviceAccountToken":
                policy.need("serviceAccountToken", at, "a projected ServiceAccount token")
            elif kind == "secret":
                policy.need("secretVolumes", at, "a projected Secret")
            else:
                policy.need("otherVolumes", at, f"a projected {kind} source")


def _check_security_context(sc: Any, where: str, policy: PodPolicy) -> None:
    if not isinstance(sc, Mapping):
        return
    if _truthy(sc, "privileged"):
        raise ManifestError(f"{where}.privileged: a privileged container; {_NEVER}")
    if _truthy(sc, "allowPrivilegeEscalation"):
        raise ManifestError(f"{where}.allowPrivilegeEscalation: true; {_NEVER}")
    if sc.get("procMount") not in (None, "Default"):
        raise ManifestError(f"{where}.procMount: an unmasked /proc; {_NEVER}")
    if _truthy(sc.get("windowsOptions") or {}, "hostProcess"):
        raise ManifestError(f"{where}.windowsOptions.hostProcess: a host process; {_NEVER}")
    added = (sc.get("capabilities") or {}).get("add") if isinstance(sc, Mapping) else None
    if added:
        policy.need("capabilities", f"{where}.capabilities.add", f"adding capabilities {added}")


def check_pod_spec(
    spec: Any, where: str, policy: PodPolicy, *, own_accounts: Iterable[str] = ()
) -> None:
    """A pod spec (or a template's part of one) within ``policy``; ManifestError otherwise."""
    if not isinstance(spec, Mapping):
        return
    for key in ("hostPID", "hostIPC"):
        if _truthy(spec, key):
            raise ManifestError(f"{where}.{key}: the host's namespaces; {_NEVER}")
    if _truthy(spec, "hostNetwork"):
        policy.need("hostNetwork", f"{where}.hostNetwork", "the host's network")
    for key in ("serviceAccountName", "serviceAccount"):
        if isinstance(spec.get(key), str):
            policy.check_service_account(spec[key], f"{where}.{key}", own_accounts)
    _check_security_context(spec.get("securityContext"), f"{where}.securityContext", policy)
    check_volumes(spec.get("volumes"), f"{where}.volumes", policy)
    for key in _CONTAINER_LISTS:
        for i, c in enumerate(spec.get(key) or ()):
            if not isinstance(c, Mapping):
                continue
            at = f"{where}.{key}[{i}]"
            if isinstance(c.get("image"), str):
                policy.check_image(c["image"], f"{at}.image")
            _check_security_context(c.get("securityContext"), f"{at}.securityContext", policy)
            for j, port in enumerate(c.get("ports") or ()):
                if isinstance(port, Mapping) and port.get("hostPort"):
                    policy.need("hostNetwork", f"{at}.ports[{j}].hostPort", "a host port")


def check_pool_policy(pool: EnginePoolSpec, policy: PodPolicy) -> None:
    """An EnginePool's image, volumes and pod template within ``policy``."""
    where = f"EnginePool {pool.name!r} spec"
    policy.check_image(pool.image, f"{where}.image")
    check_volumes(pool.pod.get("volumes"), f"{where}.volumes", policy)
    template = pool.pod.get("podTemplate") or {}
    check_pod_spec(template.get("spec"), f"{where}.podTemplate.spec", policy)


def check_session_policy(job: RolloutJobSpec, policy: PodPolicy, own_account: str) -> None:
    """A RolloutJob's ``spec.session`` within ``policy`` (the operator's own image is not
    checked: it is the admin's)."""
    s = job.session
    where = f"RolloutJob {job.name!r} spec.session"
    if s.image is not None:
        policy.check_image(s.image, f"{where}.image")
    if s.service_account_name is not None:
        policy.check_service_account(
            s.service_account_name, f"{where}.serviceAccountName", (own_account,)
        )
    check_volumes(s.volumes, f"{where}.volumes", policy)
