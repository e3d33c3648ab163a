"""What the webhook's cache keeps of each object: the fields its decisions read, and nothing else.

Each function takes an object as the API sends it and returns its record (`kube_vgpu.webhook.records`:
a small dict of the same shape, so quota, placement and `top` read it as they read the whole object),
or None when the object is not kept at all: a pod that asks for no vGPU (a pod's resources never
change after creation, so it never will) and a node with no kube-vgpu GPU label. The cache applies
them as each object arrives (`kubeapi.listwatch`), so memory follows the vGPU pods, not the cluster.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.contract.dra import DRIVER, MEMORY_CAPACITY
from kube_vgpu.contract.names import (
    HOSTNAME_LABEL,
    MODE_LABEL,
    MODEL_LABEL_PREFIX,
    NODE_REGISTER,
    UUID_LABEL_PREFIX,
)
from kube_vgpu.kubeapi.rawlist import contains_any
from kube_vgpu.webhook.quota.claims import ClaimError, names_class, quantity
from kube_vgpu.webhook.records import (
    ClaimMetadata,
    ClaimRecord,
    ContainerRecord,
    ContainerResources,
    DeviceResult,
    Identity,
    NamespaceMetadata,
    NamespaceRecord,
    NodeMetadata,
    NodeRecord,
    PodMetadata,
    PodRecord,
    PodSpec,
    SliceDevice,
    SliceRecord,
    TemplateRecord,
)

_R = TypeVar("_R")
# An object as the API sends it -> its record, or None when it is not kept.
Reducer = Callable[[dict[str, Any]], _R | None]
Prefilter = Callable[[bytes], bool]

# Pod metadata the decisions read: identity, reservation matching (name, generateName, uid),
# deletion (Kubernetes' quota rule for terminating pods), and the re-list comparison.
_POD_METADATA: tuple[
    Literal[
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "generateName",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
    ],
    ...,
] = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generateName",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
)
# Annotation domains the decisions read: Volcano's booking and selector keys, their nvidia.com
# aliases, and kube-vgpu's own. Every other annotation (last-applied configuration, sidecar
# injectors' notes, ...) is dropped.
_ANNOTATION_PREFIXES = ("volcano.sh/", "nvidia.com/")
_OWN_DOMAIN = "kube-vgpu.io/"
_NODE_LABEL_PREFIXES = (MODEL_LABEL_PREFIX, UUID_LABEL_PREFIX)
_IDENTITY: tuple[Literal["name", "uid", "resourceVersion"], ...] = ("name", "uid", "resourceVersion")


def _intern(value: Any) -> Any:
    # Namespaces, node names and phases repeat across thousands of pods: one string each.
    return sys.intern(value) if type(value) is str else value


_M = TypeVar("_M", bound=Identity)


def _identity(meta: Mapping[str, Any], into: _M) -> _M:
    """`into` with the name, uid and resourceVersion of an object's metadata (those it has)."""
    for key in _IDENTITY:
        if key in meta:
            into[key] = meta[key]
    return into


def kept_annotation(key: str) -> bool:
    """Whether the cache keeps a pod annotation."""
    return key.startswith(_ANNOTATION_PREFIXES) or _OWN_DOMAIN in key


_RESOURCE_PARTS: tuple[Literal["limits", "requests"], ...] = ("limits", "requests")


def _container(container: dict[str, Any], names: tuple[str, ...]) -> tuple[ContainerRecord, bool]:
    """A container as quota reads it (name, restartPolicy, vGPU amounts), and whether it names a vGPU."""
    slim: ContainerRecord = {}
    if "name" in container:
        slim["name"] = container["name"]
    if "restartPolicy" in container:
        slim["restartPolicy"] = container["restartPolicy"]
    resources = container.get("resources")
    asks = False
    if isinstance(resources, dict):
        kept: ContainerResources = {}
        for part in _RESOURCE_PARTS:
            amounts = resources.get(part)
            if isinstance(amounts, dict):
                vgpu = {k: amounts[k] for k in names if k in amounts}
                if vgpu:
                    kept[part] = vgpu
                    asks = True
        if kept:
            slim["resources"] = kept
    return slim, asks


def pod_prefilter(names: ResourceNames) -> Prefilter:
    """What a pod's raw JSON must hold for `pod_reducer` to keep it: one of the vGPU resource names."""
    return contains_any(names.all())


# What a node's raw JSON must hold for `reduce_node` to keep it: a kube-vgpu GPU label.
NODE_PREFILTER: Prefilter = contains_any((MODE_LABEL, MODEL_LABEL_PREFIX, UUID_LABEL_PREFIX))


_CONTAINER_LISTS: tuple[Literal["initContainers", "containers"], ...] = ("initContainers", "containers")


def pod_reducer(names: ResourceNames) -> Reducer[PodRecord]:
    """The pod reducer for these resource names: None for a pod that names no vGPU resource."""
    keys = names.all()

    def reduce(pod: dict[str, Any]) -> PodRecord | None:
        spec = pod.get("spec")
        if not isinstance(spec, dict):
            return None
        asks = False
        slim_spec: PodSpec = {}
        # Every container stays (as a stub when it asks for nothing): quota pairs init containers
        # with their sidecar flags, and bookings with app containers, by position.
        for part in _CONTAINER_LISTS:
            containers = spec.get(part)
            if not isinstance(containers, list):
                continue
            slim_containers: list[ContainerRecord] = []
            for container in containers:
                if isinstance(container, dict):
                    slim, named = _container(container, keys)
                    slim_containers.append(slim)
                    asks = asks or named
            slim_spec[part] = slim_containers
        if not asks:
            return None
        if "nodeName" in spec:
            slim_spec["nodeName"] = _intern(spec["nodeName"])
        meta = pod.get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        slim_meta: PodMetadata = {}
        for key in _POD_METADATA:
            if key in meta:
                slim_meta[key] = meta[key]
        if "namespace" in slim_meta:
            slim_meta["namespace"] = _intern(slim_meta["namespace"])
        annotations = meta.get("annotations")
        if isinstance(annotations, dict):
            kept = {k: v for k, v in annotations.items() if kept_annotation(k)}
            if kept:
                slim_meta["annotations"] = kept
        slim_pod: PodRecord = {"metadata": slim_meta, "spec": slim_spec}
        status = pod.get("status")
        if isinstance(status, dict) and "phase" in status:
            slim_pod["status"] = {"phase": _intern(status["phase"])}
        return slim_pod

    return reduce


def reduce_node(node: dict[str, Any]) -> NodeRecord | None:
    """A node as the GPU inventory reads it (its kube-vgpu labels, hostname, register annotation,
    allocatable), or None when it carries no kube-vgpu GPU label."""
    meta = node.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    labels = meta.get("labels")
    labels = labels if isinstance(labels, dict) else {}
    kept = {k: v for k, v in labels.items() if k == MODE_LABEL or k.startswith(_NODE_LABEL_PREFIXES)}
    if not kept:
        return None
    if HOSTNAME_LABEL in labels:
        kept[HOSTNAME_LABEL] = labels[HOSTNAME_LABEL]
    slim_meta = _identity(meta, NodeMetadata())
    slim_meta["labels"] = kept
    annotations = meta.get("annotations")
    if isinstance(annotations, dict) and NODE_REGISTER in annotations:
        slim_meta["annotations"] = {NODE_REGISTER: annotations[NODE_REGISTER]}
    slim: NodeRecord = {"metadata": slim_meta}
    status = node.get("status")
    if isinstance(status, dict) and isinstance(status.get("allocatable"), dict):
        slim["status"] = {"allocatable": status["allocatable"]}
    return slim


def reduce_namespace(namespace: dict[str, Any]) -> NamespaceRecord:
    """A namespace as quota and the opt-out read it: its name and labels."""
    meta = namespace.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    slim_meta = _identity(meta, NamespaceMetadata())
    if "labels" in meta:
        slim_meta["labels"] = meta["labels"]
    return {"metadata": slim_meta}


_CLAIM_METADATA: tuple[
    Literal["name", "namespace", "uid", "resourceVersion", "generateName", "deletionTimestamp"], ...
] = ("name", "namespace", "uid", "resourceVersion", "generateName", "deletionTimestamp")
# adminAccess: such a request and its results consume nothing (quota and `top` skip them).
_DEVICE_REQUEST_FIELDS = ("name", "deviceClassName", "allocationMode", "count", "capacity", "adminAccess")
_RESULT_FIELDS: tuple[
    Literal["request", "driver", "pool", "device", "shareID", "consumedCapacity", "adminAccess"], ...
] = ("request", "driver", "pool", "device", "shareID", "consumedCapacity", "adminAccess")


def _result(raw: Mapping[str, Any]) -> DeviceResult:
    slim: DeviceResult = {}
    for key in _RESULT_FIELDS:
        if key in raw:
            slim[key] = raw[key]
    return slim


def _slim_request(raw: Any) -> Any:
    if not isinstance(raw, dict):
        return raw
    slim: dict[str, Any] = {}
    if "name" in raw:
        slim["name"] = raw["name"]
    exactly = raw.get("exactly")
    if isinstance(exactly, dict):
        slim["exactly"] = {k: exactly[k] for k in _DEVICE_REQUEST_FIELDS if k in exactly}
    elif exactly is not None:
        slim["exactly"] = exactly
    first = raw.get("firstAvailable")
    if isinstance(first, list):
        slim["firstAvailable"] = [
            {k: s[k] for k in _DEVICE_REQUEST_FIELDS if k in s} if isinstance(s, dict) else s for s in first
        ]
    elif first is not None:
        slim["firstAvailable"] = first
    return slim


def _claim_metadata(meta: Mapping[str, Any]) -> ClaimMetadata:
    slim: ClaimMetadata = {}
    for key in _CLAIM_METADATA:
        if key in meta:
            slim[key] = meta[key]
    if "namespace" in slim:
        slim["namespace"] = _intern(slim["namespace"])
    return slim


def claim_reducer(classes: frozenset[str]) -> Reducer[ClaimRecord]:
    """The ResourceClaim reducer: a claim naming one of `classes` keeps what quota and `top` read
    (its requests' classes, counts and capacity requests; its allocation results); any other claim
    is kept as its identity alone, so a pod naming it is known not to use kube-vgpu's devices."""

    def reduce(claim: dict[str, Any]) -> ClaimRecord | None:
        meta = claim.get("metadata")
        slim_meta = _claim_metadata(meta if isinstance(meta, dict) else {})
        if not names_class(claim, classes):
            return {"metadata": slim_meta}
        requests = claim["spec"]["devices"]["requests"]  # names_class found them
        slim: ClaimRecord = {
            "metadata": slim_meta,
            "spec": {"devices": {"requests": [_slim_request(r) for r in requests]}},
        }
        status = claim.get("status")
        allocation = status.get("allocation") if isinstance(status, dict) else None
        devices = allocation.get("devices") if isinstance(allocation, dict) else None
        results = devices.get("results") if isinstance(devices, dict) else None
        if isinstance(results, list):
            kept = [_result(r) for r in results if isinstance(r, dict)]
            slim["status"] = {"allocation": {"devices": {"results": kept}}}
        return slim

    return reduce


def template_reducer(classes: frozenset[str]) -> Reducer[TemplateRecord]:
    """The ResourceClaimTemplate reducer: the claim spec it stamps out, reduced as `claim_reducer`
    reduces a claim's, when it names one of `classes`; its identity alone otherwise."""
    claims = claim_reducer(classes)

    def reduce(template: dict[str, Any]) -> TemplateRecord | None:
        meta = template.get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        spec = template.get("spec")
        inner = spec.get("spec") if isinstance(spec, dict) else None
        slim_claim = claims({"metadata": meta, "spec": inner}) or {}
        slim: TemplateRecord = {"metadata": slim_claim.get("metadata", {})}
        if "spec" in slim_claim:
            slim["spec"] = {"spec": slim_claim["spec"]}
        return slim

    return reduce


# What a ResourceSlice's raw JSON must hold for `reduce_slice` to keep it: kube-vgpu's driver name.
SLICE_PREFILTER: Prefilter = contains_any((DRIVER,))


def reduce_slice(resource_slice: dict[str, Any]) -> SliceRecord | None:
    """A ResourceSlice of kube-vgpu's DRA driver as claim sizing reads it (each device's name and
    memory capacity), or None for another driver's."""
    spec = resource_slice.get("spec")
    if not isinstance(spec, dict) or spec.get("driver") != DRIVER:
        return None
    meta = resource_slice.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    devices: list[SliceDevice] = []
    for device in spec.get("devices") or ():
        if not isinstance(device, dict):
            continue
        capacity = device.get("capacity")
        memory = capacity.get(MEMORY_CAPACITY) if isinstance(capacity, dict) else None
        value = memory.get("value") if isinstance(memory, dict) else None
        devices.append({"name": device.get("name"), "capacity": {MEMORY_CAPACITY: {"value": value}}})
    return {"metadata": _identity(meta, Identity()), "spec": {"driver": DRIVER, "devices": devices}}


def slice_memory_mib(resource_slice: SliceRecord) -> list[int]:
    """The memory of each device of a reduced slice, in MiB (a capacity that does not read is left out)."""
    out = []
    for device in (resource_slice.get("spec") or {}).get("devices") or ():
        try:
            value = quantity(device["capacity"][MEMORY_CAPACITY]["value"], "memory")
        except (ClaimError, KeyError, TypeError):
            continue
        out.append(int(value // (1024 * 1024)))
    return out
