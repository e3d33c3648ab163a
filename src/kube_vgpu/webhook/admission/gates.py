"""The seams of the admission pipeline: the cluster view it reads, the quota step it calls.

Both are Protocols so the pure pipeline can be driven by the live cache in the server and by plain
objects in tests. The namespace quota (`kube_vgpu.webhook.quota.gate.NamespaceQuota`) implements `QuotaGate`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from kube_vgpu.contract.resources import PodRequest
from kube_vgpu.webhook.placement.inventory import Inventory
from kube_vgpu.webhook.quota.claims import ClaimRequest
from kube_vgpu.webhook.records import PodRecord


class AdmissionView(Protocol):
    """What admission knows about the cluster: the GPU inventory and namespace labels."""

    @property
    def inventory(self) -> Inventory:
        """The GPU nodes."""
        ...

    def namespace_labels(self, namespace: str) -> Mapping[str, str] | None:
        """The labels of a namespace, or None when the namespace is not (yet) known."""
        ...


class ValidationView(AdmissionView, Protocol):
    """What the validating phase also needs: whether the view is fresh."""

    def fresh(self) -> bool:
        """Whether the view has heard from the API within the staleness bound (quota relies on it)."""
        ...


@dataclass(frozen=True)
class QuotaRequest:
    """One quota question: may this pod, as it will be stored, be created in its namespace?"""

    namespace: str
    # The namespace's labels (its quota), or None when the view does not know the namespace.
    namespace_labels: Mapping[str, str] | None
    # The pod as it will be stored (after the webhook's mutation); its uid keys the reservation, so
    # deciding twice for one pod books it once.
    pod: PodRecord
    request: PodRequest
    # The memory of the largest GPU the pod may land on given its selectors and mode (None:
    # unknown), against which a share of a card counts.
    largest_gpu_mib: int | None
    pod_uid: str
    # Decide, reserve nothing.
    dry_run: bool


class QuotaGate(Protocol):
    """The quota step, called once per vGPU pod after every other rule passed.

    Awaitable: the decision is recorded through the API, shared by every replica
    (`kube_vgpu.webhook.quota.shared_store`); the pipeline calling it stays free of I/O.
    """

    async def admit(self, ask: QuotaRequest) -> str | None:
        """None when the pod fits its namespace's quota (and, unless a dry run, is now booked), else
        the denial message."""
        ...


@dataclass(frozen=True)
class ClaimQuotaRequest:
    """One quota question for a ResourceClaim of kube-vgpu's DRA classes: may it be created?"""

    namespace: str
    namespace_labels: Mapping[str, str] | None
    claim_name: str  # for messages and logs (`name`, or `generateName*`)
    request: ClaimRequest
    # The memory of the largest GPU in the cluster (None: unknown): what a request naming no memory
    # is charged per device.
    largest_gpu_mib: int | None
    # The claim's uid keys the reservation shared with the pods' (deciding twice books it once).
    claim_uid: str
    dry_run: bool


class ClaimQuotaGate(Protocol):
    """The quota step for ResourceClaims, through the same shared reservations as pods."""

    async def admit_claim(self, ask: ClaimQuotaRequest) -> str | None:
        """None when the claim fits its namespace's quota (and, unless a dry run, is now booked),
        else the denial message."""
        ...
