"""The cluster the bypass tests attack: the stand-in API server, the real webhook over HTTPS, and the
API server's admission order (mutate, system metadata, validate once) for each CREATE.

It holds no tests; it is named like a test module so it lives among the webhook's test files.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kube_vgpu.contract.config import Config, WebhookConfig
from kube_vgpu.contract.names import (
    QUOTA_CORES_LABEL,
    QUOTA_MEMORY_LABEL,
    QUOTA_NUMBER_LABEL,
)
from kube_vgpu.standins.apiserver.admission_chain import admission_review, with_system_metadata
from kube_vgpu.standins.apiserver.defaults import decoded
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.webhook.admission.review import decode_patch
from tests.support.timeouts import HANG_S
from tests.support.webhook import (
    A100,
    H100,
    ThreadedWebhook,
    apply,
    container,
    gpu_node,
    pod,
    post,
    write_tls,
)

SCHEDULER = "system:serviceaccount:volcano-system:volcano-scheduler"
NODE_PLUGIN = "system:serviceaccount:gpu-system:kube-vgpu-node"
AUTHOR = "alice@example.com"
NAMESPACES = {
    "free": {},
    "one-gpu": {QUOTA_NUMBER_LABEL: "1"},
    "two-gpus": {QUOTA_NUMBER_LABEL: "2"},
    "cores-150": {QUOTA_CORES_LABEL: "150"},
    "mem-15000": {QUOTA_MEMORY_LABEL: "15000"},
}
BOOKING = "GPU-0000,NVIDIA,10000,0:;"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Cluster:
    """The stand-in API server and the webhook reading it."""

    apiserver: ApiServerStandin
    webhook: ThreadedWebhook
    clock: Clock
    answers: list[dict[str, Any]] = field(default_factory=list)

    def call(self, path: str, review: Mapping[str, Any]) -> dict[str, Any]:
        with contextlib.closing(self.webhook.connect()) as conn:
            status, answer = post(conn, review, path=path)
        assert status == 200, answer
        response: dict[str, Any] = answer["response"]
        assert response["uid"] == review["request"]["uid"]
        return response

    def create(self, obj: Mapping[str, Any], *, dry_run: bool = False, reinvoke: int = 0) -> dict[str, Any]:
        """Decode as the API server does (quantities canonical: 10000 is `10k`), mutate (reinvoked
        `reinvoke` more times), fill system metadata, validate: the last answer."""
        obj = decoded(obj)
        response = self.call("/mutate", admission_review(obj, username=AUTHOR, dry_run=dry_run))
        if not response["allowed"]:
            return response | {"phase": "mutate"}
        mutated = apply(obj, decode_patch({"response": response}))
        for _ in range(reinvoke):  # a later webhook changed the pod: the API server asks again
            again = self.call("/mutate", admission_review(mutated, username=AUTHOR, dry_run=dry_run))
            assert again["allowed"] and "patch" not in again
        final = with_system_metadata(mutated)
        validated = self.call("/validate", admission_review(final, username=AUTHOR, dry_run=dry_run))
        warnings = [*response.get("warnings", []), *validated.get("warnings", [])]
        return validated | {"phase": "validate", "pod": final, "warnings": warnings}

    def store(self, answer: Mapping[str, Any]) -> dict[str, Any]:
        """The API server writes an admitted pod, with the uid validation saw."""
        stored = self.apiserver.put(answer["pod"])
        assert stored["metadata"]["uid"] == answer["pod"]["metadata"]["uid"]
        return stored

    def update(self, old: Mapping[str, Any], new: Mapping[str, Any], username: str) -> dict[str, Any]:
        review = admission_review(new, operation="UPDATE", old=old, username=username)
        return self.call("/validate", review)

    def wait_cached(self, namespace: str, name: str) -> None:
        """Until the webhook's pod cache shows the pod (bounded)."""
        key = f"{namespace}/{name}"
        deadline = time.monotonic() + HANG_S
        while time.monotonic() < deadline:
            if self.webhook.read(lambda: key in self.webhook.server.cache.objects("pod")):
                return
            self.webhook.call(_sleep(0.01))
        raise AssertionError(f"the webhook never saw pod {key}")


async def _sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)


def start(apiserver: ApiServerStandin, tmp_path: Path, config: Config | None = None) -> Cluster:
    apiserver.put(gpu_node("a100", "hami-core", [(A100, 40960)] * 4))
    apiserver.put(gpu_node("h100", "mig", [(H100, 81920)] * 2))
    for name, labels in NAMESPACES.items():
        apiserver.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
    clock = Clock()
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    config = config or Config(
        webhook=WebhookConfig(annotation_writers=(SCHEDULER, NODE_PLUGIN), cache_staleness_seconds=120)
    )
    webhook = ThreadedWebhook(kubeconfig, write_tls(tmp_path / "tls"), config, clock=clock)
    return Cluster(apiserver, webhook, clock)


def gpu_pod(namespace: str = "free", name: str = "p", **amounts: Any) -> dict[str, Any]:
    return pod(container(**(amounts or {"memory": 1000, "cores": 10})), namespace=namespace, name=name)


def refused(answer: Mapping[str, Any], *words: str) -> bool:
    message = str((answer.get("status") or {}).get("message", ""))
    return not answer["allowed"] and all(w in message for w in words)


def running_pod(cluster: Cluster, annotations: Mapping[str, str]) -> dict[str, Any]:
    admitted = cluster.create(gpu_pod("mem-15000", "train", memory=10000))
    assert admitted["allowed"]
    running: dict[str, Any] = copy.deepcopy(admitted["pod"])
    running["metadata"]["annotations"] = {**running["metadata"].get("annotations", {}), **annotations}
    return running
