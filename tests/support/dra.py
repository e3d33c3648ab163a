"""ResourceClaims the DRA tests create."""

from __future__ import annotations

from typing import Any

from kube_vgpu.demo.dra import DEVICE_CLASS


def slice_claim(
    name: str, namespace: str, memory: str, cores: int, *, request: str = "gpu"
) -> dict[str, Any]:
    """A ResourceClaim for one GPU slice: `memory` (a quantity) at `cores` percent of the SMs."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": request,
                        "exactly": {
                            "deviceClassName": DEVICE_CLASS,
                            "capacity": {"requests": {"memory": memory, "cores": str(cores)}},
                        },
                    }
                ]
            }
        },
    }
