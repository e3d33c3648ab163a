"""What shared quota reservations cost one running webhook, and how it fails: HTTPS reviews through the
real server against the stand-in API, counting the API requests they make.

A namespace without quota labels never touches the API; an uncontended replica records each
admission with one write (it knows the current version); a write the API refuses, or an API that
does not answer, refuses the pod in /validate with a message saying why, while /mutate is unaffected.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kube_vgpu.contract.names import QUOTA_MEMORY_LABEL
from kube_vgpu.standins.apiserver.admission_chain import AdmissionChain
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.webhook.quota.shared import decode_entries, object_name
from tests.support.webhook import A100, ThreadedWebhook, container, gpu_node, write_tls

QUOTA_NS = "team-s"
FREE_NS = "team-free"
RESERVATIONS = "/api/v1/namespaces/default/configmaps"


def object_calls(apiserver: ApiServerStandin) -> list[str]:
    """The methods of the calls on reservation objects: reads, creates and writes (the list the
    webhook makes at start, looking for objects of deleted namespaces, is not one)."""
    return [
        r.method
        for r in apiserver.requests(path_prefix=RESERVATIONS)
        if not (r.method == "GET" and r.path == RESERVATIONS)
    ]


def gpu_pod(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "p-", "namespace": namespace},
        "spec": {"containers": [container(memory=1024, cores=10)]},
    }


@pytest.fixture
def webhook(apiserver: ApiServerStandin, tmp_path: Path) -> Iterator[ThreadedWebhook]:
    apiserver.put(gpu_node("a100", "hami-core", [(A100, 40960)] * 2))
    for name, labels in ((QUOTA_NS, {QUOTA_MEMORY_LABEL: "4096"}), (FREE_NS, {})):
        apiserver.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    with ThreadedWebhook(kubeconfig, write_tls(tmp_path / "tls")) as running:
        yield running


@pytest.fixture
async def chain(webhook: ThreadedWebhook) -> Any:
    async with aiohttp.ClientSession() as session:
        yield AdmissionChain(session, f"https://127.0.0.1:{webhook.port}", webhook.tls.ca.cert_pem)


async def test_a_namespace_without_quota_never_touches_the_api(
    apiserver: ApiServerStandin, chain: AdmissionChain
) -> None:
    apiserver.clear_requests()
    for _ in range(5):
        assert (await chain.create(gpu_pod(FREE_NS))).allowed
    assert object_calls(apiserver) == []


async def test_an_uncontended_replica_writes_once_per_admission(
    apiserver: ApiServerStandin, chain: AdmissionChain, webhook: ThreadedWebhook
) -> None:
    apiserver.clear_requests()
    first = await chain.create(gpu_pod(QUOTA_NS))
    assert first.allowed
    # The first admission in a namespace: look for the object, create it.
    assert object_calls(apiserver) == ["GET", "POST"]
    apiserver.clear_requests()
    for _ in range(3):
        assert (await chain.create(gpu_pod(QUOTA_NS))).allowed
    assert object_calls(apiserver) == ["PUT"] * 3
    # The quota is full now: the refusal is checked against a version read fresh, and nothing is written.
    apiserver.clear_requests()
    refused = await chain.create(gpu_pod(QUOTA_NS))
    assert not refused.allowed and "vgpu-memory quota exceeded" in refused.message
    assert object_calls(apiserver) == ["GET"]
    stored = apiserver.get("configmap", object_name(QUOTA_NS), "default")
    assert len(decode_entries(stored, QUOTA_NS)) == 4
    # The same traffic, as the webhook counts it on /metrics.
    metrics_url = f"http://127.0.0.1:{webhook.server.metrics_server.port}/metrics"
    async with chain.session.get(metrics_url) as response:
        text = await response.text()
    counters = {
        s.name: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if "quota_shared" in s.name
    }
    assert counters == {
        "kube_vgpu_quota_shared_writes_total": 4.0,
        "kube_vgpu_quota_shared_conflicts_total": 0.0,
        "kube_vgpu_quota_shared_reads_total": 2.0,
        "kube_vgpu_quota_shared_failures_total": 0.0,
        "kube_vgpu_quota_shared_sweeps_total": 0.0,  # nothing to drop: no write of its own
    }


async def test_a_refused_write_refuses_the_pod_in_validation_only(
    apiserver: ApiServerStandin, chain: AdmissionChain
) -> None:
    apiserver.deny("create", "configmaps", "default")
    refused = await chain.create(gpu_pod(QUOTA_NS))
    assert not refused.allowed and refused.phase == "validate"
    assert refused.message.startswith(f"namespace {QUOTA_NS}: GPU quota cannot be checked right now")
    assert "403" in refused.message and "retry" in refused.message
    assert refused.patch, "mutation ran and patched as usual"
    apiserver.allow_all()
    assert (await chain.create(gpu_pod(QUOTA_NS))).allowed


async def test_a_hung_api_refuses_before_the_api_servers_webhook_timeout(
    apiserver: ApiServerStandin, chain: AdmissionChain
) -> None:
    apiserver.set_hang(True, [RESERVATIONS])
    try:
        refused = await chain.create(gpu_pod(QUOTA_NS))
    finally:
        apiserver.set_hang(False)
    # Whichever bound fires first: the per-call read timeout or the decision's budget (both < 5 s).
    assert not refused.allowed and re.search(r"timed out|did not answer within", refused.message)
    # Nothing was admitted unbooked: the next pod sees an empty namespace and is booked.
    assert (await chain.create(gpu_pod(QUOTA_NS))).allowed
