"""The stand-in API server's errors and injected faults, and the ways to run it, driven only through
the official Kubernetes client."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3
from aiohttp.web_protocol import RequestHandler
from kubernetes import client, config

from kube_vgpu.certs.issue import issue_ca, issue_serving
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from tests.support.official_client import status_of
from tests.support.timeouts import HANG_S


@pytest.fixture
def core(apiserver: ApiServerStandin) -> Iterator[client.CoreV1Api]:
    with apiserver.api_client() as api_client:
        yield client.CoreV1Api(api_client)


def node(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}


# -- errors and faults ----------------------------------------------------------------------------------


def test_unknown_paths_are_404(core: client.CoreV1Api) -> None:
    for path in (
        "/api/v1/widgets",
        "/api/v1/namespaces/default/pods/p/nonsense",
        "/apis/apps/v1/deployments",
    ):
        request = core.api_client.param_serialize("GET", path, auth_settings=["BearerToken"])
        response = core.api_client.call_api(*request)
        response.read()
        assert response.status == 404, path
        assert json.loads(response.data)["reason"] == "NotFound"


def test_requests_without_the_right_token_are_unauthorized(apiserver: ApiServerStandin) -> None:
    anonymous = client.Configuration(host=apiserver.url)
    wrong = client.Configuration(host=apiserver.url, api_key={"BearerToken": "Bearer wrong"})
    for configuration in (anonymous, wrong):
        with client.ApiClient(configuration) as api_client:
            with pytest.raises(client.ApiException) as caught:
                client.CoreV1Api(api_client).list_node()
            assert caught.value.status == 401
            assert status_of(caught.value)["reason"] == "Unauthorized"
    # The version is public, as on a real cluster.
    with client.ApiClient(anonymous) as api_client:
        assert client.VersionApi(api_client).get_code().git_version == apiserver.git_version


def test_denied_requests_get_the_rbac_message(apiserver: ApiServerStandin, core: client.CoreV1Api) -> None:
    apiserver.put(node("n1"))
    apiserver.deny("patch", "nodes")
    apiserver.deny("list", "pods", namespace="kube-system")
    user = 'User "system:serviceaccount:kube-vgpu:kube-vgpu"'
    with pytest.raises(client.ApiException) as caught:
        core.patch_node("n1", {"metadata": {"labels": {"a": "b"}}})
    assert caught.value.status == 403
    assert status_of(caught.value)["reason"] == "Forbidden"
    assert status_of(caught.value)["message"] == (
        f'nodes "n1" is forbidden: {user} cannot patch resource "nodes" in API group "" at the cluster scope'
    )
    with pytest.raises(client.ApiException) as caught:
        core.list_namespaced_pod("kube-system")
    assert status_of(caught.value)["message"] == (
        f'pods is forbidden: {user} cannot list resource "pods" in API group "" '
        'in the namespace "kube-system"'
    )
    # Rules are precise: another verb, subresource or namespace is still allowed.
    assert core.patch_node_status("n1", {"status": {"capacity": {"cpu": "1"}}}).status.capacity == {
        "cpu": "1"
    }
    assert core.list_namespaced_pod("default").items == []
    apiserver.allow_all()
    assert core.patch_node("n1", {"metadata": {"labels": {"a": "b"}}}).metadata.labels == {"a": "b"}


def test_outage_refuses_connections_then_recovers_on_the_same_port(
    apiserver: ApiServerStandin, core: client.CoreV1Api
) -> None:
    apiserver.put(node("n1"))
    port = apiserver.port
    assert core.read_node("n1").metadata.name == "n1"  # a keep-alive connection is now pooled
    apiserver.set_outage(True)
    with pytest.raises(urllib3.exceptions.MaxRetryError) as caught:
        core.read_node("n1")
    assert isinstance(caught.value.reason, urllib3.exceptions.NewConnectionError)
    apiserver.set_outage(False)
    assert apiserver.port == port
    assert core.read_node("n1").metadata.name == "n1"


def test_hang_is_detected_by_the_client_timeout(apiserver: ApiServerStandin, core: client.CoreV1Api) -> None:
    apiserver.put(node("n1"))
    apiserver.set_hang(True, paths=["/api/v1/nodes"])
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):
        core.patch_node("n1", {"metadata": {"labels": {"a": "b"}}}, _request_timeout=0.2)
    [hung] = apiserver.requests("PATCH")
    assert hung.status is None  # never answered
    assert core.read_namespace("default").metadata.name == "default"  # other paths still answer
    apiserver.set_hang(False)
    assert core.read_node("n1", _request_timeout=5).metadata.name == "n1"


def test_request_log_keeps_method_path_query_and_body(
    apiserver: ApiServerStandin, core: client.CoreV1Api
) -> None:
    apiserver.put(node("n1"))
    core.list_node(label_selector="a=b")
    core.patch_node("n1", {"metadata": {"labels": {"a": "b"}}})
    listed, patched = apiserver.requests()
    assert (listed.method, listed.path, listed.query, listed.status) == (
        "GET",
        "/api/v1/nodes",
        {"labelSelector": "a=b"},
        200,
    )
    assert (patched.method, patched.path, patched.json()) == (
        "PATCH",
        "/api/v1/nodes/n1",
        {"metadata": {"labels": {"a": "b"}}},
    )
    apiserver.clear_requests()
    assert apiserver.requests() == []


# -- running it -----------------------------------------------------------------------------------------


def _tls_files(tmp_path: Path) -> tuple[Path, Path, Path]:
    ca = issue_ca("standin", 1)
    serving = issue_serving(ca, [], ["127.0.0.1"], 1)
    files = tmp_path / "ca.crt", tmp_path / "tls.crt", tmp_path / "tls.key"
    for path, pem in zip(files, (ca.cert_pem, serving.cert_pem, serving.key_pem), strict=True):
        path.write_bytes(pem)
    return files


def test_https_through_a_kubeconfig_file(tmp_path: Path) -> None:
    ca_file, cert_file, key_file = _tls_files(tmp_path)
    with ApiServerStandin(tls_cert_file=cert_file, tls_key_file=key_file, ca_file=ca_file) as api:
        api.put(node("n1"))
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        configuration = client.Configuration()
        config.load_kube_config(  # type: ignore[no-untyped-call]  # the client's kubeconfig loader is unannotated
            config_file=str(kubeconfig), client_configuration=configuration
        )
        assert configuration.host.startswith("https://127.0.0.1:")
        with client.ApiClient(configuration) as api_client:
            assert [n.metadata.name for n in client.CoreV1Api(api_client).list_node().items] == ["n1"]


async def test_runs_on_the_callers_loop() -> None:
    async with ApiServerStandin() as api:
        api.put(node("n1"))
        with api.api_client() as api_client:
            core = client.CoreV1Api(api_client)
            # The sync client blocks, so it runs on a worker thread while this loop serves it.
            nodes = await asyncio.to_thread(core.list_node)
            assert [n.metadata.name for n in nodes.items] == ["n1"]
            await api.set_outage_async(True)
            with pytest.raises(urllib3.exceptions.MaxRetryError):
                await asyncio.to_thread(core.list_node)
            await api.set_outage_async(False)
            assert len((await asyncio.to_thread(core.list_node)).items) == 1


async def test_an_outage_closes_a_connection_that_opens_while_the_others_are_shut_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A connection accepted just before the listening socket closed finishes opening while the open
    # ones are being shut down. aiohttp's `Server.shutdown` forgets it without closing it: it stayed
    # open through the outage, and its transport was collected unclosed (a ResourceWarning that
    # failed an unrelated test).
    async with ApiServerStandin() as api:
        loop = asyncio.get_running_loop()
        reader, writer = await asyncio.open_connection(api.host, api.port)  # kept alive, idle
        writer.write(b"GET /api/v1/nodes HTTP/1.1\r\nHost: localhost\r\n\r\n")
        await writer.drain()
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 ")  # answered, kept alive
        server = api._runner.server if api._runner is not None else None  # noqa: SLF001 (our own stand-in's runner)
        assert server is not None
        late: list[socket.socket] = []
        shutdown = RequestHandler.shutdown

        async def shutdown_opening_another(handler: RequestHandler, timeout: float | None = 15.0) -> None:  # noqa: ASYNC109 - aiohttp's signature
            if not late:  # while the first one is shut down, another finishes opening
                ours, theirs = socket.socketpair()
                late.append(theirs)
                await loop.connect_accepted_socket(server, ours)
            await shutdown(handler, timeout)

        monkeypatch.setattr(RequestHandler, "shutdown", shutdown_opening_another)
        await api.set_outage_async(True)
        theirs = late[0]
        theirs.setblocking(False)
        try:
            async with asyncio.timeout(HANG_S):
                assert await loop.sock_recv(theirs, 1) == b""  # closed by the server
        finally:
            theirs.close()
            writer.close()
        await api.set_outage_async(False)
