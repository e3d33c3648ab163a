"""The paths inside a vGPU container that decide its limits: where the node plugin mounts HAMi-core,
and where the NVIDIA container runtime reads a device list from.

One definition, imported by the node plugin's hami-core Allocate answer (which mounts these paths)
and by the webhook's isolation check (which refuses a pod's own volumes there), so the two cannot
drift apart. These in-container paths are fixed: `node.hookPath` names the HOST folder HAMi-core is
served from, never a path inside the container.
"""

from __future__ import annotations

from typing import Final

# The folder HAMi-core's library is mounted into, and the library itself.
HOOK_DIR_IN_CONTAINER: Final = "/usr/local/vgpu"
LIBRARY_IN_CONTAINER: Final = HOOK_DIR_IN_CONTAINER + "/libvgpu.so"
# The preload list that makes every dynamically linked process load the library.
PRELOAD_IN_CONTAINER: Final = "/etc/ld.so.preload"
# The container's shared-cache folder (CUDA_DEVICE_MEMORY_SHARED_CACHE points inside it).
CACHE_IN_CONTAINER: Final = "/tmp/vgpu"
# HAMi-core's lock folder, shared by every container of the node.
LOCK_IN_CONTAINER: Final = "/tmp/vgpulock"
# The host folder mounted at LOCK_IN_CONTAINER, unless the node plugin is told otherwise.
DEFAULT_LOCK_HOST_DIR: Final = "/tmp/vgpulock"

# Every in-container path the node plugin mounts for hami-core (the library by its folder).
PLUGIN_CONTAINER_PATHS: Final[tuple[str, ...]] = (
    HOOK_DIR_IN_CONTAINER,
    PRELOAD_IN_CONTAINER,
    CACHE_IN_CONTAINER,
    LOCK_IN_CONTAINER,
)

# The NVIDIA container runtime's `accept-nvidia-visible-devices-as-volume-mounts`: a mount of the
# host's /dev/null whose container path starts with this root hands the container the GPU it names
# (`.../all`: every GPU of the node). The runtime compares the cleaned path by string prefix, not by
# path segment, so anything that merely starts with it counts.
NVIDIA_DEVICE_LIST_ROOT: Final = "/var/run/nvidia-container-devices"
