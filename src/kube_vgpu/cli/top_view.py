"""What `kube-vgpu top` shows, computed from the cluster's nodes, pods and namespaces (pure).

Per node: its GPUs from the Volcano register annotation the node plugin publishes, and what the
scheduler booked on them (`volcano.sh/vgpu-ids-new` of the live pods bound there, every record
counted, as the node plugin's ledger counts). Per namespace: the quota charge of its live vGPU
pods, as the webhook computes it, against the namespace's quota labels.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.contract.devices import DeviceListError
from kube_vgpu.contract.names import MODE_LABEL, NODE_REGISTER
from kube_vgpu.contract.register import RegisterFormatError, decode_register
from kube_vgpu.contract.resources import RequestError, parse_pod
from kube_vgpu.node.deviceplugin.bookings import holds_devices, pod_uses
from kube_vgpu.node.deviceplugin.selection import TERMINAL_PHASES
from kube_vgpu.webhook.quota.charge import (
    GpuSizeUnknown,
    booked_memory,
    parse_limits,
    pod_charge,
    restartable_init_flags,
)


@dataclass
class NodeView:
    """One GPU node."""

    name: str
    mode: str
    gpus: int
    healthy_gpus: int
    models: list[str]
    memory_mib: int
    memory_allocated_mib: int = 0
    cores: int = 0
    cores_allocated: int = 0
    vgpus: int = 0
    vgpus_allocated: int = 0
    pods: list[str] = field(default_factory=list)
    problem: str = ""  # a register annotation that did not decode


@dataclass
class Quota:
    """Used and limit (None = unlimited) of one quota resource."""

    used: int = 0
    limit: int | None = None


@dataclass
class NamespaceView:
    """One namespace with vGPU pods or a GPU quota."""

    name: str
    pods: int = 0
    vgpus: Quota = field(default_factory=Quota)
    memory_mib: Quota = field(default_factory=Quota)
    cores: Quota = field(default_factory=Quota)
    uncounted: list[str] = field(default_factory=list)  # pods whose charge could not be computed


@dataclass
class ClusterView:
    """Everything `top` prints."""

    nodes: list[NodeView]
    namespaces: list[NamespaceView]

    def as_json(self) -> dict[str, Any]:
        """The `-o json` document."""
        return asdict(self)


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _node_view(node: Mapping[str, Any]) -> NodeView | None:
    meta = _meta(node)
    annotation = (meta.get("annotations") or {}).get(NODE_REGISTER)
    if not isinstance(annotation, str):
        return None
    name = str(meta.get("name", ""))
    mode = str((meta.get("labels") or {}).get(MODE_LABEL, "-"))
    try:
        records = decode_register(annotation)
    except (RegisterFormatError, ValueError) as exc:
        return NodeView(name, mode, 0, 0, [], 0, problem=f"{NODE_REGISTER} does not decode: {exc}")
    healthy = [r for r in records if r.healthy and r.count > 0]
    return NodeView(
        name=name,
        mode=mode,
        gpus=len(records),
        healthy_gpus=len(healthy),
        models=sorted({r.type for r in records}),
        memory_mib=sum(r.memory_mib for r in healthy),
        cores=100 * len(healthy),
        vgpus=sum(r.count for r in healthy),
    )


def _live(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") not in TERMINAL_PHASES


def cluster_view(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    namespaces: Iterable[Mapping[str, Any]],
    names: ResourceNames,
) -> ClusterView:
    """The view of the cluster from raw API objects."""
    node_views = {v.name: v for v in (_node_view(n) for n in nodes) if v is not None}
    largest_gpu = max((v.memory_mib // max(v.healthy_gpus, 1) for v in node_views.values()), default=None)
    spaces: dict[str, NamespaceView] = {}
    for ns in namespaces:
        limits = parse_limits(_meta(ns).get("labels") or {})
        if limits.any:
            view = spaces.setdefault(
                str(_meta(ns).get("name", "")), NamespaceView(str(_meta(ns).get("name", "")))
            )
            view.vgpus.limit, view.memory_mib.limit, view.cores.limit = (
                limits.number,
                limits.memory_mib,
                limits.cores,
            )
    for pod in pods:
        meta = _meta(pod)
        pod_name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        node_name = (pod.get("spec") or {}).get("nodeName")
        node = node_views.get(node_name) if isinstance(node_name, str) else None
        if node is not None and holds_devices(pod, node.name):
            try:
                uses = pod_uses(pod, names)
            except DeviceListError:
                uses = []
            node.memory_allocated_mib += sum(u.memory_mib for u in uses)
            node.cores_allocated += sum(u.cores for u in uses)
            node.vgpus_allocated += len(uses)
            node.pods.append(pod_name)
        if not _live(pod):
            continue
        try:
            request = parse_pod(pod, names)
        except RequestError:
            continue  # the webhook refuses such pods; nothing to charge
        if not request.asks_vgpu:
            continue
        namespace = str(meta.get("namespace", ""))
        view = spaces.setdefault(namespace, NamespaceView(namespace))
        view.pods += 1
        try:
            charge = pod_charge(
                request,
                gpu_mib=largest_gpu,
                sidecars=restartable_init_flags(pod),
                booked_mib=booked_memory(pod, request),
            )
        except GpuSizeUnknown:
            view.uncounted.append(pod_name)
            continue
        view.vgpus.used += charge.number
        view.memory_mib.used += charge.memory_mib
        view.cores.used += charge.cores
    return ClusterView(
        nodes=sorted(node_views.values(), key=lambda v: v.name),
        namespaces=sorted(spaces.values(), key=lambda v: v.name),
    )


def _ratio(used: int, total: int | None) -> str:
    return f"{used}/{'-' if total is None else total}"


def _percent(used: int, total: int) -> str:
    return f"{100 * used // total}%" if total else "-"


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["   ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def render_text(view: ClusterView) -> str:
    """Two tables, in the style of `kubectl top`: nodes, then namespaces."""
    node_rows = [["NODE", "MODE", "GPUS", "MEMORY(MiB)", "MEMORY%", "CORES(%)", "CORES%", "VGPUS", "PODS"]]
    for n in view.nodes:
        node_rows.append(
            [
                n.name,
                n.mode,
                f"{n.healthy_gpus}/{n.gpus}" if not n.problem else "?",
                _ratio(n.memory_allocated_mib, n.memory_mib),
                _percent(n.memory_allocated_mib, n.memory_mib),
                _ratio(n.cores_allocated, n.cores),
                _percent(n.cores_allocated, n.cores),
                _ratio(n.vgpus_allocated, n.vgpus),
                str(len(n.pods)),
            ]
        )
    lines = _table(node_rows) if view.nodes else ["no GPU nodes (no node carries " + NODE_REGISTER + ")"]
    for n in view.nodes:
        if n.problem:
            lines.append(f"node {n.name}: {n.problem}")
    lines.append("")
    ns_rows = [["NAMESPACE", "PODS", "VGPUS", "MEMORY(MiB)", "CORES(%)"]]
    for s in view.namespaces:
        ns_rows.append(
            [
                s.name,
                str(s.pods),
                _ratio(s.vgpus.used, s.vgpus.limit),
                _ratio(s.memory_mib.used, s.memory_mib.limit),
                _ratio(s.cores.used, s.cores.limit),
            ]
        )
    lines.extend(_table(ns_rows) if view.namespaces else ["no namespace has vGPU pods or a GPU quota"])
    for s in view.namespaces:
        if s.uncounted:
            lines.append(f"namespace {s.name}: not counted (no GPU size known): {', '.join(s.uncounted)}")
    lines.append("(used/limit; '-' = no quota label)")
    return "\n".join(lines) + "\n"
