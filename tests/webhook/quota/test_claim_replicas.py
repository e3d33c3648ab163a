"""Quota over ResourceClaims exact across two `kube-vgpu webhook` processes sharing one stand-in API
server: concurrent claim CREATEs, each validated on either replica, at a namespace with room for
exactly K claims: exactly K admitted, the rest refused naming the memory label; once stored, every
replica's cache counts them; deleted ones free exactly their share."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kube_vgpu.contract.dra import DEVICE_CLASS
from kube_vgpu.contract.names import QUOTA_MEMORY_LABEL
from kube_vgpu.standins.apiserver.admission_chain import AdmissionChain, admission_review
from kube_vgpu.standins.apiserver.dra import FeatureGates
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.webhook.quota.shared import decode_entries, object_name
from tests.support.webhook import A100, TlsFiles, gpu_node
from tests.support.webhook_replicas import Replica, is_ready, memory_used_is, wait_for, webhook_replicas

NAMESPACE = "team-r"
RELEASE = "kube-vgpu"
ROOM = 10  # claims of 2 GiB that fit
CLAIMS = 60
FREED = 3


def claim_review(*, dry_run: bool = False) -> dict[str, Any]:
    """A ResourceClaim CREATE as the API server sends it to a validating webhook (uid filled in)."""
    name = f"slice-{uuid.uuid4().hex[:8]}"
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": str(uuid.uuid4())},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": DEVICE_CLASS,
                            "allocationMode": "ExactCount",
                            "count": 1,
                            "capacity": {"requests": {"memory": "2Gi", "cores": "10"}},
                        },
                    }
                ]
            }
        },
    }
    return admission_review(claim, username="alice", dry_run=dry_run)


@pytest.fixture
def replicas(apiserver: ApiServerStandin, tmp_path: Path) -> Iterator[tuple[list[Replica], TlsFiles]]:
    # Claims keep their capacity requests only where DRAConsumableCapacity is on (1.36).
    apiserver.feature_gates = FeatureGates.of_release(36)
    apiserver.put(gpu_node("a100", "hami-core", [(A100, 81920)] * 2))
    apiserver.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": RELEASE}})
    labels = {QUOTA_MEMORY_LABEL: str(ROOM * 2048)}
    apiserver.put(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": labels}}
    )
    config = tmp_path / "config.yaml"
    config.write_text(f"webhook:\n  draDeviceClasses: [{DEVICE_CLASS}]\n")
    with webhook_replicas(apiserver, tmp_path, 2, release=RELEASE, args=("--config", str(config))) as started:
        yield started


@pytest.mark.slow
async def test_two_replicas_refuse_the_claim_that_would_pass_the_memory_label(
    apiserver: ApiServerStandin, replicas: tuple[list[Replica], TlsFiles]
) -> None:
    procs, tls = replicas
    rng = random.Random(35)
    context = tls.client_context()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=100)) as session:
        for replica in procs:
            await wait_for(is_ready(session, replica, context), f"replica {replica.port} ready")
        chains = [AdmissionChain(session, r.base, tls.ca.cert_pem) for r in procs]

        dry = await asyncio.gather(
            *(rng.choice(chains).call("/validate", claim_review(dry_run=True)) for _ in range(20))
        )
        assert all(a["allowed"] for a in dry)
        assert apiserver.get("configmap", object_name(NAMESPACE), RELEASE) is None

        reviews = [claim_review() for _ in range(CLAIMS)]
        answers = await asyncio.gather(*(rng.choice(chains).call("/validate", r) for r in reviews))
        admitted = [r["request"]["object"] for r, a in zip(reviews, answers, strict=True) if a["allowed"]]
        assert len(admitted) == ROOM
        refused = [a["status"]["message"] for a in answers if not a["allowed"]]
        assert all("vgpu-memory quota exceeded: requested 2048 MiB" in m for m in refused), refused
        assert all(f"of {ROOM * 2048} MiB" in m for m in refused)
        stored = apiserver.get("configmap", object_name(NAMESPACE), RELEASE)
        assert set(decode_entries(stored, NAMESPACE)) == {c["metadata"]["uid"] for c in admitted}

        # Stored (the uid validation saw): every replica's cache counts them.
        for obj in admitted:
            apiserver.put(obj)
        for replica in procs:
            await wait_for(
                memory_used_is(session, replica, NAMESPACE, ROOM * 2048),
                f"replica {replica.port} counting the stored claims",
            )
        # Deleted: exactly their share fits again, whichever replica decides.
        for obj in admitted[:FREED]:
            apiserver.delete("resourceclaim", obj["metadata"]["name"], NAMESPACE)
        for replica in procs:
            await wait_for(
                memory_used_is(session, replica, NAMESPACE, (ROOM - FREED) * 2048),
                f"replica {replica.port} seeing the deletions",
            )
        second = await asyncio.gather(
            *(rng.choice(chains).call("/validate", claim_review()) for _ in range(20))
        )
        assert sum(bool(a["allowed"]) for a in second) == FREED
