"""Plain stand-ins for the admission pipeline's seams: a cluster view over fixed data, and a quota
step that admits every pod (for tests of the rules around the quota step)."""

from __future__ import annotations

from collections.abc import Mapping

from kube_vgpu.webhook.admission.gates import QuotaRequest
from kube_vgpu.webhook.placement.inventory import Inventory


class StaticView:
    """A `ValidationView` over fixed data."""

    def __init__(
        self,
        inventory: Inventory | None = None,
        namespaces: Mapping[str, Mapping[str, str]] | None = None,
        *,
        is_fresh: bool = True,
    ) -> None:
        self._inventory = inventory or Inventory()
        self._namespaces = dict(namespaces or {})
        self.is_fresh = is_fresh

    def fresh(self) -> bool:
        """As set."""
        return self.is_fresh

    @property
    def inventory(self) -> Inventory:
        """The GPU nodes."""
        return self._inventory

    def namespace_labels(self, namespace: str) -> Mapping[str, str] | None:
        """The labels given for `namespace`."""
        return self._namespaces.get(namespace)


class AllowAllQuota:
    """A quota step under which every pod fits."""

    async def admit(self, ask: QuotaRequest) -> str | None:
        """Always fits."""
        return None
