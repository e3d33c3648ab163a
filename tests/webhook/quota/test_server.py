"""Namespace quotas through the real webhook: HTTPS AdmissionReviews, the cache fed by the stand-in API.

200 pod creates fired at once, each through both phases as the API server runs them (mutate, then
name and uid, then validate: `standins.apiserver.admission_chain`), at a namespace with room for exactly 37
admit exactly 37; the admitted pods, once created, are counted once (their reservations retire by
uid); deleting pods and relabelling the namespace take effect through the watch, without a restart.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kube_vgpu.contract.names import QUOTA_CORES_LABEL, QUOTA_MEMORY_LABEL
from kube_vgpu.standins.apiserver.admission_chain import AdmissionChain, Admitted
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.webhook.quota.shared import encode_object, object_name
from tests.support.timeouts import HANG_S
from tests.support.webhook import A100, ThreadedWebhook, container, gpu_node, write_tls

NAMESPACE = "team-q"
ROOM = 37
LIMIT_MIB = (3 + ROOM) * 1024  # three running pods of 1 GiB, then room for 37 more


def burst_pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "burst-", "namespace": NAMESPACE},
        "spec": {"containers": [container(memory=1024, cores=10)]},
    }


def quota_namespace(labels: Mapping[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": dict(labels)}}


@pytest.fixture
def webhook(apiserver: ApiServerStandin, tmp_path: Path) -> Iterator[ThreadedWebhook]:
    apiserver.put(gpu_node("a100", "hami-core", [(A100, 40960)] * 8))
    apiserver.put(quota_namespace({QUOTA_MEMORY_LABEL: str(LIMIT_MIB), QUOTA_CORES_LABEL: "100000"}))
    for i in range(3):
        old = {**burst_pod(), "metadata": {"name": f"old-{i}", "namespace": NAMESPACE}}
        apiserver.put({**old, "status": {"phase": "Running"}})
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    with ThreadedWebhook(kubeconfig, write_tls(tmp_path / "tls")) as running:
        yield running


class Client:
    """Concurrent HTTPS reviews against the webhook, verifying it against the test CA."""

    def __init__(self, session: aiohttp.ClientSession, webhook: ThreadedWebhook) -> None:
        self.session = session
        self.base = f"https://127.0.0.1:{webhook.port}"
        self.context: ssl.SSLContext = webhook.tls.client_context()
        self.chain = AdmissionChain(session, self.base, webhook.tls.ca.cert_pem)
        self.metrics_url = f"http://127.0.0.1:{webhook.server.metrics_server.port}/metrics"

    async def admit(self, obj: Mapping[str, Any], *, dry_run: bool = False) -> Admitted:
        return await self.chain.create(obj, dry_run=dry_run)

    async def quota(self, metric: str, resource: str = "vgpu-memory") -> float | None:
        async with self.session.get(self.metrics_url) as response:
            text = await response.text()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == metric and sample.labels == {"namespace": NAMESPACE, "resource": resource}:
                    return float(sample.value)
        return None

    async def wait_for(self, condition: Callable[[], Awaitable[bool]], what: str) -> None:
        """Poll until the watch has carried a change to the webhook (bounded, not timed)."""
        deadline = time.monotonic() + HANG_S
        while time.monotonic() < deadline:
            if await condition():
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"the webhook never saw {what}")


async def test_two_hundred_concurrent_https_reviews_admit_exactly_37(
    webhook: ThreadedWebhook, apiserver: ApiServerStandin
) -> None:
    connector = aiohttp.TCPConnector(limit=200)
    async with aiohttp.ClientSession(connector=connector) as session:
        client = Client(session, webhook)
        assert await client.quota("kube_vgpu_quota_used") == 3 * 1024

        # dryRun is decided the same way and books nothing.
        dry = await client.admit(burst_pod(), dry_run=True)
        assert dry.allowed

        answers = await asyncio.gather(*(client.admit(burst_pod()) for _ in range(200)))
        allowed = [a for a in answers if a.allowed]
        denied = {(a.phase, a.message) for a in answers if not a.allowed}
        assert len(allowed) == ROOM
        assert denied == {
            (
                "validate",
                f"namespace {NAMESPACE}: vgpu-memory quota exceeded: "
                f"requested 1024 MiB, in use {LIMIT_MIB} MiB of {LIMIT_MIB} MiB",
            )
        }
        assert await client.quota("kube_vgpu_quota_used") == LIMIT_MIB
        assert await client.quota("kube_vgpu_quota_reserved") == ROOM * 1024
        assert await client.quota("kube_vgpu_quota_limit") == LIMIT_MIB

        # The API server stores the admitted pods with the uids validation saw: each retires its
        # own reservation, and usage stays where it was, counted once.
        created = [apiserver.put(a.pod) for a in allowed]
        assert {c["metadata"]["uid"] for c in created} == {a.pod["metadata"]["uid"] for a in allowed}

        async def reservations_retired() -> bool:
            return await client.quota("kube_vgpu_quota_reserved") == 0

        await client.wait_for(reservations_retired, "the admitted pods")
        assert await client.quota("kube_vgpu_quota_used") == LIMIT_MIB
        refused = await client.admit(burst_pod())
        assert not refused.allowed

        # Deleting two pods frees two pods' worth, at once.
        for obj in created[:2]:
            apiserver.delete("Pod", obj["metadata"]["name"], NAMESPACE)

        async def freed() -> bool:
            return await client.quota("kube_vgpu_quota_used") == LIMIT_MIB - 2 * 1024

        await client.wait_for(freed, "the deletions")
        assert [(await client.admit(burst_pod())).allowed for _ in range(3)] == [
            True,
            True,
            False,
        ]

        # Relabelling the namespace takes effect on the next review once the watch carries it.
        apiserver.put(quota_namespace({QUOTA_MEMORY_LABEL: str(LIMIT_MIB + 10 * 1024)}))

        async def relabelled() -> bool:
            return await client.quota("kube_vgpu_quota_limit") == LIMIT_MIB + 10 * 1024

        await client.wait_for(relabelled, "the new label")
        assert (await client.admit(burst_pod())).allowed


@pytest.fixture
def webhook_after_a_deletion(apiserver: ApiServerStandin, tmp_path: Path) -> Iterator[ThreadedWebhook]:
    """A webhook started where a namespace was deleted while no webhook ran: its object is left."""
    apiserver.put(gpu_node("a100", "hami-core", [(A100, 40960)] * 8))
    apiserver.put(quota_namespace({QUOTA_MEMORY_LABEL: str(LIMIT_MIB)}))
    apiserver.put(encode_object("deleted-meanwhile", "default", {}, None))
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    with ThreadedWebhook(kubeconfig, write_tls(tmp_path / "tls")) as running:
        yield running


async def test_reservation_objects_go_with_their_namespace_and_at_start_for_those_already_gone(
    apiserver: ApiServerStandin, webhook_after_a_deletion: ThreadedWebhook
) -> None:
    def reservations(namespace: str) -> dict[str, Any] | None:
        return apiserver.get("ConfigMap", object_name(namespace), "default")

    async with aiohttp.ClientSession() as session:
        client = Client(session, webhook_after_a_deletion)

        async def orphan_gone() -> bool:
            return reservations("deleted-meanwhile") is None

        await client.wait_for(orphan_gone, "the object of a namespace that no longer exists")
        assert (await client.admit(burst_pod())).allowed
        assert reservations(NAMESPACE) is not None

        apiserver.delete("Namespace", NAMESPACE)

        async def object_gone() -> bool:
            return reservations(NAMESPACE) is None

        await client.wait_for(object_gone, "the namespace's deletion")
