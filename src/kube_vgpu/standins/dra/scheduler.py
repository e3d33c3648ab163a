"""The scheduler's DRA step against the stand-in API server: allocate a ResourceClaim for a node from
the stored slices, classes and claims, and write `status.allocation` and `status.reservedFor`, as
kube-scheduler's dynamicresources plugin does at PreBind."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.standins.dra.allocator import Allocator, Selector, Unschedulable, cel_selector

__all__ = ["DraScheduler", "Unschedulable"]


class DraScheduler:
    """Allocates claims stored in `api`; one CEL environment for all of them."""

    def __init__(self, api: ApiServerStandin, *, selector: Selector | None = None) -> None:
        self.api = api
        self.selector: Selector = selector or cel_selector()
        self.new_share_id: Callable[[], str] | None = None

    def allocate(
        self, namespace: str, name: str, node: str, pod: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Allocate the claim on `node` (and reserve it for `pod`); returns the stored claim.
        Raises Unschedulable naming the request and the reason; an allocated claim is kept as is."""
        claim = self.api.get("ResourceClaim", name, namespace)
        if claim is None:
            raise Unschedulable(f"resourceclaim {namespace}/{name} does not exist")
        status = dict(claim.get("status") or {})
        if status.get("allocation") is None:
            others = [
                c
                for c in self.api.list("ResourceClaim")
                if (c.get("status") or {}).get("allocation") is not None
                and c["metadata"]["uid"] != claim["metadata"]["uid"]
            ]
            allocator = Allocator(
                self.api.list("ResourceSlice"),
                {c["metadata"]["name"]: c for c in self.api.list("DeviceClass")},
                others,
                selector=self.selector,
            )
            if self.new_share_id is not None:
                allocator.new_share_id = self.new_share_id
            status["allocation"] = allocator.allocate(claim, node)
        if pod is not None:
            reserved = list(status.get("reservedFor") or [])
            uid = pod["metadata"]["uid"]
            if all(r.get("uid") != uid for r in reserved):
                reserved.append({"resource": "pods", "name": pod["metadata"]["name"], "uid": uid})
            status["reservedFor"] = reserved
        return self.api.patch("ResourceClaim", name, {"status": status}, namespace, patch_type="merge")

    def deallocate(self, namespace: str, name: str) -> dict[str, Any]:
        """Clear the claim's allocation and reservations (its pods are gone), freeing its devices."""
        return self.api.patch(
            "ResourceClaim", name, {"status": {"allocation": None, "reservedFor": None}}, namespace, "merge"
        )
