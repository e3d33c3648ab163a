"""The DRA objects the demo (and the tests that pin it) put in the stand-in cluster: the DeviceClass
the chart installs, ResourceClaims, and the NVIDIA Container Toolkit's CDI spec of a node's GPUs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kube_vgpu.node.dra.slices import DRIVER

# The DeviceClass the chart installs (helm/kube-vgpu/templates/node-deviceclass.yaml).
DEVICE_CLASS = DRIVER


def device_class() -> dict[str, Any]:
    """`vgpu.kube-vgpu.io`: every device of the driver."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }


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


def nvidia_cdi_spec(gpus: Sequence[tuple[int, str]]) -> dict[str, Any]:
    """What `nvidia-ctk cdi generate` writes for GPUs given as (index, UUID): each GPU named by its
    index and by its UUID, plus `all`, with the control devices as common edits."""
    devices: list[dict[str, Any]] = []
    for index, uuid in gpus:
        edits = {"deviceNodes": [{"path": f"/dev/nvidia{index}"}]}
        devices += [{"name": str(index), "containerEdits": edits}, {"name": uuid, "containerEdits": edits}]
    devices.append(
        {"name": "all", "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{i}"} for i, _ in gpus]}}
    )
    return {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": devices,
        "containerEdits": {
            "deviceNodes": [{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia-uvm"}],
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
        },
    }
