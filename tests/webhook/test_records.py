"""The record types name exactly what the reducers keep: each reducer, given an object that holds every
field its record names and fields it does not, keeps every named field and no other.

A field a reducer keeps but its record does not name would be read untyped; a field a record names
that its reducer drops would type a read that always finds nothing.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any

import pytest

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.contract.dra import DEVICE_CLASS, DRIVER, MEMORY_CAPACITY
from kube_vgpu.contract.names import HOSTNAME_LABEL, MODE_LABEL, NODE_REGISTER, VGPU_IDS_NEW
from kube_vgpu.webhook import records
from kube_vgpu.webhook.quota import claims
from kube_vgpu.webhook.reduced import (
    claim_reducer,
    pod_reducer,
    reduce_namespace,
    reduce_node,
    reduce_slice,
    template_reducer,
)

NAMES = ResourceNames()
CLASSES = frozenset({DEVICE_CLASS})


def _hints(record: type) -> dict[str, Any]:
    # The claim request types are imported by records.py for the type checker only.
    return typing.get_type_hints(record, localns=vars(claims))


def named(record: type, prefix: str = "") -> set[str]:
    """The dotted paths of every field a record names (`[]` a list's items, `{}` a map's values)."""
    out = set()
    for key, hint in _hints(record).items():
        path = f"{prefix}{key}"
        inner, mark = hint, ""
        if typing.get_origin(hint) is list:
            inner, mark = typing.get_args(hint)[0], "[]"
        elif typing.get_origin(hint) is dict and typing.is_typeddict(typing.get_args(hint)[1]):
            inner, mark = typing.get_args(hint)[1], "{}"
        if typing.is_typeddict(inner):
            out |= named(inner, f"{path}{mark}.")
        else:
            out.add(path)
    return out


def kept(value: Any, record: type, prefix: str = "") -> set[str]:
    """The dotted paths of the fields `value` holds, walked along `record` (a field the record does
    not name is a path of its own, so it shows as a difference)."""
    hints = _hints(record)
    out = set()
    for key, item in value.items():
        path = f"{prefix}{key}"
        hint = hints.get(key)
        if hint is None:
            out.add(path)
        elif typing.get_origin(hint) is list and typing.is_typeddict(typing.get_args(hint)[0]):
            for entry in item:
                out |= kept(entry, typing.get_args(hint)[0], f"{path}[].")
        elif typing.get_origin(hint) is dict and typing.is_typeddict(typing.get_args(hint)[1]):
            for entry in item.values():
                out |= kept(entry, typing.get_args(hint)[1], f"{path}{{}}.")
        elif typing.is_typeddict(hint):
            out |= kept(item, hint, f"{path}.")
        else:
            out.add(path)
    return out


def _container(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "image": "cuda:12",
        "restartPolicy": "Always",
        "env": [{"name": "A", "value": "1"}],
        "resources": {
            "limits": {NAMES.count: "1", NAMES.memory: "4096", "cpu": "2"},
            "requests": {NAMES.count: "1", "memory": "1Gi"},
        },
    }


POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "p",
        "namespace": "team-a",
        "uid": "u-1",
        "resourceVersion": "7",
        "generateName": "p-",
        "deletionTimestamp": "2026-01-01T00:00:00Z",
        "deletionGracePeriodSeconds": 30,
        "annotations": {VGPU_IDS_NEW: "", "kubectl.kubernetes.io/last-applied-configuration": "{}"},
        "labels": {"app": "p"},
        "ownerReferences": [{"kind": "ReplicaSet", "name": "r"}],
    },
    "spec": {
        "initContainers": [_container("init")],
        "containers": [_container("main")],
        "nodeName": "n1",
        "volumes": [{"name": "v", "emptyDir": {}}],
        "schedulerName": "volcano",
    },
    "status": {"phase": "Running", "hostIP": "10.0.0.1", "conditions": [{"type": "Ready"}]},
}

NODE = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {
        "name": "n1",
        "uid": "u-n",
        "resourceVersion": "3",
        "labels": {MODE_LABEL: "hami-core", HOSTNAME_LABEL: "n1", "zone": "a"},
        "annotations": {NODE_REGISTER: "", "other": "x"},
        "creationTimestamp": "2026-01-01T00:00:00Z",
    },
    "spec": {"podCIDR": "10.1.0.0/24"},
    "status": {"allocatable": {"cpu": "8"}, "capacity": {"cpu": "8"}, "conditions": []},
}

NAMESPACE = {
    "apiVersion": "v1",
    "kind": "Namespace",
    "metadata": {"name": "team-a", "uid": "u-ns", "resourceVersion": "2", "labels": {"a": "b"}},
    "spec": {"finalizers": ["kubernetes"]},
    "status": {"phase": "Active"},
}

_ASK = {
    "deviceClassName": DEVICE_CLASS,
    "allocationMode": "ExactCount",
    "count": 1,
    "capacity": {"requests": {"memory": "2Gi"}},
    "selectors": [{"cel": {"expression": "true"}}],
    "tolerations": [],
}
_CLAIM_SPEC = {
    "devices": {
        "requests": [
            {"name": "gpu", "exactly": {**_ASK, "adminAccess": False}},
            {"name": "any", "firstAvailable": [{"name": "small", **_ASK}]},
        ],
        "constraints": [],
        "config": [],
    }
}
_CLAIM_METADATA = {
    "name": "c",
    "namespace": "team-a",
    "uid": "u-c",
    "resourceVersion": "5",
    "generateName": "c-",
    "deletionTimestamp": "2026-01-01T00:00:00Z",
    "labels": {"a": "b"},
}
CLAIM = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": _CLAIM_METADATA,
    "spec": _CLAIM_SPEC,
    "status": {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "gpu",
                        "driver": DRIVER,
                        "pool": "n1",
                        "device": "gpu-0",
                        "shareID": "s",
                        "consumedCapacity": {"memory": "2Gi"},
                        "adminAccess": False,
                        "tolerations": [],
                    }
                ],
                "config": [],
            },
            "nodeSelector": {},
        },
        "reservedFor": [{"resource": "pods", "name": "p"}],
    },
}
TEMPLATE = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaimTemplate",
    "metadata": _CLAIM_METADATA,
    "spec": {"metadata": {"labels": {"a": "b"}}, "spec": _CLAIM_SPEC},
}
SLICE = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceSlice",
    "metadata": {"name": "s", "uid": "u-s", "resourceVersion": "4", "ownerReferences": []},
    "spec": {
        "driver": DRIVER,
        "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
        "nodeName": "n1",
        "devices": [
            {
                "name": "gpu-0",
                "attributes": {"uuid": {"string": "GPU-0"}},
                "capacity": {
                    MEMORY_CAPACITY: {"value": "80Gi", "requestPolicy": {}},
                    "cores": {"value": "100"},
                },
            }
        ],
    },
}

CASES: list[tuple[str, Callable[[dict[str, Any]], Any], dict[str, Any], type]] = [
    ("pod", pod_reducer(NAMES), POD, records.PodRecord),
    ("node", reduce_node, NODE, records.NodeRecord),
    ("namespace", reduce_namespace, NAMESPACE, records.NamespaceRecord),
    ("resourceclaim", claim_reducer(CLASSES), CLAIM, records.ClaimRecord),
    ("resourceclaimtemplate", template_reducer(CLASSES), TEMPLATE, records.TemplateRecord),
    ("resourceslice", reduce_slice, SLICE, records.SliceRecord),
]


@pytest.mark.parametrize(("reduce", "whole", "record"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_reducer_keeps_every_field_its_record_names_and_no_other(
    reduce: Callable[[dict[str, Any]], Any], whole: dict[str, Any], record: type
) -> None:
    reduced = reduce(whole)
    assert reduced is not None
    assert kept(reduced, record) == named(record)


def test_the_walk_sees_a_field_the_record_does_not_name_and_a_named_field_missing() -> None:
    reduced = pod_reducer(NAMES)(POD)
    assert reduced is not None
    reduced["spec"]["containers"][0]["image"] = "cuda:12"  # type: ignore[typeddict-unknown-key]  # on purpose
    del reduced["metadata"]["generateName"]
    found = kept(reduced, records.PodRecord)
    assert "spec.containers[].image" in found - named(records.PodRecord)
    assert named(records.PodRecord) - found == {"metadata.generateName"}
