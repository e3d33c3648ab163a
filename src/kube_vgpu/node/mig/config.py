"""The MIG geometry the scheduler uses, as the node plugin reads it, and its fit to this node's GPUs.

Volcano reads `knownMigGeometries` from ConfigMap `volcano-vgpu-device-config` (key
`device-config.yaml`) once at its start (pkg/scheduler/api/devices/config/config.go); the plugin reads the
same object, named by `NodeConfig.device_config_namespace` / `device_config_name`, once at its start too, so
both restart to pick up an edit. An absent ConfigMap or key means the built-in default, with a warning; a
document that does not parse stops the plugin, since guessing would hand out wrong instances.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from kube_vgpu.contract.config import NodeConfig
from kube_vgpu.contract.mig.geometry import (
    DeviceConfig,
    MigGeometryError,
    MigGroup,
    geometry_for_type,
    parse_device_config,
)
from kube_vgpu.contract.mig.shipped import default_device_config
from kube_vgpu.contract.models import register_type
from kube_vgpu.contract.names import DEVICE_CONFIG_KEY
from kube_vgpu.kubeapi.client import ApiError, ApiUnavailable, Kube
from kube_vgpu.node.mig.layout import LayoutError, ProfileSpec, plan_group
from kube_vgpu.node.nvml.gpus import GpuInfo

log = logging.getLogger("kube_vgpu.node.mig")


class MigConfigError(RuntimeError):
    """The geometry ConfigMap exists but cannot be used; the message names it and the problem."""


@dataclass(frozen=True)
class LoadedGeometry:
    """The device config in force and where it came from (for logs and the docs' troubleshooting)."""

    config: DeviceConfig
    source: str  # "configmap <ns>/<name>" or "built-in default"


def geometry_from_configmap(
    configmap: Mapping[str, object] | None, namespace: str, name: str
) -> LoadedGeometry:
    """The device config of a ConfigMap object (None: it does not exist). Pure."""
    where = f"configmap {namespace}/{name}"
    data = (configmap or {}).get("data") or {}
    text = data.get(DEVICE_CONFIG_KEY) if isinstance(data, Mapping) else None
    if configmap is None or text is None:
        missing = "does not exist" if configmap is None else f"has no key {DEVICE_CONFIG_KEY}"
        log.warning(
            "event=mig_geometry_default node_config=%s reason=%r: using the built-in MIG geometry; "
            "the scheduler must use the same (it falls back to no MIG geometry at all)",
            where,
            missing,
        )
        return LoadedGeometry(default_device_config(), "built-in default")
    if not isinstance(text, str):
        raise MigConfigError(f"{where} key {DEVICE_CONFIG_KEY}: expected text, got {type(text).__name__}")
    try:
        config = parse_device_config(text)
    except MigGeometryError as exc:
        raise MigConfigError(f"{where} key {DEVICE_CONFIG_KEY}: {exc}") from None
    return LoadedGeometry(config, where)


async def load_geometry(
    kube: Kube,
    node: NodeConfig,
    *,
    stop: asyncio.Event,
    retry_seconds: float = 2.0,
) -> LoadedGeometry | None:
    """Read the geometry ConfigMap, retrying while the API server is unreachable; None if `stop`
    is set first. A 403 (no RBAC to read it) raises MigConfigError: the default would silently
    disagree with the scheduler."""
    namespace, name = node.device_config_namespace, node.device_config_name
    while not stop.is_set():
        try:
            found = await asyncio.to_thread(kube.get, "configmap", name, namespace=namespace)
        except ApiUnavailable as exc:
            log.warning("event=mig_geometry_retry configmap=%s/%s error=%r", namespace, name, str(exc))
        except ApiError as exc:
            if exc.status == 403:
                raise MigConfigError(
                    f"configmap {namespace}/{name}: the plugin may not read it (403); grant get on it"
                ) from None
            log.warning("event=mig_geometry_retry configmap=%s/%s error=%r", namespace, name, str(exc))
        else:
            loaded = geometry_from_configmap(found, namespace, name)
            log.info("event=mig_geometry_loaded source=%r", loaded.source)
            return loaded
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(retry_seconds):
                await stop.wait()
    return None


def gpu_groups(config: DeviceConfig, gpu: GpuInfo) -> list[MigGroup] | None:
    """The groups the scheduler uses for this GPU: the first `knownMigGeometries` entry one of whose
    models is a substring of the TYPE the plugin registers, as Volcano matches them; None when none
    matches."""
    return geometry_for_type(config, register_type(gpu.name))


def geometry_problems(groups: list[MigGroup], profiles: Mapping[str, ProfileSpec]) -> list[str]:
    """What in a GPU's geometry cannot be honoured on it: groups that cannot be laid out, and slots
    whose configured memory exceeds the instance NVML creates (the scheduler would place requests
    that do not fit). Pure; logged at start."""
    problems: list[str] = []
    for group in groups:
        try:
            plan_group(group, profiles)
        except LayoutError as exc:
            problems.append(str(exc))
            continue
        for instance_type in group.instance_types:
            real = profiles[instance_type.name].memory_mib
            if instance_type.memory_mib > real:
                problems.append(
                    f"group {group.name!r}: {instance_type.name} is configured with "
                    f"{instance_type.memory_mib} MiB but NVML gives it {real} MiB; requests between the "
                    "two are placed by the scheduler and refused here (set memory to NVML's value)"
                )
    return problems
