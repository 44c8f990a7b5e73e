"""Which hosts tool and reward calls may reach (docs/security.md, "Egress").

Tool calls leave from the session pod's network position, not the tenant's,
so the operator's admin lists where they may go, and an empty list lets them
go nowhere (``*`` is the one-line opt-out: any host). A URL's host passes if
it is an allowed name (or under an allowed suffix), or an address in an
allowed network. Names are resolved when a connection is made, and the
connection goes to the address that was checked, never to a second lookup
(no DNS rebinding): a listed name never reaches a link-local address (cloud
metadata, 169.254.169.254) unless a network entry names it, whatever its DNS
says at that moment.

``heddle run`` runs as its user, on the user's machine: there is no deputy,
and without a list it lets tools reach the loopback addresses only
(:data:`LOCAL_DEFAULT`), where local tool servers listen.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import re
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpcore
import httpx

from heddle.api import RolloutJobSpec
from heddle.exceptions import ConfigError, ManifestError

__all__ = [
    "ALLOWED_HOSTS_ENV",
    "ANY_HOST",
    "LOCAL_DEFAULT",
    "HostAllowList",
    "HostRefusedError",
    "check_tool_hosts",
    "guarded_client",
]

ALLOWED_HOSTS_ENV = "HEDDLE_TOOL_ALLOWED_HOSTS"
ANY_HOST = "*"  # the opt-out: tool calls may reach any host
LOCAL_DEFAULT = "localhost,127.0.0.0/8,::1"  # heddle run without a list: loopback only
# Where an admin sets the list, for the sentence a refused job gets.
_SETTING = f"{ALLOWED_HOSTS_ENV}; with the Helm chart, operator.toolAllowedHosts"
_LINK_LOCAL = (ipaddress.ip_network("169.254.0.0/16"), ipaddress.ip_network("fe80::/10"))

_Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_Address = ipaddress.IPv4Address | ipaddress.IPv6Address
_NAME = re.compile(
    r"^(\*?\.)?[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*$"
)


class HostRefusedError(httpcore.ConnectError):
    """A connection the allow-list refused (its message is the sentence the caller sees)."""


@dataclass(frozen=True)
class HostAllowList:
    """Host names, name suffixes (``.tools.svc``) and IP networks a tool URL may name;
    empty: none; ``any_host``: every host (the admin's opt-out)."""

    names: frozenset[str] = frozenset()
    suffixes: tuple[str, ...] = ()  # each starts with "."
    networks: tuple[_Network, ...] = ()
    any_host: bool = False

    @classmethod
    def parse(cls, text: str, source: str = ALLOWED_HOSTS_ENV) -> HostAllowList:
        """The list in ``text`` (comma- or space-separated); empty text: an empty list."""
        names: set[str] = set()
        suffixes: list[str] = []
        networks: list[_Network] = []
        any_host = False
        for entry in re.split(r"[,\s]+", text.strip().lower()):
            if not entry:
                continue
            if entry == ANY_HOST:
                any_host = True
                continue
            try:
                networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
                continue
            except ValueError:
                pass
            if not _NAME.match(entry):
                raise ConfigError(
                    f"{source} entry {entry!r} is neither a host name nor an IP network; "
                    "give names (sandbox.rl.svc, *.tools.svc), CIDRs (10.0.0.0/8) or * for "
                    "any host, comma-separated"
                )
            if entry.startswith("*."):
                suffixes.append(entry[1:])
            elif entry.startswith("."):
                suffixes.append(entry)
            else:
                names.add(entry)
        return cls(frozenset(names), tuple(suffixes), tuple(networks), any_host)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ, default: str = "") -> HostAllowList:
        """The list in :data:`ALLOWED_HOSTS_ENV`; ``default`` where it is unset."""
        return cls.parse(environ.get(ALLOWED_HOSTS_ENV, default))

    @property
    def empty(self) -> bool:
        return not (self.any_host or self.names or self.suffixes or self.networks)

    def text(self) -> str:
        """The list as :meth:`parse` reads it (passed on to session pods)."""
        entries = [*sorted(self.names), *(f"*{s}" for s in self.suffixes)]
        return ",".join([*([ANY_HOST] if self.any_host else []), *entries,
                         *(str(n) for n in self.networks)])  # fmt: skip

    def _named(self, host: str) -> bool:
        return host in self.names or any(host.endswith(s) for s in self.suffixes)

    def allows(self, host: str) -> bool:
        """Whether a URL may name ``host`` (a name is checked again, resolved, on connect)."""
        host = host.lower().rstrip(".")
        if self.any_host:
            return True
        try:
            address = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            return self._named(host)
        return self.address_allowed(address, named=False)

    def address_allowed(self, address: _Address, *, named: bool) -> bool:
        """Whether a connection may go to ``address``; ``named``: it came from a listed name."""
        if self.any_host or any(address in n for n in self.networks):
            return True
        return named and not any(address in n for n in _LINK_LOCAL)

    async def resolve(self, host: str, port: int) -> str:
        """The address to connect to for ``host``: the first one it resolves to that passes,
        or :class:`HostRefusedError` saying why none does."""
        host = host.lower().rstrip(".")
        try:
            return self._checked([ipaddress.ip_address(host.strip("[]"))], host, named=False)
        except ValueError:
            pass
        try:
            infos = await _getaddrinfo(host, port)
        except OSError as exc:
            raise HostRefusedError(f"cannot resolve tool host {host!r} ({exc})") from None
        addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
        return self._checked(addresses, host, named=self._named(host))

    def _checked(self, addresses: Iterable[_Address], host: str, *, named: bool) -> str:
        seen = list(dict.fromkeys(addresses))
        for address in seen:
            if self.address_allowed(address, named=named):
                return str(address)
        raise HostRefusedError(
            f"tool host {host!r} resolves to {[str(a) for a in seen]}, none of which the "
            f"operator lets tools reach ({_SETTING})"
        )


async def _getaddrinfo(host: str, port: int) -> list[Any]:
    # The event loop's resolver runs in a thread: a slow DNS server never blocks the loop.
    return await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)


class _GuardedBackend(httpcore.AsyncNetworkBackend):
    """Connects only to an address the allow-list passed, the very one it checked."""

    def __init__(self, allowed: HostAllowList) -> None:
        self._allowed = allowed
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        address = await self._allowed.resolve(host, port)
        # TLS still verifies the URL's name: httpcore starts TLS with the request's host.
        return await self._inner.connect_tcp(address, port, timeout, local_address, socket_options)

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.AsyncNetworkStream:
        raise HostRefusedError("tool calls go over TCP only")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def guarded_client(allowed: HostAllowList, *, max_connections: int = 256) -> httpx.AsyncClient:
    """An HTTP client whose every connection is checked against ``allowed``: names resolved
    once, the checked address connected to; no proxy from the environment (a proxy would
    resolve the name itself); no redirects (a reply could point anywhere)."""
    transport = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=max_connections))
    # httpx takes no network backend; its pool is rebuilt with one (same settings).
    transport._pool = httpcore.AsyncConnectionPool(
        ssl_context=httpx.create_ssl_context(),
        max_connections=max_connections,
        max_keepalive_connections=20,
        keepalive_expiry=5.0,
        network_backend=_GuardedBackend(allowed),
    )
    return httpx.AsyncClient(transport=transport, follow_redirects=False, trust_env=False)


def _shown(url: str) -> str:
    """The URL as a refusal may print it: without user:password@, never the query."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return f"{parts.scheme}://{host}{parts.path}"


def _urls(job: RolloutJobSpec) -> list[tuple[str, str]]:
    """(field, url) of every endpoint the job's session would call."""
    urls = []
    reward = job.environment.reward
    if reward is not None and reward.type == "http":
        urls.append(("spec.environment.reward.url", reward.url))
    tools = job.environment.tools
    for i, endpoint in enumerate(tools.endpoints if tools is not None else ()):
        urls.append((f"spec.environment.tools.endpoints[{i}].url", endpoint.url))
    return urls


def check_tool_hosts(job: RolloutJobSpec, allowed: HostAllowList) -> None:
    """Raise :class:`ManifestError` for the first tool or reward URL outside ``allowed``."""
    for where, url in _urls(job):
        host = urlsplit(url).hostname or ""
        if allowed.empty:
            raise ManifestError(
                f"RolloutJob {job.name!r} {where} {_shown(url)}: this operator lets tools reach "
                f"no host ({ALLOWED_HOSTS_ENV} is empty); an admin lists the tool hosts there "
                f"({_SETTING}), or sets it to {ANY_HOST!r} to allow any host"
            )
        if not allowed.allows(host):
            raise ManifestError(
                f"RolloutJob {job.name!r} {where} {_shown(url)}: host {host!r} is not among the "
                f"hosts this operator lets tools reach ({_SETTING}); use an allowed tool host or "
                "ask the admin to add it"
            )
