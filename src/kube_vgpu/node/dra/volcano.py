"""One node serves kube-vgpu's GPUs through one API: a DRA node must not also run a Volcano device
plugin (kube-vgpu's own in `deviceplugin` mode, or Volcano's), or the same GPU is handed out twice,
once by the default scheduler's claims and once by Volcano's bookings.

A device plugin shows in the Node's `status.capacity` and `status.allocatable` under the resource
names it registers. When its plugin goes, the kubelet keeps the name with a capacity of 0
(pkg/kubelet/cm/devicemanager: a resource whose endpoint is gone is reported with no devices), so
only a non-zero amount counts. Pure: the Node object in, the finding out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from kube_vgpu.node.dra.limits import quantity_value

# The Warning Event's reason on the Node while both serve it.
DEVICE_PLUGIN_ON_DRA_NODE: Final = "VolcanoDevicePluginOnDRANode"


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


def conflict_message(node_name: str, found: Mapping[str, str]) -> str:
    """What the log line and the Node's Warning Event say while a device plugin serves the node too."""
    amounts = ", ".join(f"{name}={amount}" for name, amount in sorted(found.items()))
    return (
        f"node {node_name} serves its GPUs through kube-vgpu's DRA driver and also advertises {amounts}: "
        "a Volcano device plugin (kube-vgpu's node plugin in deviceplugin mode, or Volcano's own) runs "
        "here too, so the same GPU can be given to a ResourceClaim and to a Volcano pod. One node "
        "serves one of the two: take this node out of the device plugin's DaemonSet (its "
        "nodeSelector), or out of the DRA node group"
    )
