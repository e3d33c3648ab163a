"""One node serves kube-vgpu's GPUs through one API: a DRA node must not also run a Volcano device
plugin (kube-vgpu's own in `deviceplugin` mode, or Volcano's), or the same GPU is handed out twice,
once by the default scheduler's claims and once by Volcano's bookings. The same holds for NVIDIA's
k8s-device-plugin, which the GPU Operator deploys on every GPU node by default and which advertises
`nvidia.com/gpu` (NVIDIA/k8s-device-plugin, `api/config/v1/consts.go`: ResourceNamePrefix
"nvidia.com", DefaultResourceName "gpu"): pods asking that resource get the GPUs claims hold.

A device plugin shows in the Node's `status.capacity` and `status.allocatable` under the resource
names it registers. When its plugin goes, the kubelet keeps the name with a capacity of 0
(pkg/kubelet/cm/devicemanager: a resource whose endpoint is gone is reported with no devices), so
only a non-zero amount counts. Pure: the Node object in, the finding out.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any, Final

from kube_vgpu.node.dra.limits import quantity_value

# The Warning Event's reason on the Node while a device plugin serves it too.
DEVICE_PLUGIN_ON_DRA_NODE: Final = "DevicePluginOnDRANode"
# The resource NVIDIA's k8s-device-plugin advertises for whole GPUs.
NVIDIA_GPU_RESOURCE: Final = "nvidia.com/gpu"


def device_plugin_resources(node: Mapping[str, Any], names: Iterable[str]) -> dict[str, str]:
    """The resource names of `names` the node advertises with a non-zero amount (capacity or
    allocatable), with the amount as written; a value that is no quantity counts as present."""
    status = node.get("status")
    found: dict[str, str] = {}
    for field in ("capacity", "allocatable"):
        amounts = status.get(field) if isinstance(status, Mapping) else None
        if not isinstance(amounts, Mapping):
            continue
        for name in names:
            raw = amounts.get(name)
            if raw is None or name in found:
                continue
            try:
                present = quantity_value(raw) != 0
            except ValueError:
                present = True
            if present:
                found[name] = str(raw)[:64]
    return found


def conflict_message(node_name: str, found: Mapping[str, str], volcano_names: Collection[str] = ()) -> str:
    """What the log line and the Node's Warning Event say while a device plugin serves the node too.
    `nvidia.com/gpu` is NVIDIA's device plugin's unless `volcano_names` (the configured vGPU resource
    names, which HAMi-style names may make `nvidia.com/gpu`) lists it; every other name is Volcano's."""
    amounts = ", ".join(f"{name}={amount}" for name, amount in sorted(found.items()))
    nvidia = NVIDIA_GPU_RESOURCE in found and NVIDIA_GPU_RESOURCE not in volcano_names
    volcano = any(name != NVIDIA_GPU_RESOURCE or name in volcano_names for name in found)
    plugins = []
    if volcano:
        plugins.append(
            "a Volcano device plugin (kube-vgpu's node plugin in deviceplugin mode, or Volcano's own)"
        )
    if nvidia:
        plugins.append(
            "NVIDIA's k8s-device-plugin (the GPU Operator deploys it unless the node is labelled "
            "nvidia.com/gpu.deploy.device-plugin=false)"
        )
    return (
        f"node {node_name} serves its GPUs through kube-vgpu's DRA driver and also advertises {amounts}: "
        f"{' and '.join(plugins)} runs here too, so the same GPU can be given to a ResourceClaim and to "
        "a pod asking that resource. One node serves one of the two: take this node out of the device "
        "plugin's DaemonSet (its nodeSelector, or the GPU Operator's label), or out of the DRA node group"
    )
