"""Bringing up dynamic MIG inside the node plugin (`--mode mig`): geometry, checks, adoption, reconcile.

`node.plugin` calls `start_mig` after GPU discovery and before the Allocator exists, then runs
`MigManager.run(...)` beside its other loops with `reconcile_interval`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from kube_vgpu.contract.config import NodeConfig
from kube_vgpu.kubeapi.client import ApiError, ApiUnavailable
from kube_vgpu.node.api import NodeApi
from kube_vgpu.node.mig.config import load_geometry
from kube_vgpu.node.mig.manager import MigManager
from kube_vgpu.node.nvml.gpus import GpuInfo
from kube_vgpu.node.nvml.surface import Nvml

log = logging.getLogger("kube_vgpu.node.mig")


def reconcile_interval(node: NodeConfig) -> float:
    """How often idle layouts are looked for: a quarter of the grace period, between 0.1 and 30 s."""
    return max(0.1, min(30.0, node.mig_grace_seconds / 4))


async def start_mig(
    nvml: Nvml, gpus: Sequence[GpuInfo], api: NodeApi, node: NodeConfig, *, stop: asyncio.Event
) -> MigManager | None:
    """The node's MigManager, with the scheduler's geometry loaded, the node checked (problems are
    logged) and existing instances adopted; None when `stop` is set while the API is unreachable.
    Raises MigConfigError when the geometry ConfigMap exists but cannot be used."""
    loaded = await load_geometry(api.kube, node, stop=stop)
    if loaded is None:
        return None
    mig = MigManager(nvml, gpus, loaded.config, node_name=api.node_name, grace_seconds=node.mig_grace_seconds)
    await asyncio.to_thread(mig.check_node)
    try:
        pods = await api.pods_on_node(node.allocate_timeout_seconds)
    except (ApiError, ApiUnavailable) as exc:
        # Adoption only logs: Allocates and reconciles read the pods again themselves.
        log.warning("event=mig_adopt_without_pods node=%s error=%r", api.node_name, str(exc))
        pods = []
    await asyncio.to_thread(mig.adopt, pods)
    return mig
