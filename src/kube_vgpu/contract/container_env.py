"""The environment variables a vGPU pod may not set itself, each with why: the one list the webhook's
isolation check refuses from.

Two readers make a variable dangerous. HAMi-core reads its limits from variables the node plugin
hands the container at Allocate; a container setting them replaces or disables the limits. The
NVIDIA container runtime (github.com/NVIDIA/nvidia-container-toolkit) reads variables of the
container's process to decide which host devices to inject; a container setting them is handed
devices no vGPU booking covers. The runtime looks each name up exactly (a Go map keyed by the
text before the first `=`, `internal/config/image/builder.go` `WithEnv`; `CUDA.Getenv`), so only
the exact, case-sensitive names count: `NVIDIA_IMEX_CHANNELSX` or `nvidia_gds` read as nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class Reserved:
    """Why a variable is refused (after `env NAME`), and what to do instead (after `remove it from env`)."""

    why: str
    instead: str


_HAMI_CORE: Final = Reserved(
    "is set by the node plugin for vGPU containers (it carries the GPU memory and core limits)",
    "the limits come from the container's vgpu resources",
)
_RUNTIME_INSTEAD: Final = (
    "a vGPU pod gets its GPUs from its vgpu resources, never from the runtime's variables"
)
# Written out per entry, not built by a function: the table is made once at import.
_HANDS: Final = "makes the NVIDIA container runtime hand the container "


# Name -> why. HAMi-core's own variables first, then the NVIDIA runtime's.
RESERVED_ENV: Final[dict[str, Reserved]] = {
    "CUDA_DEVICE_SM_LIMIT": _HAMI_CORE,
    "CUDA_DEVICE_MEMORY_SHARED_CACHE": _HAMI_CORE,
    "CUDA_DISABLE_CONTROL": _HAMI_CORE,
    "CUDA_OVERSUBSCRIBE": _HAMI_CORE,
    "GPU_CORE_UTILIZATION_POLICY": _HAMI_CORE,
    # The dynamic loader's own injection points: LD_PRELOAD loads a library before HAMi-core's
    # preload list is read, LD_AUDIT loads an auditing library that sees (and can redirect) every
    # symbol binding, HAMi-core's CUDA hooks included.
    "LD_PRELOAD": Reserved(
        "loads a library into every process ahead of HAMi-core, which enforces the vGPU limits",
        "bake libraries into the image instead",
    ),
    "LD_AUDIT": Reserved(
        "loads an auditing library that can redirect every symbol binding, HAMi-core's limits included",
        "bake libraries into the image instead",
    ),
    # internal/config/image/envvars.go: the device list (`all` is every GPU of the node) ...
    "NVIDIA_VISIBLE_DEVICES": Reserved(
        _HANDS + "the GPUs it names (`all`: every GPU of the node)", _RUNTIME_INSTEAD
    ),
    # ... the driver libraries and device nodes injected with them (`all` adds display, video and
    # compat libraries the node plugin does not grant) ...
    "NVIDIA_DRIVER_CAPABILITIES": Reserved(_HANDS + "the driver capabilities it names", _RUNTIME_INSTEAD),
    # ... MIG management: `/dev/nvidia-caps` config and monitor capabilities of the GPUs it names
    # (cmd/nvidia-container-runtime-hook/container_config.go, getMigConfigDevices) ...
    "NVIDIA_MIG_CONFIG_DEVICES": Reserved(
        _HANDS + "MIG configuration rights over the GPUs it names", _RUNTIME_INSTEAD
    ),
    "NVIDIA_MIG_MONITOR_DEVICES": Reserved(
        _HANDS + "MIG monitoring rights over the GPUs it names", _RUNTIME_INSTEAD
    ),
    # ... IMEX channels (`/dev/nvidia-caps-imex-channels/channel<N>`): the boundary of who may share
    # GPU memory across an NVLink domain (CUDA.ImexChannelRequests) ...
    "NVIDIA_IMEX_CHANNELS": Reserved(
        _HANDS + "the IMEX channels it names, which share GPU memory across nodes", _RUNTIME_INSTEAD
    ),
    # ... and the feature-gated device sets, each injected when the variable is `enabled`
    # (internal/modifier/cdi.go gatedDevices, internal/modifier/gated.go): to any container that is
    # handed GPUs at all, which every vGPU container is.
    "NVIDIA_GDS": Reserved(_HANDS + "GPUDirect Storage devices (`/dev/nvidia-fs*`)", _RUNTIME_INSTEAD),
    "NVIDIA_MOFED": Reserved(_HANDS + "Mellanox OFED devices (`/dev/infiniband`)", _RUNTIME_INSTEAD),
    "NVIDIA_NVSWITCH": Reserved(
        _HANDS + "the node's NVSwitch devices (`/dev/nvidia-nvswitch*`)", _RUNTIME_INSTEAD
    ),
    "NVIDIA_GDRCOPY": Reserved(
        _HANDS + "the GDRCopy device (`/dev/gdrdrv`), a direct map of GPU memory", _RUNTIME_INSTEAD
    ),
    # Older releases (internal/config/features.go before 1.17) read this to add the device nodes'
    # groups to the container's process.
    "NVIDIA_ALLOW_ADDITIONAL_GIDS": Reserved(
        _HANDS + "the groups that own the injected device nodes", _RUNTIME_INSTEAD
    ),
}
# Every name starting with one of these: `CUDA_DEVICE_MEMORY_LIMIT` and each per-device
# `CUDA_DEVICE_MEMORY_LIMIT_<i>`; the SM limit likewise, in case a HAMi-core build reads a
# per-device form.
RESERVED_ENV_PREFIXES: Final[dict[str, Reserved]] = {
    "CUDA_DEVICE_MEMORY_LIMIT": _HAMI_CORE,
    "CUDA_DEVICE_SM_LIMIT": _HAMI_CORE,
}
# Read by the runtime and left to the pod, with why:
# - NVIDIA_REQUIRE_* and NVIDIA_DISABLE_REQUIRE: driver and CUDA version requirements; they can
#   only make the runtime refuse to start the container, never grant anything.
# - NVIDIA_REQUIRE_JETPACK (`csv-mounts=all`): mounts Jetson (Tegra) driver files on Tegra nodes,
#   whose integrated GPU kube-vgpu does not share.
# - The runtime's `swarm-resource` setting names extra device-list variables (Docker Swarm); it is
#   empty unless the node's runtime configuration sets it, and Kubernetes nodes do not.


def reserved(name: str) -> Reserved | None:
    """Why `name` may not be set by a vGPU pod, or None when it may."""
    found = RESERVED_ENV.get(name)
    if found is not None:
        return found
    return next((r for prefix, r in RESERVED_ENV_PREFIXES.items() if name.startswith(prefix)), None)


def reachable_by_prefix(prefix: str) -> str | None:
    """A reserved name an `envFrom` with this `prefix` could produce, or None.

    The kubelet names each variable `prefix + key`, and a key is never empty, so the prefix reaches
    a reserved name it is a strict beginning of, and every name under a reserved prefix. An empty
    prefix reaches every name; whether it does depends on the ConfigMap or Secret, not the pod, so
    it is not decided here.
    """
    if not prefix:
        return None
    for name in RESERVED_ENV:
        if name.startswith(prefix) and name != prefix:
            return name
    for start in RESERVED_ENV_PREFIXES:
        if prefix.startswith(start) or start.startswith(prefix):
            return start + "*"
    return None
