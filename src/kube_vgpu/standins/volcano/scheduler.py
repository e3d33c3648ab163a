"""LOCAL STAND-IN for the Volcano scheduler's vGPU path: picks a node and GPUs, then binds.

It lists pending pods that name the `volcano` scheduler, filters nodes by the readiness gate
(pkg/scheduler/api/devices/nvidia/vgpu/device_info.go), `nodeSelector` and required node affinity, fits the
pod with `volcano_fit` (binpack), and POSTs a Binding carrying the six allocation annotations, as Volcano >=
1.16 does. With `node_lock`, it first takes the node lock (`hamivgpu`,
pkg/scheduler/plugins/util/nodelock/nodelock.go) as Volcano's Allocate does. Used by the demo and end-to-end
tests only; real clusters run Volcano itself.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kube_vgpu.contract import names as n
from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.contract.devices import encode_pod_devices
from kube_vgpu.kubeapi.client import ApiError, Kube
from kube_vgpu.standins.apiserver.selectors import expression_matches
from kube_vgpu.standins.volcano.fit import MigChooser, NoFit, fit_pod, node_ledger

log = logging.getLogger("kube_vgpu.standins.volcano")
# Volcano's nodelock.go: a lock younger than this refuses the allocation; writes retry this often.
LOCK_EXPIRY = timedelta(minutes=5)
# Go's time.Parse(time.RFC3339, ...): date, `T`, time, optional fraction, `Z` or a numeric offset.
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")
LOCK_TRIES = 5
READINESS_RESOURCES = ("volcano.sh/vgpu-number", "volcano.sh/vgpu-memory", "volcano.sh/vgpu-cores")


def node_matches(pod: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Whether `node` satisfies the pod's `nodeSelector` and required node affinity."""
    spec = pod.get("spec") or {}
    labels: Mapping[str, str] = (node.get("metadata") or {}).get("labels") or {}
    fields = {"metadata.name": (node.get("metadata") or {}).get("name", "")}
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if not required:
        return True
    terms = required.get("nodeSelectorTerms") or []
    return any(
        all(expression_matches(e, labels) for e in term.get("matchExpressions") or [])
        and all(expression_matches(e, fields) for e in term.get("matchFields") or [])
        and (term.get("matchExpressions") or term.get("matchFields"))
        for term in terms
    )


def _vgpu_ready(node: Mapping[str, Any]) -> bool:
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    return all(str(allocatable.get(r, "0")) not in ("0", "") for r in READINESS_RESOURCES)


@dataclass(frozen=True)
class VolcanoBinding:
    """Where a pod goes and the device list it carries."""

    node: str
    devices: str


def place(
    pod: Mapping[str, Any],
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    names: ResourceNames,
    mig_chooser: MigChooser | None = None,
) -> VolcanoBinding | str:
    """The first node (by name) the pod fits, or the reasons it fits none."""
    reasons: list[str] = []
    for node in sorted(nodes, key=lambda x: x["metadata"]["name"]):
        name = node["metadata"]["name"]
        if not _vgpu_ready(node):
            reasons.append(f"{name}: vGPU resources not advertised")
            continue
        if not node_matches(pod, node):
            reasons.append(f"{name}: node affinity/selector")
            continue
        on_node = [p for p in pods if (p.get("spec") or {}).get("nodeName") == name]
        try:
            plan = fit_pod(pod, node_ledger(node, on_node), names, mig_chooser)
        except NoFit as exc:
            reasons.append(f"{name}: {exc}")
            continue
        return VolcanoBinding(name, encode_pod_devices(plan))
    return "; ".join(reasons) or "no nodes"


class VolcanoStandin:
    """Schedules pending `volcano` pods through the API, one pass at a time."""

    def __init__(
        self,
        kube: Kube,
        names: ResourceNames,
        *,
        scheduler_name: str = "volcano",
        mig_chooser: MigChooser | None = None,
        node_lock: bool = False,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        """`node_lock` is Volcano's `deviceshare.NodeLockEnable` (default off)."""
        self.kube = kube
        self.names = names
        self.scheduler_name = scheduler_name
        self.mig_chooser = mig_chooser
        self.node_lock = node_lock
        self.clock = clock

    def schedule_once(self) -> dict[str, VolcanoBinding | str]:
        """Bind every pending pod that fits; returns pod key -> placement or the reason it waits."""
        nodes = self.kube.list("node")["items"]
        pods = self.kube.list("pod")["items"]
        outcome: dict[str, VolcanoBinding | str] = {}
        for pod in sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp", "")):
            spec = pod.get("spec") or {}
            if spec.get("nodeName") or spec.get("schedulerName") != self.scheduler_name:
                continue
            meta = pod["metadata"]
            key = f"{meta['namespace']}/{meta['name']}"
            result = place(pod, nodes, pods, self.names, self.mig_chooser)
            outcome[key] = result
            if isinstance(result, str):
                log.info("event=unschedulable pod=%s reason=%r", key, result)
                continue
            refused = self._lock_node(result.node) if self.node_lock else None
            if refused is not None:
                outcome[key] = refused
                log.info("event=node_locked pod=%s reason=%r", key, refused)
                continue
            self._bind(meta["namespace"], meta["name"], result)
            bound = self.kube.get("pod", meta["name"], namespace=meta["namespace"])
            if bound is not None:  # later pods in this pass must see this one's GPUs
                pods = [p for p in pods if p["metadata"].get("uid") != meta.get("uid")] + [bound]
        return outcome

    def _lock_node(self, node_name: str) -> str | None:
        """Take the node lock as Volcano's Allocate does (nodelock.go); the reason it failed, or None.

        Absent: set it. Younger than 5 minutes: fail. Not RFC 3339: fail with the parse error. Older:
        replace it. GET + Update, up to 5 tries 100 ms apart on a conflict. Volcano never releases it.
        """
        for _ in range(LOCK_TRIES):
            node = self.kube.get("node", node_name)
            if node is None:
                return f"node {node_name} not found"
            annotations = node["metadata"].setdefault("annotations", {})
            held = annotations.get(n.NODE_LOCK)
            if held is not None:
                try:
                    if not _RFC3339.match(held):
                        raise ValueError(f"parsing time {held!r} as RFC 3339")
                    taken = datetime.fromisoformat(held)
                except ValueError as exc:
                    return f"node {node_name} lock {n.NODE_LOCK}={held!r} is not RFC 3339: {exc}"
                if taken.tzinfo is None or self.clock() - taken < LOCK_EXPIRY:
                    return f"node {node_name} has been locked within 5 minutes"
            annotations[n.NODE_LOCK] = self.clock().astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            try:
                self.kube.replace("node", node_name, node)
                return None
            except ApiError as exc:
                if exc.status != 409:
                    return f"node {node_name} lock not taken: {exc}"
                time.sleep(0.1)
        return f"node {node_name} lock not taken: {LOCK_TRIES} conflicts"

    def _bind(self, namespace: str, name: str, placement: VolcanoBinding) -> None:
        now = str(int(time.time()))
        annotations = {
            n.VGPU_NODE: placement.node,
            n.VGPU_TIME: now,
            n.BIND_TIME: now,
            n.BIND_PHASE: n.BIND_PHASE_ALLOCATING,
            n.VGPU_IDS_NEW: placement.devices,
            n.DEVICES_TO_ALLOCATE: placement.devices,
        }
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
            "target": {"apiVersion": "v1", "kind": "Node", "name": placement.node},
        }
        self.kube.create_binding(name, namespace, body)
        log.info(
            "event=bound pod=%s/%s node=%s devices=%s", namespace, name, placement.node, placement.devices
        )
