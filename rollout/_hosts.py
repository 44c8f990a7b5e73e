"""Which hosts tool calls may reach (docs/rollouts.md, "Allowed tool hosts").

Tool calls leave from the operator's network position, not the tenant's, so
an admin may list where they may go. Names are matched as written and never
resolved: resolving would let a name point anywhere after the check.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from heddle.api import RolloutJobSpec
from heddle.exceptions import ConfigError, ManifestError

__all__ = ["ALLOWED_HOSTS_ENV", "HostAllowList", "check_tool_hosts"]

ALLOWED_HOSTS_ENV = "HEDDLE_TOOL_ALLOWED_HOSTS"
# Where an admin sets the list, for the sentence a refused job gets.
_SETTING = f"{ALLOWED_HOSTS_ENV}; with the Helm chart, operator.toolAllowedHosts"

_Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_NAME = re.compile(
    r"^(\*?\.)?[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*$"
)


@dataclass(frozen=True)
class HostAllowList:
    """Host names, name suffixes (``.tools.svc``) and IP networks a tool URL may name."""

    names: frozenset[str] = frozenset()
    suffixes: tuple[str, ...] = ()  # each starts with "."
    networks: tuple[_Network, ...] = ()

    @classmethod
    def parse(cls, text: str, source: str = ALLOWED_HOSTS_ENV) -> HostAllowList | None:
        """The list in ``text`` (comma- or space-separated); None when it is empty (no limit)."""
        names: set[str] = set()
        suffixes: list[str] = []
        networks: list[_Network] = []
        for entry in re.split(r"[,\s]+", text.strip().lower()):
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
                continue
            except ValueError:
                pass
            if not _NAME.match(entry):
                raise ConfigError(
                    f"{source} entry {entry!r} is neither a host name nor an IP network; "
                    "give names (sandbox.rl.svc, *.tools.svc) or CIDRs (10.0.0.0/8), "
                    "comma-separated"
                )
            if entry.startswith("*."):
                suffixes.append(entry[1:])
            elif entry.startswith("."):
                suffixes.append(entry)
            else:
                names.add(entry)
        if not (names or suffixes or networks):
            return None
        return cls(frozenset(names), tuple(suffixes), tuple(networks))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> HostAllowList | None:
        return cls.parse(environ.get(ALLOWED_HOSTS_ENV, ""))

    def text(self) -> str:
        """The list as :meth:`parse` reads it (passed on to session pods)."""
        entries = [*sorted(self.names), *(f"*{s}" for s in self.suffixes)]
        return ",".join([*entries, *(str(n) for n in self.networks)])

    def allows(self, host: str) -> bool:
        host = host.lower().rstrip(".")
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return host in self.names or any(host.endswith(s) for s in self.suffixes)
        return any(address in network for network in self.networks)


def _shown(url: str) -> str:
    """The URL as a refusal may print it: without user:password@, never the query."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return f"{parts.scheme}://{host}{parts.path}"


def check_tool_hosts(job: RolloutJobSpec, allowed: HostAllowList | None) -> None:
    """Raise :class:`ManifestError` for the first tool endpoint outside ``allowed``."""
    tools = job.environment.tools
    reward = job.environment.reward
    if allowed is not None and reward is not None and reward.type == "http":
        host = urlsplit(reward.url).hostname or ""
        if not allowed.allows(host):
            raise ManifestError(
                f"RolloutJob {job.name!r} spec.environment.reward.url {_shown(reward.url)}: host "
                f"{host!r} is not among the hosts this operator lets tools reach ({_SETTING}); "
                "use an allowed host or ask the admin to add it"
            )
    if allowed is None or tools is None:
        return
    for i, endpoint in enumerate(tools.endpoints):
        host = urlsplit(endpoint.url).hostname or ""
        if not allowed.allows(host):
            raise ManifestError(
                f"RolloutJob {job.name!r} spec.environment.tools.endpoints[{i}].url "
                f"{_shown(endpoint.url)}: host {host!r} is not among the hosts this operator lets "
                f"tools reach ({_SETTING}); use an allowed tool host or ask the admin to add it"
            )
