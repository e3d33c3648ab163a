"""ResourceClaims through the webhook's real cache and quota wiring (`build_quota`, `build_services`)
against the API-server stand-in: listed and watched, counted until deleted, reservations released
when the claim appears, and pods naming cached claims and templates judged as vGPU pods."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kube_vgpu.contract.config import Config, WebhookConfig
from kube_vgpu.contract.dra import DEVICE_CLASS
from kube_vgpu.contract.names import QUOTA_MEMORY_LABEL
from kube_vgpu.kubeapi.client import Kube, load_api_client
from kube_vgpu.standins.apiserver.dra import FeatureGates
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.webhook.admission.gates import ClaimQuotaRequest
from kube_vgpu.webhook.admission.review import parse_review
from kube_vgpu.webhook.cache import ClusterCache
from kube_vgpu.webhook.metrics import WebhookMetrics
from kube_vgpu.webhook.quota.charge import Charge
from kube_vgpu.webhook.quota.claims import parse_claim
from kube_vgpu.webhook.service import build_quota, build_services
from tests.support import webhook as support
from tests.support.webhook_quota import memory_book

CLASSES = (DEVICE_CLASS,)
CONFIG = Config(webhook=WebhookConfig(dra_device_classes=CLASSES))


def claim(
    name: str, memory: str | None, *, cls: str = DEVICE_CLASS, namespace: str = "team-a"
) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls}
    if memory is not None:
        exactly["capacity"] = {"requests": {"memory": memory, "cores": "10"}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


async def wait_for(cache: ClusterCache, condition: Callable[[], bool], what: str) -> None:
    """Wait for claim events until `condition` holds (the ledger is subscribed before this)."""
    changed = asyncio.Event()
    cache.subscribe("resourceclaim", lambda event: changed.set())
    async with asyncio.timeout(30):  # only a hang reaches it
        while not condition():
            await changed.wait()
            changed.clear()
    assert condition(), what


def a100_cluster_of_1_36(apiserver: ApiServerStandin) -> None:
    """Kubernetes 1.36's gates (claims keep their capacity requests only where DRAConsumableCapacity
    is on), an 80 GiB A100 node and the namespace team-a with a 60 GiB memory quota."""
    apiserver.feature_gates = FeatureGates.of_release(36)
    apiserver.put(support.gpu_node("a100", "hami-core", [(support.A100, 81920)]))
    apiserver.put(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": "team-a", "labels": {QUOTA_MEMORY_LABEL: "61440"}},
        }
    )


async def test_claims_count_until_deleted_and_pods_using_them_are_vgpu_pods(
    apiserver: ApiServerStandin, tmp_path: Path
) -> None:
    a100_cluster_of_1_36(apiserver)
    apiserver.put(claim("sized", "20Gi"))
    apiserver.put(claim("whole", None))
    apiserver.put(claim("nic", "1Gi", cls="nic.example.com"))
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "slice", "namespace": "team-a"},
        "spec": {"spec": claim("x", "10Gi")["spec"]},
    }
    apiserver.put(template)
    # A DRA node's 96 GiB GPU is larger than any the inventory knows: a claim naming no memory gets it.
    for name, driver, memory in (("dra-node", DEVICE_CLASS, "96Gi"), ("other", "gpu.example.com", "200Gi")):
        apiserver.put(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": name},
                "spec": {
                    "driver": driver,
                    "nodeName": name,
                    "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                    "devices": [{"name": "gpu-0", "capacity": {"memory": {"value": memory}}}],
                },
            }
        )
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    kube = Kube(load_api_client(str(kubeconfig)), component="webhook")
    cache = ClusterCache(kube, watch_timeout_seconds=5, retry_seconds=0.05, claim_classes=frozenset(CLASSES))
    quota = build_quota(cache, CONFIG, WebhookMetrics(), memory_book())
    services = build_services(cache, CONFIG, WebhookMetrics(), quota, quota)
    await cache.start()
    try:
        async with asyncio.timeout(30):
            await cache.wait_synced()
        # A reservation is judged never created only once both watches moved past it.
        both, pods = cache.quota_streams_current_at(), cache.pod_stream_current_at()
        assert both is not None and pods is not None and both <= pods
        # 20 GiB + a whole (largest known) GPU; 10 + 100 cores; the NIC claim costs nothing.
        assert cache.largest_dra_gpu_mib() == 98304 and cache.largest_claim_gpu_mib() == 98304
        assert quota.usage("team-a") == Charge(2, 20480 + 98304, 110)
        stored = apiserver.get("resourceclaim", "nic", "team-a")
        assert stored is not None
        assert cache.claim("team-a", "nic") == {
            "metadata": {
                k: v
                for k, v in stored["metadata"].items()
                if k in ("name", "namespace", "uid", "resourceVersion")
            }
        }

        # A claim admitted by a review is reserved, and its reservation is released once it appears.
        fresh = claim("fresh", "5Gi")
        fresh["metadata"]["uid"] = "will-be-replaced"
        stored = apiserver.put(fresh)
        uid = stored["metadata"]["uid"]
        await wait_for(
            cache, lambda: quota.usage("team-a").memory_mib == 20480 + 98304 + 5120, "the new claim counted"
        )
        ask = ClaimQuotaRequest(
            "team-a", {QUOTA_MEMORY_LABEL: "61440"}, "fresh", parse_claim(stored, CLASSES), 81920, uid, False
        )
        assert await quota.admit_claim(ask) is not None  # over: it is already counted, not twice
        assert quota.reserved("team-a") == Charge()

        # Deleted: its share is free at once.
        apiserver.delete("resourceclaim", "whole", "team-a")
        await wait_for(
            cache, lambda: quota.usage("team-a").memory_mib == 20480 + 5120, "the deleted claim released"
        )
        assert (
            await quota.admit_claim(
                ClaimQuotaRequest(
                    "team-a",
                    {QUOTA_MEMORY_LABEL: "61440"},
                    "next",
                    parse_claim(claim("next", "30Gi"), CLASSES),
                    81920,
                    "u-next",
                    False,
                )
            )
            is None
        )

        # Pods naming a cached claim or template of the class get the isolation rules.
        for entry in (
            {"name": "g", "resourceClaimName": "sized"},
            {"name": "g", "resourceClaimTemplateName": "slice"},
        ):
            c = support.container()
            c["resources"] = {"claims": [{"name": "g"}]}
            c["env"] = [{"name": "LD_PRELOAD", "value": "/x.so"}]
            pod = support.pod(c, namespace="team-a", resourceClaims=[entry])
            pod["metadata"]["uid"] = "pod-1"
            verdict = await services.validation.review(parse_review(json.dumps(support.review(pod)).encode()))
            assert not verdict.allowed and "LD_PRELOAD" in verdict.message, entry
        nic_pod = support.pod(namespace="team-a", resourceClaims=[{"name": "n", "resourceClaimName": "nic"}])
        nic_pod["spec"]["containers"][0]["env"] = [{"name": "LD_PRELOAD", "value": "/x.so"}]
        verdict = await services.validation.review(parse_review(json.dumps(support.review(nic_pod)).encode()))
        assert verdict.allowed
    finally:
        await cache.stop()
        kube.close()


async def test_without_classes_claims_are_not_watched(apiserver: ApiServerStandin, tmp_path: Path) -> None:
    """A cluster without DRA may not serve resource.k8s.io at all: nothing is asked of it."""
    kube = Kube(load_api_client(str(apiserver.write_kubeconfig(tmp_path / "kc"))), component="webhook")
    cache = ClusterCache(kube, watch_timeout_seconds=5, retry_seconds=0.05)
    await cache.start()
    try:
        async with asyncio.timeout(30):
            await cache.wait_synced()
        assert not apiserver.requests(path_prefix="/apis/resource.k8s.io")
        assert cache.claim("team-a", "x") is None
        assert cache.quota_streams_current_at() == cache.pod_stream_current_at() is not None
    finally:
        await cache.stop()
        kube.close()
