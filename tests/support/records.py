"""Test objects read through the cache's record types (`kube_vgpu.webhook.records`).

A whole API object holds its record's fields and more, and the hostile tests hand the readers
objects that break the record's shape on purpose; both are passed on as the record type here, in
one place, instead of a cast at every call.
"""

from __future__ import annotations

from typing import cast

from kube_vgpu.webhook.records import ClaimRecord, NodeRecord, PodRecord, SliceRecord, TemplateRecord


def as_pod(obj: object) -> PodRecord:
    """`obj` as a pod record (well-formed or not)."""
    return cast(PodRecord, obj)


def as_node(obj: object) -> NodeRecord:
    """`obj` as a node record (well-formed or not)."""
    return cast(NodeRecord, obj)


def as_claim(obj: object) -> ClaimRecord:
    """`obj` as a ResourceClaim record (well-formed or not)."""
    return cast(ClaimRecord, obj)


def as_template(obj: object) -> TemplateRecord:
    """`obj` as a ResourceClaimTemplate record (well-formed or not)."""
    return cast(TemplateRecord, obj)


def as_slice(obj: object) -> SliceRecord:
    """`obj` as a ResourceSlice record (well-formed or not)."""
    return cast(SliceRecord, obj)
