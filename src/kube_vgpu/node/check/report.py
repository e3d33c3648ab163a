"""What `kube-vgpu node check` finds on a node, as plain data: versions, GPUs, HAMi-core's files, the
kubelet's socket, what the plugin would advertise and register, and the problems that keep the node
from serving its mode.

Everything here only reads: NVML query calls, `stat` and reading two small files. The figures come
from the functions the running plugin uses (`discover`, `check_inventory`, `node.publish.advertise`,
`inspect_hook_path`, `MigManager.check_node`), so the report says what the plugin would do, not a
re-derivation of it.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kube_vgpu.contract.config import Config
from kube_vgpu.contract.mig.geometry import DeviceConfig
from kube_vgpu.contract.names import HAMI_CORE, MIG
from kube_vgpu.contract.register import decode_register
from kube_vgpu.node.check import dra as dra_check
from kube_vgpu.node.check.gpus import describe_gpu, describe_versions
from kube_vgpu.node.deviceplugin.server import KUBELET_SOCKET, socket_name
from kube_vgpu.node.hookpath import INSTALLER_VALUE, inspect_hook_path
from kube_vgpu.node.mig.manager import MigManager
from kube_vgpu.node.nvml.gpus import DiscoveryError, GpuInfo, check_inventory, discover
from kube_vgpu.node.nvml.surface import Nvml
from kube_vgpu.node.publish.advertise import capacity, desired_labels, device_list, register_value


@dataclass(frozen=True)
class CheckSettings:
    """What the check is asked about: the same node, mode, folders and configuration the plugin gets."""

    node_name: str
    mode: str
    kubelet_dir: Path
    config: Config
    nvml_source: str  # where NVML's answers come from, for the reader
    geometry: DeviceConfig | None = None  # MIG mode: the scheduler's geometry to check against
    # --api dra: the DRA driver's folders (None: the device plugin's check).
    dra: dra_check.DraCheckSettings | None = None


def _gpu_problems(mode: str, facts: list[dict[str, Any]]) -> list[str]:
    problems: list[str] = []
    for gpu in facts:
        where = f"GPU {gpu['index']} ({gpu['uuid']})"
        if "error" in gpu:
            problems.append(f"{where}: NVML failed: {gpu['error']}")
            continue
        mig_mode = gpu.get("migMode")
        if mode == HAMI_CORE and isinstance(mig_mode, dict):
            if mig_mode["current"] == 1:
                problems.append(
                    f"{where} has MIG mode on: a hami-core container gets no compute on a MIG-enabled "
                    f"GPU; turn it off (nvidia-smi -i {gpu['index']} -mig 0, then reset the GPU) or "
                    "serve this node from a mig node group"
                )
            elif mig_mode["pending"] == 1:
                problems.append(
                    f"{where}: MIG mode turns on at the next GPU reset; hami-core containers would then "
                    f"get no compute (nvidia-smi -i {gpu['index']} -mig 0 cancels it)"
                )
    return problems


def _kubelet(settings: CheckSettings) -> tuple[dict[str, Any], list[str]]:
    path = settings.kubelet_dir / KUBELET_SOCKET
    own = settings.kubelet_dir / socket_name(settings.config.resource_names.count)
    out: dict[str, Any] = {"dir": str(settings.kubelet_dir), "socket": str(path)}
    problems: list[str] = []
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        out.update(present=False, isSocket=False)
        problems.append(
            f"the kubelet's device-plugin socket {path} is not there ({exc.strerror}): is the kubelet "
            "running, and is this its device-plugin folder (--kubelet-dir)?"
        )
    else:
        out.update(present=True, isSocket=stat.S_ISSOCK(mode))
        if not stat.S_ISSOCK(mode):
            problems.append(f"{path} is not a socket: the kubelet could not have made it")
    # Informative: whether a node plugin is serving here right now.
    out["pluginSocket"] = {"path": str(own), "present": own.exists()}
    return out, problems


def _advertised(
    settings: CheckSettings, gpus: list[GpuInfo], held: bool
) -> tuple[dict[str, Any], dict[str, str]]:
    split = settings.config.node.device_split_count
    unhealthy = {g.uuid for g in gpus} if held else set()
    register = register_value(gpus, unhealthy, split, settings.mode)
    devices = device_list(gpus, unhealthy, split)
    out = {
        "capacity": capacity(gpus, unhealthy, settings.config.resource_names, split_count=split),
        "deviceResource": settings.config.resource_names.count,
        "devices": len(devices),
        "healthyDevices": sum(d.health == "Healthy" for d in devices),
        "register": register,
        "registerRecords": [
            {
                "uuid": r.uuid,
                "count": r.count,
                "memoryMiB": r.memory_mib,
                "type": r.type,
                "healthy": r.healthy,
                "mode": r.mode,
            }
            for r in decode_register(register)
        ],
    }
    return out, desired_labels(gpus, settings.mode)


def check_node(nvml: Nvml, settings: CheckSettings) -> dict[str, Any]:
    """The whole report (nvmlInit must have been called); `problems` empty means the node can serve
    its mode. Changes nothing."""
    problems: list[str] = []
    report: dict[str, Any] = {
        "node": settings.node_name,
        "api": "deviceplugin" if settings.dra is None else "dra",
        "mode": settings.mode,
        "nvml": settings.nvml_source,
        **describe_versions(nvml),
    }
    geometry = settings.geometry if settings.mode == MIG else None
    count = int(nvml.nvmlDeviceGetCount())
    facts = [describe_gpu(nvml, i, geometry) for i in range(count)]
    report["gpus"] = facts
    problems.extend(_gpu_problems(settings.mode, facts))

    gpus: list[GpuInfo] | None
    try:
        gpus = discover(nvml)
        check_inventory(gpus, settings.config.node.device_split_count)
    except DiscoveryError as exc:
        problems.append(f"the plugin would refuse to start: {exc}")
        gpus = None
    if gpus == []:
        problems.append("NVML reports no GPU on this node")

    hook = inspect_hook_path(settings.config.node.hook_path)
    needed = settings.mode == HAMI_CORE
    report["hamiCore"] = {
        "folder": hook.folder,
        "needed": needed,
        "ready": hook.ready,
        "files": [f.to_json() for f in hook.files],
    }
    if needed and not hook.ready:
        problems.append(
            f"HAMi-core is not usable in {hook.folder} ({hook.problem}): install it with the chart's "
            f"{INSTALLER_VALUE}=true, or copy libvgpu.so and ld.so.preload there"
        )

    if settings.mode == MIG and gpus and geometry is not None:
        manager = MigManager(
            nvml,
            gpus,
            geometry,
            node_name=settings.node_name,
            grace_seconds=settings.config.node.mig_grace_seconds,
        )
        problems.extend(manager.check_node())

    held = needed and not hook.ready
    if settings.dra is not None:
        report["draSockets"], socket_problems = dra_check.sockets(settings.dra)
        problems.extend(socket_problems)
        if gpus is not None:
            hold = f"HAMi-core not usable in {hook.folder}: {hook.problem}" if held else None
            report["wouldPublish"] = dra_check.would_publish(nvml, gpus, hold)
            report["wouldPublish"]["pool"] = settings.node_name
        report["cdi"], cdi_problems = dra_check.cdi(settings.dra, gpus or [])
        problems.extend(cdi_problems)
    else:
        report["kubelet"], kubelet_problems = _kubelet(settings)
        problems.extend(kubelet_problems)
        if gpus is not None:
            report["wouldAdvertise"], report["labels"] = _advertised(settings, gpus, held)
    report["problems"] = problems
    report["ok"] = not problems
    return report


def one_line_reason(report: dict[str, Any]) -> str:
    """Why the node cannot serve its mode, on one line (for stderr and scripts)."""
    problems: list[str] = report["problems"]
    more = f" (and {len(problems) - 1} more problem(s), listed above)" if len(problems) > 1 else ""
    what = "DRA" if report.get("api") == "dra" else report["mode"]
    return f"node {report['node']} cannot serve {what}: {problems[0]}{more}"
