"""What `kube-vgpu top` shows, computed from the cluster's nodes, pods and namespaces (pure).

Per node: its GPUs from the Volcano register annotation the node plugin publishes, and what the
scheduler booked on them (`volcano.sh/vgpu-ids-new` of the live pods bound there, every record
counted, as the node plugin's ledger counts). Per namespace: the quota charge of its vGPU pods,
counted by the webhook's own quota ledger and sizers (`kube_vgpu.webhook.quota.sizing.pod_ledger`),
so a `mig` pod counts its slot and a share of a card the largest GPU it may land on, exactly as the
next review in that namespace is decided; against the namespace's quota labels. ResourceClaims of
kube-vgpu's DRA classes count there too (the same ledger), and each GPU a DRA driver allocated shows
the shares its claims consumed (`status.allocation.devices.results[].consumedCapacity`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.contract.devices import DeviceListError
from kube_vgpu.contract.dra import CORES_CAPACITY, DRIVER, MEMORY_CAPACITY
from kube_vgpu.contract.mig.geometry import DeviceConfig
from kube_vgpu.contract.mig.shipped import default_device_config
from kube_vgpu.contract.names import HAMI_CORE, MODE_LABEL, NODE_REGISTER, Mode
from kube_vgpu.contract.register import RegisterFormatError, decode_register
from kube_vgpu.node.deviceplugin.bookings import holds_devices, pod_uses
from kube_vgpu.webhook.placement.inventory import Inventory
from kube_vgpu.webhook.quota.charge import parse_limits
from kube_vgpu.webhook.quota.claims import ClaimError, names_class, quantity
from kube_vgpu.webhook.quota.ledger import claim_metadata, pod_metadata
from kube_vgpu.webhook.quota.sizing import pod_ledger
from kube_vgpu.webhook.records import ClaimRecord, DeviceResult, NamespaceRecord, NodeRecord, PodRecord


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
    # Pods whose share of a card no known GPU could size: counted without that memory, as the webhook does.
    uncounted: list[str] = field(default_factory=list)
    # ResourceClaims of kube-vgpu's DRA classes counted (their charge is in the figures above).
    claims: int = 0


@dataclass
class DraDeviceView:
    """One GPU allocated by kube-vgpu's DRA driver: the shares its claims consumed."""

    pool: str
    device: str
    claims: list[str] = field(default_factory=list)
    memory_mib: int = 0
    cores: int = 0
    # Claims that consumed no stated amount (a device allocated whole, without consumable capacity).
    whole: list[str] = field(default_factory=list)


@dataclass
class ClusterView:
    """Everything `top` prints."""

    nodes: list[NodeView]
    namespaces: list[NamespaceView]
    dra_devices: list[DraDeviceView] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        """The `-o json` document."""
        return asdict(self)


def _node_view(node: NodeRecord) -> NodeView | None:
    meta = node.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
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


def cluster_view(
    nodes: Iterable[NodeRecord],
    pods: Iterable[PodRecord],
    namespaces: Iterable[NamespaceRecord],
    names: ResourceNames,
    *,
    geometry: DeviceConfig | None = None,
    default_mode: Mode = HAMI_CORE,
    wall_clock: Callable[[], float] = time.time,
    claims: Iterable[ClaimRecord] = (),
    claim_classes: frozenset[str] = frozenset(),
) -> ClusterView:
    """The view of the cluster from raw API objects; `geometry` is Volcano's MIG geometry (the
    shipped one when None) and `default_mode` the webhook's: the webhook sizes pods with both.
    `claims` of `claim_classes` count per namespace as the webhook counts them."""
    claims = list(claims)
    nodes, pods = list(nodes), list(pods)
    node_views = {v.name: v for v in (_node_view(n) for n in nodes) if v is not None}
    inventory = Inventory()
    for obj in nodes:
        inventory.upsert(obj)
    mig = geometry or default_device_config()
    ledger = pod_ledger(
        lambda: inventory,
        lambda: mig,
        names,
        default_mode,
        pending_seconds=0.0,
        wall_clock=wall_clock,
        claim_classes=claim_classes,
    )
    ledger.resync(pods)
    ledger.resync_claims(claims)
    spaces: dict[str, NamespaceView] = {}
    for ns in namespaces:
        ns_meta = ns.get("metadata")
        ns_meta = ns_meta if isinstance(ns_meta, Mapping) else {}
        limits = parse_limits(ns_meta.get("labels") or {})
        if limits.any:
            ns_name = str(ns_meta.get("name", ""))
            view = spaces.setdefault(ns_name, NamespaceView(ns_name))
            view.vgpus.limit, view.memory_mib.limit, view.cores.limit = (
                limits.number,
                limits.memory_mib,
                limits.cores,
            )
    for namespace in ledger.namespaces():
        view = spaces.setdefault(namespace, NamespaceView(namespace))
        usage = ledger.usage(namespace)
        counted = ledger.pods(namespace)
        view.claims = sum(1 for name in counted if name.startswith("resourceclaim/"))
        view.pods = len(counted) - view.claims
        view.vgpus.used, view.memory_mib.used, view.cores.used = usage.number, usage.memory_mib, usage.cores
        view.uncounted = [f"{namespace}/{name}" for name in ledger.unsized(namespace)]
    for pod in pods:
        meta = pod_metadata(pod)
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
            node.pods.append(f"{meta.get('namespace', '')}/{meta.get('name', '')}")
    return ClusterView(
        nodes=sorted(node_views.values(), key=lambda v: v.name),
        namespaces=sorted(spaces.values(), key=lambda v: v.name),
        dra_devices=dra_devices(claims, claim_classes),
    )


def _results(claim: ClaimRecord) -> list[DeviceResult]:
    status = claim.get("status")
    allocation = status.get("allocation") if isinstance(status, Mapping) else None
    devices = allocation.get("devices") if isinstance(allocation, Mapping) else None
    results = devices.get("results") if isinstance(devices, Mapping) else None
    return [r for r in results if isinstance(r, Mapping)] if isinstance(results, list) else []


def dra_devices(claims: Iterable[ClaimRecord], classes: frozenset[str]) -> list[DraDeviceView]:
    """Per GPU of kube-vgpu's DRA driver, the shares allocated claims consumed (memory rounded up to
    MiB, as the driver's policy hands it out); a result whose amounts cannot be read counts as whole."""
    out: dict[tuple[str, str], DraDeviceView] = {}
    for claim in claims:
        if not names_class(claim, classes):
            continue
        meta = claim_metadata(claim)
        who = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        for result in _results(claim):
            if result.get("driver") != DRIVER or result.get("adminAccess") is True:
                continue  # admin access holds nothing of the GPU (the scheduler counts it for no one)
            pool, device = str(result.get("pool", "")), str(result.get("device", ""))
            view = out.setdefault((pool, device), DraDeviceView(pool, device))
            view.claims.append(who)
            consumed = result.get("consumedCapacity")
            try:
                if not isinstance(consumed, Mapping) or MEMORY_CAPACITY not in consumed:
                    raise ClaimError("no memory consumed")
                memory = math.ceil(quantity(consumed[MEMORY_CAPACITY], "memory") / (1024 * 1024))
                cores = math.ceil(quantity(consumed.get(CORES_CAPACITY, "100"), "cores"))
            except ClaimError:
                view.whole.append(who)
                continue
            view.memory_mib += memory
            view.cores += cores
    return sorted(out.values(), key=lambda v: (v.pool, v.device))


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
    ns_rows = [["NAMESPACE", "PODS", "CLAIMS", "VGPUS", "MEMORY(MiB)", "CORES(%)"]]
    for s in view.namespaces:
        ns_rows.append(
            [
                s.name,
                str(s.pods),
                str(s.claims),
                _ratio(s.vgpus.used, s.vgpus.limit),
                _ratio(s.memory_mib.used, s.memory_mib.limit),
                _ratio(s.cores.used, s.cores.limit),
            ]
        )
    lines.extend(_table(ns_rows) if view.namespaces else ["no namespace has vGPU pods or a GPU quota"])
    for s in view.namespaces:
        if s.uncounted:
            unsized = ", ".join(s.uncounted)
            lines.append(f"namespace {s.name}: counted without memory (no GPU known to size it): {unsized}")
    lines.append("(used/limit; '-' = no quota label)")
    if view.dra_devices:
        lines.append("")
        dra_rows = [["DRA GPU (POOL/DEVICE)", "CLAIMS", "MEMORY(MiB)", "CORES(%)"]]
        for d in view.dra_devices:
            whole = f" + {len(d.whole)} whole" if d.whole else ""
            dra_rows.append(
                [f"{d.pool}/{d.device}", str(len(d.claims)), f"{d.memory_mib}{whole}", str(d.cores)]
            )
        lines.extend(_table(dra_rows))
    return "\n".join(lines) + "\n"
