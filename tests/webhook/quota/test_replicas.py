"""Quota exact across webhook replicas (issue 13): three `kube-vgpu webhook` processes, each with its
own cache and API client, against one stand-in API server.

1,000 concurrent creates, each mutated on one replica and validated on another at random (as the API
server's calls through a Service land), at a namespace with room for exactly K: exactly K admitted.
Dry runs reserve nothing; a pod validated twice (an API-server retry) on two replicas and mutated
twice (reinvocation) counts once. Once the admitted pods exist and some are deleted, exactly the
freed amount fits again.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kube_vgpu.contract.names import QUOTA_MEMORY_LABEL
from kube_vgpu.standins.apiserver.admission_chain import (
    AdmissionChain,
    Admitted,
    admission_review,
    create_across,
)
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.webhook.quota.shared import decode_entries, object_name
from tests.support.timeouts import HANG_S
from tests.support.webhook import A100, TlsFiles, container, gpu_node
from tests.support.webhook_replicas import Replica, is_ready, memory_used_is, wait_for, webhook_replicas

NAMESPACE = "team-r"
RELEASE = "kube-vgpu"
ROOM = 50  # K: pods of 1 GiB that fit
PODS = 1000
FREED = 13
REPLICAS = 3


def burst_pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "burst-", "namespace": NAMESPACE},
        "spec": {"containers": [container(memory=1024, cores=10)]},
    }


@pytest.fixture
def replicas(apiserver: ApiServerStandin, tmp_path: Path) -> Iterator[tuple[list[Replica], TlsFiles]]:
    apiserver.put(gpu_node("a100", "hami-core", [(A100, 81920)] * 8))
    apiserver.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": RELEASE}})
    labels = {QUOTA_MEMORY_LABEL: str(ROOM * 1024)}
    apiserver.put(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": labels}}
    )
    # 1,000 reviews at once on a loaded machine: handshakes must not meet the deadline.
    args = ("--request-timeout", str(HANG_S))
    with webhook_replicas(apiserver, tmp_path, REPLICAS, release=RELEASE, args=args) as started:
        yield started


@pytest.mark.slow
# Three webhook processes and 1,000 reviews: 35 s alone, 110 s with a second test run beside it on
# two loaded cores, so the suite's 120 s bound would be met by load, not by a hang.
@pytest.mark.timeout(480)
async def test_three_replicas_admit_exactly_the_quota(
    apiserver: ApiServerStandin, replicas: tuple[list[Replica], TlsFiles]
) -> None:
    procs, tls = replicas
    rng = random.Random(13)
    context = tls.client_context()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=300)) as session:
        for replica in procs:
            await wait_for(is_ready(session, replica, context), f"replica {replica.port} ready")
        chains = [AdmissionChain(session, r.base, tls.ca.cert_pem) for r in procs]

        def pair() -> tuple[AdmissionChain, AdmissionChain]:
            m = rng.randrange(REPLICAS)
            v = (m + rng.randrange(1, REPLICAS)) % REPLICAS  # another replica
            return chains[m], chains[v]

        # Dry runs are decided and reserve nothing: all fit, and nothing is shared.
        dry = await asyncio.gather(*(create_across(*pair(), burst_pod(), dry_run=True) for _ in range(60)))
        assert all(a.allowed for a in dry)
        assert apiserver.get("configmap", object_name(NAMESPACE), RELEASE) is None

        async def repeated(a: AdmissionChain, b: AdmissionChain) -> list[Admitted]:
            """One pod mutated twice (reinvocation) and validated twice, on two replicas (a retry)."""
            admitted = await create_across(a, b, burst_pod())
            again = await a.call("/mutate", admission_review(admitted.pod))
            assert again["allowed"] and not again.get("patch"), "reinvocation must be a no-op"
            retry = await (a if b is not a else b).call("/validate", admission_review(admitted.pod))
            return [admitted, Admitted(bool(retry["allowed"]), admitted.pod)]

        jobs: list[Any] = []
        for i in range(PODS):
            if i % 10 == 0:
                jobs.append(repeated(*pair()))
            elif i % 10 == 5:
                jobs.append(create_across(*pair(), burst_pod(), dry_run=True))
            else:
                jobs.append(create_across(*pair(), burst_pod()))
        results = await asyncio.gather(*jobs)
        real: dict[str, dict[str, Any]] = {}
        for i, result in enumerate(results):
            if i % 10 == 5:
                continue  # dry runs
            for admitted in result if isinstance(result, list) else [result]:
                if admitted.allowed:
                    real[admitted.pod["metadata"]["uid"]] = admitted.pod
        assert len(real) == ROOM
        denied = {r.message for r in results if isinstance(r, Admitted) and not r.allowed and r.phase}
        assert all("vgpu-memory quota exceeded" in m for m in denied), denied
        obj = apiserver.get("configmap", object_name(NAMESPACE), RELEASE)
        assert set(decode_entries(obj, NAMESPACE)) == set(real)

        # The admitted pods are stored (with the uid validation saw); every replica's cache counts them.
        pods = list(real.values())
        for pod in pods:
            apiserver.put(pod)
        for replica in procs:
            await wait_for(
                memory_used_is(session, replica, NAMESPACE, ROOM * 1024),
                f"replica {replica.port} counting the stored pods",
            )
        # Some are deleted: exactly their share fits again, whichever replicas decide.
        for pod in pods[:FREED]:
            apiserver.delete("pod", pod["metadata"]["name"], NAMESPACE)
        for replica in procs:
            await wait_for(
                memory_used_is(session, replica, NAMESPACE, (ROOM - FREED) * 1024),
                f"replica {replica.port} seeing the deletions",
            )
        second = await asyncio.gather(*(create_across(*pair(), burst_pod()) for _ in range(300)))
        assert sum(a.allowed for a in second) == FREED
