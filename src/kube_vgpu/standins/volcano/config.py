"""LOCAL STAND-IN for how Volcano's deviceshare plugin loads its device ConfigMap
(pkg/scheduler/api/devices/config/config.go).

Volcano reads `volcano-vgpu-device-config` once at start-up and takes from it the resource names it
reads pod requests under and the MIG geometries. Without the ConfigMap it uses built-in defaults,
which name no percentage resource and hold no MIG geometry; a document that omits a
resource name disables that request kind. The stand-in scheduler is built from the same document,
so a cluster whose ConfigMap names other resources than kube-vgpu's config behaves here as there.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.contract.mig.geometry import (
    DeviceConfig,
    MigGeometryError,
    choose_slot,
    geometry_for_type,
    parse_device_config,
)
from kube_vgpu.contract.names import DEVICE_CONFIG_KEY, DEVICE_CONFIG_MAP
from kube_vgpu.kubeapi.client import Kube
from kube_vgpu.standins.volcano.fit import MigChooser
from kube_vgpu.standins.volcano.scheduler import VolcanoStandin

log = logging.getLogger("kube_vgpu.standins.volcano")

# What Volcano uses when the ConfigMap is absent: the default names, no percentage name, no MIG.
BUILTIN_DEVICE_CONFIG = DeviceConfig(
    resource_count_name="volcano.sh/vgpu-number",
    resource_memory_name="volcano.sh/vgpu-memory",
    resource_memory_percentage_name="",
    resource_core_name="volcano.sh/vgpu-cores",
    gpu_memory_factor=1,
    device_split_count=10,
    device_core_scaling=1.0,
    device_memory_scaling=1.0,
    known_mig_geometries=(),
)
# Volcano's default home of the ConfigMap (deviceshare.KnownGeometriesCMNamespace).
DEVICE_CONFIG_NAMESPACE = "kube-system"


def request_names(config: DeviceConfig) -> ResourceNames:
    """The resource names the scheduler reads pod requests under ("" = that kind is disabled)."""
    return ResourceNames(
        count=config.resource_count_name,
        memory=config.resource_memory_name,
        memory_percentage=config.resource_memory_percentage_name,
        cores=config.resource_core_name,
    )


def mig_chooser(config: DeviceConfig) -> MigChooser:
    """Volcano's MIG slot choice (pkg/scheduler/api/devices/nvidia/vgpu/mig.go) over the geometries of
    `config`."""

    def choose(gpu_type: str, used: Sequence[tuple[str, int]], request_mib: int) -> tuple[str, int] | None:
        groups = geometry_for_type(config, gpu_type)
        if groups is None:
            return None
        held: dict[str, set[int]] = {}
        for group, position in used:
            held.setdefault(group, set()).add(position)
        return choose_slot(groups, held, request_mib)

    return choose


def read_device_config(
    kube: Kube, *, namespace: str = DEVICE_CONFIG_NAMESPACE, name: str = DEVICE_CONFIG_MAP
) -> DeviceConfig:
    """The device config Volcano would load from the API: the ConfigMap's document, else the built-in.

    A document Volcano could not decode stops the stand-in, as the real scheduler fails to start.
    """
    configmap = kube.get("configmap", name, namespace=namespace)
    text = ((configmap or {}).get("data") or {}).get(DEVICE_CONFIG_KEY)
    if not isinstance(text, str):
        log.info("event=device_config_builtin configmap=%s/%s", namespace, name)
        return BUILTIN_DEVICE_CONFIG
    try:
        return parse_device_config(text)
    except MigGeometryError as exc:
        raise ValueError(f"configmap {namespace}/{name} key {DEVICE_CONFIG_KEY}: {exc}") from None


def volcano_from_cluster(
    kube: Kube,
    *,
    namespace: str = DEVICE_CONFIG_NAMESPACE,
    name: str = DEVICE_CONFIG_MAP,
    scheduler_name: str = "volcano",
) -> VolcanoStandin:
    """A Volcano stand-in configured as Volcano starts: from the device ConfigMap it finds."""
    config = read_device_config(kube, namespace=namespace, name=name)
    names = request_names(config)
    log.info(
        "event=device_config_loaded configmap=%s/%s names=%s mig_models=%d",
        namespace,
        name,
        ",".join(names.all()),
        len(config.known_mig_geometries),
    )
    return VolcanoStandin(kube, names, scheduler_name=scheduler_name, mig_chooser=mig_chooser(config))
