"""`node check --api dra`: the DRA driver's sockets, the ResourceSlice devices the plugin would
publish (with consumable capacity on and off), and the CDI folders (where claim specs go, and the
GPUs' own spec from the NVIDIA Container Toolkit).

Read-only like the rest of the check: `stat`, `access` and reading the spec files. The devices come
from `node.dra.slices.build_devices` over `node.dra.attributes.read_facts`, the functions the running
publisher calls, so the report says what the plugin would publish.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kube_vgpu.node.dra.attributes import read_facts
from kube_vgpu.node.dra.cdi import CdiError, GpuDevices, own_spec_prefix, read_spec_file, spec_files
from kube_vgpu.node.dra.server import dra_socket, registration_socket
from kube_vgpu.node.dra.slices import DRIVER, SliceOptions, Unhealthy, build_devices
from kube_vgpu.node.nvml.gpus import GpuInfo
from kube_vgpu.node.nvml.surface import Nvml


@dataclass(frozen=True)
class DraCheckSettings:
    """The DRA folders the plugin would use (its own flags)."""

    kubelet_root_dir: Path
    cdi_dir: Path
    gpu_cdi_dirs: tuple[Path, ...]
    gpu_cdi_kind: str


def _socket(path: Path) -> dict[str, Any]:
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return {"path": str(path), "present": False, "isSocket": False}
    return {"path": str(path), "present": True, "isSocket": stat.S_ISSOCK(mode)}


def sockets(settings: DraCheckSettings) -> tuple[dict[str, Any], list[str]]:
    """The kubelet's plugin registry and our two sockets. The sockets are there only while a plugin
    serves (informative); a registry folder that is missing means the kubelet would never find us."""
    registry = settings.kubelet_root_dir / "plugins_registry"
    out: dict[str, Any] = {
        "kubeletRootDir": str(settings.kubelet_root_dir),
        "pluginsRegistry": {"path": str(registry), "present": registry.is_dir()},
        "registration": _socket(registration_socket(settings.kubelet_root_dir)),
        "driver": _socket(dra_socket(settings.kubelet_root_dir)),
    }
    problems: list[str] = []
    if not registry.is_dir():
        problems.append(
            f"the kubelet's plugin registry {registry} is not there: is the kubelet running, and is "
            f"{settings.kubelet_root_dir} its root folder (--kubelet-root-dir)?"
        )
    for name in ("registration", "driver"):
        entry = out[name]
        if entry["present"] and not entry["isSocket"]:
            problems.append(f"{entry['path']} is not a socket: the plugin could not serve there")
    return out, problems


def _device_view(device: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": device["name"],
        "uuid": device["attributes"]["uuid"]["string"],
        "shared": bool(device.get("allowMultipleAllocations")),
        "capacity": {name: c["value"] for name, c in (device.get("capacity") or {}).items()},
        "requestPolicy": {
            name: c["requestPolicy"]
            for name, c in (device.get("capacity") or {}).items()
            if "requestPolicy" in c
        },
        "taints": [
            {"key": t["key"], "value": t.get("value", ""), "effect": t["effect"]}
            for t in device.get("taints") or []
        ],
    }


def would_publish(nvml: Nvml, gpus: list[GpuInfo], hold: str | None) -> dict[str, Any]:
    """The pool's devices as the plugin would publish them now, with consumable capacity on (Kubernetes
    1.36) and off (1.34, 1.35 by default); `hold`: why every GPU is out of service (HAMi-core missing),
    so each is tainted, or left out where the API server has no device taints."""
    facts = read_facts(nvml, gpus)
    unhealthy = {g.uuid: Unhealthy(hold, "now") for g in gpus} if hold else {}
    out: dict[str, Any] = {"driver": DRIVER, "pool": "", "held": hold or ""}
    for key, options in (
        ("consumableCapacity", SliceOptions(consumable_capacity=True, device_taints=True)),
        ("wholeGpus", SliceOptions(consumable_capacity=False, device_taints=True)),
    ):
        out[key] = [_device_view(d) for d in build_devices(facts, unhealthy, options)]
    out["withoutDeviceTaints"] = len(build_devices(facts, unhealthy, SliceOptions(True, False)))
    return out


def _writable(folder: Path) -> tuple[bool, bool]:
    """(exists, writable); a missing folder counts as writable when its nearest existing parent is,
    since the plugin creates it."""
    if folder.is_dir():
        return True, os.access(folder, os.W_OK | os.X_OK)
    parent = folder.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return False, parent.is_dir() and os.access(parent, os.W_OK | os.X_OK)


def cdi(settings: DraCheckSettings, gpus: list[GpuInfo]) -> tuple[dict[str, Any], list[str]]:
    """The claim-spec folder, and the GPUs' own spec: which files, which GPU each of ours maps to."""
    problems: list[str] = []
    exists, writable = _writable(settings.cdi_dir)
    out: dict[str, Any] = {"dir": str(settings.cdi_dir), "exists": exists, "writable": writable}
    if not writable:
        problems.append(
            f"the CDI folder {settings.cdi_dir} cannot be written: no claim could be prepared (mount it "
            "writable, or set --cdi-dir to the folder the container runtime reads)"
        )
    specs: list[dict[str, Any]] = []
    for path in spec_files(settings.gpu_cdi_dirs, skip_prefix=own_spec_prefix()):  # not our claims' specs
        try:
            spec = read_spec_file(path)
        except CdiError as exc:
            specs.append({"path": str(path), "error": str(exc)})
            continue
        if spec["kind"] == settings.gpu_cdi_kind:
            specs.append(
                {
                    "path": str(path),
                    "kind": spec["kind"],
                    "devices": sorted(d["name"] for d in spec["devices"]),
                }
            )
    lookup = GpuDevices(list(settings.gpu_cdi_dirs), settings.gpu_cdi_kind)
    named: dict[str, str | None] = {}
    for gpu in gpus:
        try:
            named[gpu.uuid] = lookup.device_id(gpu.uuid, gpu.index)
        except CdiError:
            named[gpu.uuid] = None
    out["gpuSpec"] = {
        "kind": settings.gpu_cdi_kind,
        "dirs": [str(d) for d in settings.gpu_cdi_dirs],
        "files": specs,
        "gpus": named,
    }
    missing = [uuid for uuid, device in named.items() if device is None]
    if missing:
        where = ", ".join(str(d) for d in settings.gpu_cdi_dirs)
        problems.append(
            f"no CDI device of kind {settings.gpu_cdi_kind} in {where} for GPU(s) {', '.join(missing)}: "
            "prepare would refuse claims on them; generate the spec with `nvidia-ctk cdi generate "
            "--output=/var/run/cdi/nvidia.yaml` (the GPU Operator writes it itself)"
        )
    return out, problems
