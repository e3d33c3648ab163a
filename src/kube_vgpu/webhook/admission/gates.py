"""The seams of the admission pipeline: the cluster view it reads, the quota step it calls (SPEC §2.2).

Both are Protocols so the pure pipeline can be driven by the live cache in the server and by plain
objects in tests. The quota ledger plugs in by implementing `QuotaGate`; `AllowAllQuota` is the default.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from kube_vgpu.contract.resources import PodRequest
from kube_vgpu.webhook.placement.inventory import Inventory


class ClusterView(Protocol):
    """What admission knows about the cluster: the GPU inventory and namespace labels."""

    @property
    def inventory(self) -> Inventory:
        """The GPU nodes."""
        ...

    def namespace_labels(self, namespace: str) -> Mapping[str, str] | None:
        """The labels of a namespace, or None when the namespace is not (yet) known."""
        ...


class ValidationView(ClusterView, Protocol):
    """What the validating phase also needs: whether the view is fresh, and which pods exist."""

    def fresh(self) -> bool:
        """Whether the view has heard from the API within the staleness bound (quota relies on it)."""
        ...

    def pod_exists(self, namespace: str, name: str) -> bool:
        """Whether a pod of that name is in the view (a CREATE of it will be refused by the API server)."""
        ...


class QuotaGate(Protocol):
    """The quota step, called once per vGPU pod after every other rule passed.

    Awaitable: with several replicas the decision is recorded through the API
    (`webhook.quota_shared`); the pipeline calling it stays free of I/O.
    """

    async def admit(
        self,
        *,
        namespace: str,
        namespace_labels: Mapping[str, str],
        pod: Mapping[str, Any],
        request: PodRequest,
        largest_gpu_mib: int | None,
        pod_uid: str,
        dry_run: bool,
    ) -> str | None:
        """None when the pod fits its namespace's quota, else the denial message.

        `pod` is the pod as it will be stored (after the webhook's mutation); `largest_gpu_mib` is the
        memory of the largest GPU it may land on given its selectors and mode (None: unknown), against
        which a memory percentage counts. `pod_uid` keys the reservation, so deciding twice for one
        pod books it once. With `dry_run` nothing may be reserved.
        """
        ...


class AllowAllQuota:
    """The quota step when no ledger is wired: every pod fits."""

    async def admit(
        self,
        *,
        namespace: str,
        namespace_labels: Mapping[str, str],
        pod: Mapping[str, Any],
        request: PodRequest,
        largest_gpu_mib: int | None,
        pod_uid: str,
        dry_run: bool,
    ) -> str | None:
        """Always fits."""
        return None


class StaticView:
    """A ClusterView over fixed data, for tests and the benchmark's pure path."""

    def __init__(
        self,
        inventory: Inventory | None = None,
        namespaces: Mapping[str, Mapping[str, str]] | None = None,
        *,
        pods: frozenset[tuple[str, str]] = frozenset(),
        is_fresh: bool = True,
    ) -> None:
        self._inventory = inventory or Inventory()
        self._namespaces = dict(namespaces or {})
        self._pods = pods
        self.is_fresh = is_fresh

    def fresh(self) -> bool:
        """As set."""
        return self.is_fresh

    def pod_exists(self, namespace: str, name: str) -> bool:
        """Whether (namespace, name) was given in `pods`."""
        return (namespace, name) in self._pods

    @property
    def inventory(self) -> Inventory:
        """The GPU nodes."""
        return self._inventory

    def namespace_labels(self, namespace: str) -> Mapping[str, str] | None:
        """The labels given for `namespace`."""
        return self._namespaces.get(namespace)
