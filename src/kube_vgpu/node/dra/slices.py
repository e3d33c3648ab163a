"""The node's ResourceSlice pool, computed from its GPUs' facts and health: a pure function of them.

One device per GPU. With consumable capacity (Kubernetes 1.36's DRAConsumableCapacity) a device is
shared: `allowMultipleAllocations: true` and two capacities with request policies, `memory` (the
card's memory; a claim naming none gets the whole card; otherwise at least `MEMORY_MIN_MIB`, in 1 MiB
steps) and `cores` (percent of the SMs; default 100, 1 to 100 in steps of 1). Without it the same
capacities are published bare and a claim gets a whole GPU. An unhealthy GPU carries a `NoSchedule`
device taint (DRADeviceTaints), or, where taints are off, is left out of the pool.

The pool is built in two parts, so that partitionable devices (MIG-style devices consuming a GPU's
shared counters) can be added next without touching the first: the devices, split over as many
slices as the API's per-slice limits need, and the counter sets, which the API requires in slices of
their own (`sharedCounters` and `devices` never share a slice; `PoolSpec.counter_sets`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kube_vgpu.contract import dra
from kube_vgpu.node.dra.attributes import GpuFacts, device_attributes

# One definition with the webhook, which charges claims by the same request policy.
DRIVER = dra.DRIVER
MEMORY_MIN_MIB = dra.MEMORY_MIN_MIB
CORES = dra.CORES
UNHEALTHY_TAINT_KEY = f"{DRIVER}/unhealthy"
# k8s.io/api/resource/v1/types.go: ResourceSliceMaxDevices, and the lower limit that applies once a
# slice uses taints or counters (ResourceSliceMaxDevicesWithAdvancedFeatures).
MAX_DEVICES = 128
MAX_DEVICES_ADVANCED = 64
_NAME_MAX = 253
_LABEL_VALUE_BAD = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class SliceOptions:
    """What the API server keeps: the publisher turns a feature off when it sees its fields dropped."""

    consumable_capacity: bool = True
    device_taints: bool = True


@dataclass(frozen=True)
class Unhealthy:
    """Why and since when (RFC 3339, seconds) a GPU is out of service."""

    reason: str
    since: str


@dataclass(frozen=True)
class CounterSet:
    """A set of counters devices of the pool consume (partitionable devices): name -> quantity."""

    name: str
    counters: Mapping[str, str]


@dataclass(frozen=True)
class PoolSpec:
    """Everything one generation of the node's pool is made of."""

    node_name: str
    node_uid: str
    generation: int
    devices: Sequence[Mapping[str, Any]]
    counter_sets: Sequence[CounterSet] = field(default_factory=tuple)


def quantity_mib(mib: int) -> str:
    """`mib` MiB in the canonical form the API server stores (`81920` -> `80Gi`), so what is read
    back compares equal to what was written."""
    for suffix, scale in (("Ti", 1024 * 1024), ("Gi", 1024)):
        if mib % scale == 0 and mib >= scale:
            return f"{mib // scale}{suffix}"
    return f"{mib}Mi"


def taint_value(reason: str) -> str:
    """A health reason as a taint value (a label value: at most 63 of `[A-Za-z0-9._-]`, alphanumeric
    at both ends)."""
    value = _LABEL_VALUE_BAD.sub("-", reason)[:63].strip("-_.")
    return value or "unhealthy"


def build_device(
    facts: GpuFacts, unhealthy: Unhealthy | None, options: SliceOptions
) -> dict[str, Any] | None:
    """One GPU as a device of the pool, or None when it is unhealthy and taints are off."""
    if unhealthy is not None and not options.device_taints:
        return None
    memory = quantity_mib(facts.memory_mib)
    device: dict[str, Any] = {"name": facts.device_name, "attributes": device_attributes(facts)}
    if options.consumable_capacity:
        device["allowMultipleAllocations"] = True
        device["capacity"] = {
            "memory": {
                "value": memory,
                "requestPolicy": {
                    "default": memory,
                    "validRange": {
                        "min": quantity_mib(min(MEMORY_MIN_MIB, facts.memory_mib)),
                        "step": quantity_mib(dra.MEMORY_STEP_MIB),
                    },
                },
            },
            "cores": {
                "value": str(CORES),
                "requestPolicy": {
                    "default": str(CORES),
                    "validRange": {"min": str(dra.CORES_MIN), "max": str(CORES), "step": "1"},
                },
            },
        }
    else:
        device["capacity"] = {"memory": {"value": memory}, "cores": {"value": str(CORES)}}
    if unhealthy is not None:
        device["taints"] = [
            {
                "key": UNHEALTHY_TAINT_KEY,
                "value": taint_value(unhealthy.reason),
                "effect": "NoSchedule",
                "timeAdded": unhealthy.since,
            }
        ]
    return device


def build_devices(
    gpus: Sequence[GpuFacts], unhealthy: Mapping[str, Unhealthy], options: SliceOptions
) -> list[dict[str, Any]]:
    """The pool's devices, in minor order; `unhealthy` is keyed by GPU UUID."""
    devices = (build_device(g, unhealthy.get(g.uuid), options) for g in sorted(gpus, key=lambda g: g.minor))
    return [d for d in devices if d is not None]


def slice_name(node_name: str, k: int) -> str:
    """The name of the pool's k-th slice: `<node>-vgpu-<k>`, with the node name shortened (and a
    hash of it kept) when the whole would pass 253 characters."""
    suffix = f"-vgpu-{k}"
    if len(node_name) + len(suffix) <= _NAME_MAX:
        return node_name + suffix
    digest = hashlib.sha256(node_name.encode()).hexdigest()[:10]
    keep = _NAME_MAX - len(suffix) - len(digest) - 1
    return f"{node_name[:keep].rstrip('.-')}-{digest}{suffix}"


def build_slices(pool: PoolSpec) -> list[dict[str, Any]]:
    """The ResourceSlices of one pool generation: the devices in as few slices as the API allows,
    then one slice per counter set; every slice names the pool's full count, is bound to the node
    and owned by the Node object (so it goes when the node goes, as with real drivers)."""
    devices = list(pool.devices)
    advanced = any(d.get("taints") or d.get("consumesCounters") for d in devices)
    per_slice = MAX_DEVICES_ADVANCED if advanced else MAX_DEVICES
    chunks: list[dict[str, Any]] = [
        {"devices": devices[i : i + per_slice]} for i in range(0, len(devices), per_slice)
    ] or [{"devices": []}]
    chunks += [
        {"sharedCounters": [{"name": c.name, "counters": {k: {"value": v} for k, v in c.counters.items()}}]}
        for c in pool.counter_sets
    ]
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {
                "name": slice_name(pool.node_name, k),
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "name": pool.node_name,
                        "uid": pool.node_uid,
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "driver": DRIVER,
                "nodeName": pool.node_name,
                "pool": {
                    "name": pool.node_name,
                    "generation": pool.generation,
                    "resourceSliceCount": len(chunks),
                },
                **chunk,
            },
        }
        for k, chunk in enumerate(chunks)
    ]


def dropped_features(sent: Sequence[Mapping[str, Any]], stored: Sequence[Mapping[str, Any]]) -> SliceOptions:
    """Which features survived the API server: a feature sent in some device and absent from every
    stored copy of it was dropped (the server's `dropDisabledFields`). Returns the options that
    remain on (a feature not sent at all counts as kept: nothing says otherwise)."""
    stored_devices = {d.get("name"): d for s in stored for d in (s.get("spec") or {}).get("devices") or []}
    consumable = taints = True
    for sent_slice in sent:
        for device in (sent_slice.get("spec") or {}).get("devices") or []:
            copy = stored_devices.get(device.get("name"))
            if copy is None:
                continue
            if device.get("allowMultipleAllocations") and not copy.get("allowMultipleAllocations"):
                consumable = False
            if device.get("taints") and not copy.get("taints"):
                taints = False
    return SliceOptions(consumable_capacity=consumable, device_taints=taints)
