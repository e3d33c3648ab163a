"""Builders the webhook tests share: GPU nodes as the node plugin publishes them, pods, reviews, and
Volcano's own type rule (protocol §3.1) to check what the patched annotations mean to the scheduler.

It holds no tests; it is named like a test module so it lives among the webhook's test files.
"""

from __future__ import annotations

import copy
import uuid as uuidlib
from collections.abc import Mapping, Sequence
from typing import Any

import jsonpatch

from contract.models import model_label_name, register_type
from contract.names import (
    HOSTNAME_LABEL,
    MODE_LABEL,
    MODEL_LABEL_PREFIX,
    NODE_REGISTER,
    NOUSE_GPUTYPE,
    USE_GPUTYPE,
    UUID_LABEL_PREFIX,
)
from contract.register import GpuRecord, encode_register

A10 = "NVIDIA A10"
A100 = "NVIDIA A100-PCIE-40GB"
H100 = "NVIDIA H100 80GB HBM3"
NUMBER = "volcano.sh/vgpu-number"
MEMORY = "volcano.sh/vgpu-memory"
PERCENT = "volcano.sh/vgpu-memory-percentage"
CORES = "volcano.sh/vgpu-cores"


def gpu_uuid(node: str, index: int) -> str:
    """A full-length, stable GPU UUID for a node's GPU (UUIDs on a node must not be substrings)."""
    return "GPU-" + str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f"{node}/{index}"))


def gpu_node(
    name: str,
    mode: str,
    gpus: Sequence[tuple[str, int]],
    *,
    reference_form: bool = False,
    hostname: str | None = None,
    register: bool = True,
) -> dict[str, Any]:
    """A Node with the labels and register annotation kube-vgpu's node plugin writes for (model, MiB) GPUs."""
    records = [
        GpuRecord(
            uuid=gpu_uuid(name, i),
            count=10,
            memory_mib=mib,
            type=f"NVIDIA-{model}" if reference_form else register_type(model),
            healthy=True,
            mode=mode,
        )
        for i, (model, mib) in enumerate(gpus)
    ]
    labels = {HOSTNAME_LABEL: hostname or name, MODE_LABEL: mode}
    labels |= {MODEL_LABEL_PREFIX + model_label_name(model): "true" for model, _ in gpus}
    labels |= {UUID_LABEL_PREFIX + r.uuid: "true" for r in records}
    annotations = {NODE_REGISTER: encode_register(records)} if register else {}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "status": {},
    }


def container(name: str = "main", /, **amounts: Any) -> dict[str, Any]:
    """A container with vGPU limits given as number=, memory=, percent=, cores= (strings or ints)."""
    keys = {"number": NUMBER, "memory": MEMORY, "percent": PERCENT, "cores": CORES}
    limits = {keys[k]: str(v) for k, v in amounts.items()}
    return {"name": name, "image": "busybox", "resources": {"limits": limits} if limits else {}}


def pod(
    *containers: dict[str, Any],
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    name: str = "p",
    namespace: str = "default",
    **spec: Any,
) -> dict[str, Any]:
    """A Pod as the API server hands it to admission (defaults applied are left out)."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if annotations:
        metadata["annotations"] = dict(annotations)
    if labels:
        metadata["labels"] = dict(labels)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": list(containers or [container()]), **spec},
    }


def review(
    obj: Mapping[str, Any] | None,
    *,
    uid: str = "review-1",
    operation: str = "CREATE",
    kind: str = "Pod",
    dry_run: bool = False,
) -> dict[str, Any]:
    """An AdmissionReview v1 request for `obj`."""
    namespace = str(((obj or {}).get("metadata") or {}).get("namespace", "default"))
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": kind.lower() + "s"},
            "operation": operation,
            "namespace": namespace,
            "name": str(((obj or {}).get("metadata") or {}).get("name", "")),
            "object": obj,
            "dryRun": dry_run,
        },
    }


def apply(obj: Mapping[str, Any], patch: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The object after a JSONPatch (the input is not changed)."""
    result: dict[str, Any] = jsonpatch.apply_patch(copy.deepcopy(dict(obj)), list(patch))
    return result


def volcano_type_allows(annotations: Mapping[str, str], type_field: str) -> bool:
    """Volcano's type check for one GPU (protocol §3.1): case-insensitive substrings, items untrimmed."""
    if "NVIDIA" not in type_field:
        return False
    if USE_GPUTYPE in annotations:
        return any(item.lower() in type_field.lower() for item in annotations[USE_GPUTYPE].split(","))
    if NOUSE_GPUTYPE in annotations:
        return not any(item.lower() in type_field.lower() for item in annotations[NOUSE_GPUTYPE].split(","))
    return True


def required_terms(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pod's required nodeSelectorTerms ([] when it has none)."""
    node_affinity = ((obj.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms: list[dict[str, Any]] = required.get("nodeSelectorTerms") or []
    return terms


def node_matches(node: Mapping[str, Any], terms: Sequence[Mapping[str, Any]]) -> bool:
    """Kubernetes' required node affinity rule for label expressions and metadata.name fields."""
    if not terms:
        return True
    labels: Mapping[str, str] = node["metadata"].get("labels") or {}
    fields = {"metadata.name": node["metadata"]["name"]}

    def requirement(req: Mapping[str, Any], values: Mapping[str, str]) -> bool:
        key, op, vals = req["key"], req["operator"], req.get("values") or []
        if op == "Exists":
            return key in values
        if op == "DoesNotExist":
            return key not in values
        if op == "In":
            return values.get(key) in vals
        if op == "NotIn":
            return values.get(key) not in vals
        raise AssertionError(f"operator {op} not modelled")

    def term(t: Mapping[str, Any]) -> bool:
        exprs = t.get("matchExpressions") or []
        flds = t.get("matchFields") or []
        if not exprs and not flds:
            return False
        return all(requirement(e, labels) for e in exprs) and all(requirement(f, fields) for f in flds)

    return any(term(t) for t in terms)
