"""The operator's Kubernetes client against the test API server: TLS, tokens, pages, throttling.

Everything goes over real HTTP(S) to ``ApiServer`` (kmock); credentials come
from kubeconfig files as kind and managed clusters write them (inline CA and
client-certificate data, exec plugins), read by the ``kubernetes`` package.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import kmock
import pytest
import trustme

from heddle.client import ClusterAccess
from heddle.operator._kube import CONFIGMAPS, ApiError, KubeClient, RetryPolicy

from ._cluster import ApiServer
from ._operator_fixture import pool
from ._tls import client_context, exec_plugin, plugin_calls, tls_server, write_kubeconfig

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _cm(name: str, **labels: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labels": labels}, "data": {"k": name}}  # fmt: skip


@contextlib.asynccontextmanager
async def _tls(tmp_path: Path) -> AsyncIterator[tuple[ApiServer, str, trustme.CA]]:
    ca = trustme.CA()
    async with ApiServer() as api, tls_server(api, ca) as url:
        yield api, url, ca


async def test_a_kubeconfig_with_inline_ca_and_client_certificate_data_connects(
    tmp_path: Path,
) -> None:
    async with _tls(tmp_path) as (_, url, ca):
        config = write_kubeconfig(tmp_path / "kubeconfig", url, ca, ca.issue_cert("heddle"))
        client = KubeClient.from_kubeconfig(config)
        try:
            await client.create(CONFIGMAPS, "default", _cm("tasks"))
            got = await client.get(CONFIGMAPS, "default", "tasks")
            assert got is not None and got["data"] == {"k": "tasks"}
            assert [o["metadata"]["name"] for o in await client.list(CONFIGMAPS, "default")] == [
                "tasks"
            ]
        finally:
            await client.aclose()


async def test_tls_failures_are_one_sentence_naming_the_kubeconfig_fields(tmp_path: Path) -> None:
    async with _tls(tmp_path) as (_, url, ca):
        # The server requires a client certificate; this kubeconfig has none.
        bare = KubeClient.from_kubeconfig(write_kubeconfig(tmp_path / "bare", url, ca))
        # This one trusts another CA than the one that signed the server's certificate.
        other = trustme.CA()
        wrong = KubeClient.from_kubeconfig(
            write_kubeconfig(tmp_path / "wrong", url, other, other.issue_cert("heddle"))
        )
        for client, cause in (
            (bare, "set client-certificate(-data) and client-key(-data) in the kubeconfig"),
            (wrong, "not signed by the kubeconfig's certificate-authority(-data)"),
        ):
            try:
                with pytest.raises(ApiError) as caught:
                    await client.list(CONFIGMAPS, "default")
            finally:
                await client.aclose()
            message = str(caught.value)
            assert caught.value.status == 0 and "\n" not in message, message
            assert cause in message, message


async def test_an_exec_token_that_expires_is_renewed_before_the_server_refuses_it(
    tmp_path: Path,
) -> None:
    # A 60 s token is inside the package's 5-minute renewal margin: renewed before each use.
    user = exec_plugin(tmp_path, "t1", lifetime_s=60)
    async with _tls(tmp_path) as (api, url, ca):
        api.tokens = {"t1"}
        config = write_kubeconfig(tmp_path / "kc", url, ca, ca.issue_cert("heddle"), user)
        client = KubeClient.from_kubeconfig(config)
        try:
            await client.create(CONFIGMAPS, "default", _cm("a"))
            (tmp_path / "token").write_text("t2")  # the issuer rotates; t1 is revoked
            api.tokens = {"t2"}
            assert await client.get(CONFIGMAPS, "default", "a") is not None
        finally:
            await client.aclose()
        assert api.refused == []  # renewed in time: the server never saw the old token again
        assert plugin_calls(tmp_path) >= 2


async def test_a_refused_token_is_read_again_once_then_one_sentence(tmp_path: Path) -> None:
    user = exec_plugin(tmp_path, "t1", lifetime_s=3600)  # long-lived: cached until refused
    async with _tls(tmp_path) as (api, url, ca):
        api.tokens = {"t1"}
        config = write_kubeconfig(tmp_path / "kc", url, ca, ca.issue_cert("heddle"), user)
        # No throttling retries: the renewal after a 401 is not one of them.
        client = KubeClient.from_kubeconfig(config, retry=RetryPolicy(retries=0))
        try:
            await client.create(CONFIGMAPS, "default", _cm("a"))
            await client.get(CONFIGMAPS, "default", "a")
            assert plugin_calls(tmp_path) == 1
            (tmp_path / "token").write_text("t2")
            api.tokens = {"t2"}
            assert await client.get(CONFIGMAPS, "default", "a") is not None
            assert api.refused == ["t1"] and plugin_calls(tmp_path) == 2
            api.tokens = {"someone-else"}  # a token the plugin never gets
            with pytest.raises(ApiError, match="refused the credentials") as caught:
                await client.get(CONFIGMAPS, "default", "a")
            assert caught.value.status == 401 and api.refused[1:] == ["t2", "t2"]
        finally:
            await client.aclose()


@contextlib.asynccontextmanager
async def _plain() -> AsyncIterator[tuple[ApiServer, str]]:
    async with ApiServer() as api, kmock.Server(api) as server:
        yield api, str(server.url).rstrip("/")


async def test_lists_are_read_page_by_page(tmp_path: Path) -> None:
    async with _plain() as (api, url):
        client = KubeClient(ClusterAccess(url), retry=RetryPolicy(page_size=3))
        try:
            for i in range(7):
                await client.create(
                    CONFIGMAPS, "default", _cm(f"cm{i}", pool="a" if i % 2 else "b")
                )
            names = [o["metadata"]["name"] for o in await client.list(CONFIGMAPS, "default")]
            assert sorted(names) == [f"cm{i}" for i in range(7)]
            assert api.continued == 2  # pages 2 and 3 of 3+3+1
            odd = await client.list(CONFIGMAPS, "default", {"pool": "a"})
            assert sorted(o["metadata"]["name"] for o in odd) == ["cm1", "cm3", "cm5"]
        finally:
            await client.aclose()


async def test_429_waits_for_retry_after_then_gives_up_in_one_sentence(tmp_path: Path) -> None:
    async with _plain() as (api, url):
        client = KubeClient(ClusterAccess(url))
        try:
            await client.create(CONFIGMAPS, "default", _cm("a"))
            api.throttle = 1
            started = time.monotonic()
            assert await client.get(CONFIGMAPS, "default", "a") is not None
            assert api.throttled == 1 and time.monotonic() - started >= 1.0  # Retry-After: 1
        finally:
            await client.aclose()
        impatient = KubeClient(ClusterAccess(url), retry=RetryPolicy(retries=2, max_wait_s=0.05))
        api.throttle = 10
        try:
            with pytest.raises(ApiError, match="still overloaded after 2 retries") as caught:
                await impatient.create(CONFIGMAPS, "default", _cm("b"))
        finally:
            await impatient.aclose()
        assert caught.value.status == 429 and api.throttled == 4


@pytest.mark.slow
async def test_the_operator_logs_in_from_a_kubeconfig_over_tls_and_renews_its_token(
    tmp_path: Path,
) -> None:
    """``heddle operator`` as a process with only KUBECONFIG: kopf (login_via_client) watches
    the pool and the operator's client creates its pod; after the token rotates, both go on."""
    user = exec_plugin(tmp_path, "t1", lifetime_s=3600)
    async with _tls(tmp_path) as (api, url, ca):
        api.tokens = {"t1"}
        leaf = ca.issue_cert("heddle-operator")
        config = write_kubeconfig(tmp_path / "kubeconfig", url, ca, leaf, user)
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
        env.update(KUBECONFIG=str(config), HEDDLE_LOG_LEVEL="WARNING")
        log = (tmp_path / "operator.log").open("wb")
        process = subprocess.Popen(
            [sys.executable, "-m", "heddle", "operator", "--namespace", "default", "--no-scan",
             "--metrics-port", "0", "--liveness", "", "--data-root", str(tmp_path)],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        auth = {"Authorization": "Bearer t1"}
        verify = client_context(ca, ca.issue_cert("test"))
        try:
            async with httpx.AsyncClient(base_url=url, verify=verify, headers=auth) as http:
                spec = [{"tp": 1, "replicas": 1}]
                created = await http.post(
                    "/apis/heddle.dev/v1alpha1/namespaces/default/enginepools",
                    json=pool("p", 2, spec),
                )
                assert created.status_code < 300, created.text
                await _wait_pods(http, 1, process, tmp_path)
                (tmp_path / "token").write_text("t2")
                api.tokens = {"t2"}
                http.headers["Authorization"] = "Bearer t2"
                patched = await http.patch(
                    "/apis/heddle.dev/v1alpha1/namespaces/default/enginepools/p",
                    json={"spec": {"shape": [{"tp": 1, "replicas": 2}]}},
                    headers={"Content-Type": "application/merge-patch+json"},
                )
                assert patched.status_code == 200, patched.text
                await _wait_pods(http, 2, process, tmp_path)
            assert "t1" in api.refused and plugin_calls(tmp_path) >= 2
        finally:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            log.close()


async def _wait_pods(
    http: httpx.AsyncClient, count: int, process: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert process.poll() is None, (tmp_path / "operator.log").read_text()[-3000:]
        pods = (await http.get("/api/v1/namespaces/default/pods")).json().get("items", [])
        if len(pods) >= count:
            return
        await asyncio.sleep(0.3)
    raise AssertionError(
        f"no {count} pods after 90 s; log: {(tmp_path / 'operator.log').read_text()[-3000:]}"
    )
