"""The Kubernetes objects the webhook reads, as TypedDicts naming the fields it reads.

The webhook's cache keeps each watched object reduced to these fields (`kube_vgpu.webhook.reduced`
holds the one reducer per record); quota, placement and `kube-vgpu top` read the records, and read a
whole object (a pod under review, a pod `top` lists) through the same types: it has these fields and
more, which a TypedDict allows. Every field is optional (`total=False`), as the API may omit it;
readers still check what they read, since an object that bypassed admission can hold anything.

Field names and types follow k8s.io/api/core/v1/types.go (Pod, Node, Namespace) and
k8s.io/api/resource/v1/types.go (ResourceClaim, ResourceClaimTemplate, ResourceSlice). A quantity is
`Any`: the API sends a string, a client may write a number.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    # For the type checker only: the claim charge (`quota.claims`, `quota.charge`) reads pods
    # through these records, so importing its request types here at run time would be a cycle.
    from kube_vgpu.webhook.quota.claims import DeviceRequest


class Identity(TypedDict, total=False):
    """The metadata every record keeps: name, uid, and the resourceVersion a re-list compares."""

    name: str
    uid: str
    resourceVersion: str


# -- core/v1 Pod ------------------------------------------------------------------------------------


class PodMetadata(Identity, total=False):
    """The pod metadata the decisions read: identity, reservation matching (name, generateName, uid),
    deletion (Kubernetes' quota rule for terminating pods), the re-list comparison, and the
    annotations of Volcano's and kube-vgpu's domains."""

    namespace: str
    generateName: str
    deletionTimestamp: str
    deletionGracePeriodSeconds: int
    annotations: dict[str, str]


class ContainerResources(TypedDict, total=False):
    """`resources` of a container: quantities by resource name."""

    limits: dict[str, Any]
    requests: dict[str, Any]


class ContainerRecord(TypedDict, total=False):
    """A container as quota reads it (a sidecar is an init container with `restartPolicy: Always`)."""

    name: str
    restartPolicy: str
    resources: ContainerResources


class PodSpec(TypedDict, total=False):
    """`spec` of a pod: its containers, in order, and the node it is bound to."""

    initContainers: list[ContainerRecord]
    containers: list[ContainerRecord]
    nodeName: str


class PodStatus(TypedDict, total=False):
    """`status` of a pod: its phase (Succeeded and Failed pods hold nothing)."""

    phase: str


class PodRecord(TypedDict, total=False):
    """A pod: the reduced record of a vGPU pod the cache keeps, or a whole pod."""

    metadata: PodMetadata
    spec: PodSpec
    status: PodStatus


# -- core/v1 Node and Namespace ---------------------------------------------------------------------


class NodeMetadata(Identity, total=False):
    """Node metadata: kube-vgpu's GPU labels and the hostname label; the GPU register annotation."""

    labels: dict[str, str]
    annotations: dict[str, str]


class NodeStatus(TypedDict, total=False):
    """`status` of a node: quantities by resource name."""

    allocatable: dict[str, Any]


class NodeRecord(TypedDict, total=False):
    """A node with kube-vgpu GPU labels, as the GPU inventory reads it."""

    metadata: NodeMetadata
    status: NodeStatus


class NamespaceMetadata(Identity, total=False):
    """Namespace metadata: its labels hold the GPU quota and the opt-out."""

    labels: dict[str, str]


class NamespaceRecord(TypedDict, total=False):
    """A namespace."""

    metadata: NamespaceMetadata


# -- resource.k8s.io/v1 ResourceClaim, ResourceClaimTemplate, ResourceSlice -------------------------


class ClaimMetadata(Identity, total=False):
    """ResourceClaim metadata: identity, reservation matching and deletion, as for a pod."""

    namespace: str
    generateName: str
    deletionTimestamp: str


class ClaimDevices(TypedDict, total=False):
    """`spec.devices` of a claim: its requests (`kube_vgpu.webhook.quota.claims` names their fields)."""

    requests: list[DeviceRequest]


class ClaimSpec(TypedDict, total=False):
    """`spec` of a claim."""

    devices: ClaimDevices


class DeviceResult(TypedDict, total=False):
    """One `status.allocation.devices.results[]` entry: which device served which request, and the
    capacity it consumed there (quantities by capacity name)."""

    request: str
    driver: str
    pool: str
    device: str
    shareID: str
    consumedCapacity: dict[str, Any]
    adminAccess: bool


class AllocatedDevices(TypedDict, total=False):
    """`status.allocation.devices` of a claim."""

    results: list[DeviceResult]


class Allocation(TypedDict, total=False):
    """`status.allocation` of a claim."""

    devices: AllocatedDevices


class ClaimStatus(TypedDict, total=False):
    """`status` of a claim: its allocation, once the scheduler made one."""

    allocation: Allocation


class ClaimRecord(TypedDict, total=False):
    """A ResourceClaim: of kube-vgpu's classes, its requests and allocation; of another's, its
    metadata alone."""

    metadata: ClaimMetadata
    spec: ClaimSpec
    status: ClaimStatus


class TemplateSpec(TypedDict, total=False):
    """`spec` of a ResourceClaimTemplate: the claim spec it stamps out."""

    spec: ClaimSpec


class TemplateRecord(TypedDict, total=False):
    """A ResourceClaimTemplate, reduced as a claim is."""

    metadata: ClaimMetadata
    spec: TemplateSpec


class CapacityValue(TypedDict, total=False):
    """A device capacity: its quantity."""

    value: Any


class SliceDevice(TypedDict, total=False):
    """A device a slice publishes: its name (None when the driver gave none) and memory capacity."""

    name: str | None
    capacity: dict[str, CapacityValue]


class SliceSpec(TypedDict, total=False):
    """`spec` of a slice: its driver and devices."""

    driver: str
    devices: list[SliceDevice]


class SliceRecord(TypedDict, total=False):
    """A ResourceSlice of kube-vgpu's DRA driver."""

    metadata: Identity
    spec: SliceSpec


# Any record the cache keeps.
Record = PodRecord | NodeRecord | NamespaceRecord | ClaimRecord | TemplateRecord | SliceRecord
