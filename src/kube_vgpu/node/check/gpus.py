"""The GPUs as NVML describes them, as plain data: versions, identity, memory, MIG mode, the MIG
profiles NVML offers, the MIG devices that exist and, given a geometry, where the plugin would place
each slot. Read-only: only NVML's query calls, never a create, destroy or mode change.
"""

from __future__ import annotations

from typing import Any

from kube_vgpu.contract.mig.geometry import DeviceConfig, geometry_for_type
from kube_vgpu.contract.models import register_type
from kube_vgpu.node.mig.layout import LayoutError, ProfileSpec, plan_group
from kube_vgpu.node.mig.nvml import gpu_handle, mig_device_handles, mig_mode, read_instances, read_profiles
from kube_vgpu.node.nvml.gpus import MIB, nvml_text
from kube_vgpu.node.nvml.surface import Nvml


def describe_versions(nvml: Nvml) -> dict[str, str]:
    """The driver's, NVML's and CUDA's versions (`unknown: <error>` for one NVML cannot give)."""
    out: dict[str, str] = {}
    for key, call in (
        ("driverVersion", nvml.nvmlSystemGetDriverVersion),
        ("nvmlVersion", nvml.nvmlSystemGetNVMLVersion),
        ("cudaDriverVersion", nvml.nvmlSystemGetCudaDriverVersion),
    ):
        try:
            value = call()
        except nvml.NVMLError as exc:
            out[key] = f"unknown: {exc}"
            continue
        if key == "cudaDriverVersion":
            # NVML gives 1000 * major + 10 * minor (12040 is CUDA 12.4).
            number = int(value)
            out[key] = f"{number // 1000}.{number % 1000 // 10}"
        else:
            out[key] = nvml_text(value)
    return out


def describe_geometry(config: DeviceConfig, name: str, profiles: dict[str, ProfileSpec]) -> Any:
    """Where each position of each group the scheduler may choose would be placed on this GPU
    (the plugin's plan), or why a group cannot be laid out."""
    groups = geometry_for_type(config, register_type(name))
    if groups is None:
        return "no knownMigGeometries entry matches this model"
    out: dict[str, Any] = {}
    for group in groups:
        try:
            plan = plan_group(group, profiles)
        except LayoutError as exc:
            out[group.name] = {"error": str(exc)}
            continue
        out[group.name] = [[p.position, p.type_name, p.start, p.size, p.memory_mib] for p in plan.instances]
    return out


def describe_gpu(nvml: Nvml, index: int, config: DeviceConfig | None = None) -> dict[str, Any]:
    """One GPU's facts as plain data; an NVML failure is reported in `error`, not raised.
    With `config`, also the plan of every group of its geometry (`describe_geometry`)."""
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    uuid = nvml_text(nvml.nvmlDeviceGetUUID(handle))
    out: dict[str, Any] = {"index": index, "uuid": uuid, "name": nvml_text(nvml.nvmlDeviceGetName(handle))}
    try:
        out["memoryMiB"] = int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // MIB
        mode = mig_mode(nvml, gpu_handle(nvml, uuid))
        out["migMode"] = (
            {"current": mode.current, "pending": mode.pending} if mode.supported else "not supported"
        )
        if not mode.supported:
            return out
        profiles = read_profiles(nvml, handle)
        out["profiles"] = [
            {
                "name": p.name,
                "id": p.profile_id,
                "sliceCount": p.slice_count,
                "memoryMiB": p.memory_mib,
                "instanceCount": p.instance_count,
                "placements": [[s, p.placement_size] for s in p.starts],
            }
            for p in sorted(profiles.values(), key=lambda p: (p.slice_count, p.memory_mib, p.name))
        ]
        if config is not None:
            out["plans"] = describe_geometry(config, out["name"], profiles)
        by_id = {p.profile_id: p.name for p in profiles.values()}
        if mode.current == 1:
            out["instances"] = [
                {
                    "gpuInstanceId": o.gi_id,
                    "profile": by_id.get(o.profile_id, str(o.profile_id)),
                    "placement": [o.start, o.size],
                    "computeInstances": [
                        {"id": c.ci_id, "migUuid": c.mig_uuid, "memoryMiB": c.memory_mib, "full": c.full}
                        for c in o.compute
                    ],
                }
                for o in read_instances(nvml, handle, list(profiles.values()))
            ]
            out["migDeviceOrder"] = _mig_device_order(nvml, handle)
    except nvml.NVMLError as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    return out


def _mig_device_order(nvml: Nvml, handle: Any) -> list[Any]:
    # What `nvmlDeviceGetMigDeviceHandleByIndex` lists at each index: the reference plugin's
    # "index = position" assumption can be checked against it on real hardware.
    return [
        None
        if mig is None
        else [int(nvml.nvmlDeviceGetGpuInstanceId(mig)), int(nvml.nvmlDeviceGetComputeInstanceId(mig))]
        for mig in mig_device_handles(nvml, handle)
    ]


def describe_mig(nvml: Nvml, config: DeviceConfig | None = None) -> dict[str, Any]:
    """Every GPU's facts (nvmlInit must have been called); with `config`, the group plans too."""
    return {
        "driverVersion": nvml_text(nvml.nvmlSystemGetDriverVersion()),
        "gpus": [describe_gpu(nvml, i, config) for i in range(int(nvml.nvmlDeviceGetCount()))],
    }
