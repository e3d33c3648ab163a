"""Every name kube-vgpu shares with users, Volcano and the kubelet: annotation keys, labels, modes.

Resource names are configurable (see `contract.config.ResourceNames`); everything here is fixed.
"""

from __future__ import annotations

from typing import Final, Literal

# Modes a node runs in and a pod may ask for (SPEC §1; Volcano protocol §2.2).
HAMI_CORE: Final = "hami-core"
MIG: Final = "mig"
Mode = Literal["hami-core", "mig"]
MODES: Final[tuple[Mode, ...]] = (HAMI_CORE, MIG)

# Pod annotations users write.
VGPU_MODE: Final = "volcano.sh/vgpu-mode"
VGPU_MODE_ALIAS: Final = "nvidia.com/vgpu-mode"
USE_GPUTYPE: Final = "nvidia.com/use-gputype"
NOUSE_GPUTYPE: Final = "nvidia.com/nouse-gputype"
USE_GPUUUID: Final = "volcano.sh/vgpu-use-gpuuuid"
NOUSE_GPUUUID: Final = "volcano.sh/vgpu-nouse-gpuuuid"
USE_GPUUUID_ALIAS: Final = "nvidia.com/use-gpuuuid"
NOUSE_GPUUUID_ALIAS: Final = "nvidia.com/nouse-gpuuuid"
# alias -> the Volcano key it is copied to (Volcano reads only its own keys).
ANNOTATION_ALIASES: Final[dict[str, str]] = {
    VGPU_MODE_ALIAS: VGPU_MODE,
    USE_GPUUUID_ALIAS: USE_GPUUUID,
    NOUSE_GPUUUID_ALIAS: NOUSE_GPUUUID,
}

# Pod annotations the scheduler writes on allocation (Volcano protocol §4.1). A pod that
# arrives at admission with any of them is forging an allocation.
VGPU_NODE: Final = "volcano.sh/vgpu-node"
VGPU_TIME: Final = "volcano.sh/vgpu-time"
BIND_TIME: Final = "volcano.sh/bind-time"
BIND_PHASE: Final = "volcano.sh/bind-phase"
VGPU_IDS_NEW: Final = "volcano.sh/vgpu-ids-new"
DEVICES_TO_ALLOCATE: Final = "volcano.sh/devices-to-allocate"
SCHEDULER_OWNED_ANNOTATIONS: Final[tuple[str, ...]] = (
    DEVICES_TO_ALLOCATE,
    VGPU_IDS_NEW,
    VGPU_NODE,
    BIND_PHASE,
    VGPU_TIME,
    BIND_TIME,
)
# What the webhook charged a share-of-card pod (a container asking a percentage of a GPU's memory, or
# none, the whole card) in a namespace with a memory quota: the MiB of the GPU its share was sized
# on. Written by the mutating phase (whatever the pod's author wrote is replaced), kept unchanged by
# the validating phase on UPDATE, and read by the node plugin, which refuses a booking on a larger GPU.
CHARGED_GPU_MEMORY: Final = "kube-vgpu.io/charged-gpu-memory"
# Annotations that decided, at creation, a pod's node affinity, its GPUs and its quota charge; the
# webhook keeps them as they were created (changing one would change the charge, not the placement).
PLACEMENT_ANNOTATIONS: Final[tuple[str, ...]] = (
    VGPU_MODE,
    VGPU_MODE_ALIAS,
    USE_GPUTYPE,
    NOUSE_GPUTYPE,
    USE_GPUUUID,
    USE_GPUUUID_ALIAS,
    NOUSE_GPUUUID,
    NOUSE_GPUUUID_ALIAS,
    CHARGED_GPU_MEMORY,
)
BIND_PHASE_ALLOCATING: Final = "allocating"
BIND_PHASE_SUCCESS: Final = "success"
BIND_PHASE_FAILED: Final = "failed"
# What the node plugin writes into vgpu-time once a pod is done (max uint64).
VGPU_TIME_DONE: Final = "18446744073709551615"

# Node annotations.
NODE_REGISTER: Final = "volcano.sh/node-vgpu-register"
NODE_HANDSHAKE: Final = "volcano.sh/node-vgpu-handshake"
NODE_LOCK: Final = "hamivgpu"

# Node labels the node plugin publishes (SPEC §1).
MODE_LABEL: Final = "kube-vgpu.io/vgpu-mode"
MODEL_LABEL_PREFIX: Final = "gpu-model.kube-vgpu.io/"
UUID_LABEL_PREFIX: Final = "gpu-uuid.kube-vgpu.io/"
HOSTNAME_LABEL: Final = "kubernetes.io/hostname"

# Opt-out label on a namespace (SPEC §1); on a pod it exempts nothing, a pod's labels being its author's.
OPT_OUT_LABEL: Final = "kube-vgpu.io/webhook"
OPT_OUT_VALUE: Final = "ignore"

# Namespace quota labels (SPEC §1).
QUOTA_NUMBER_LABEL: Final = "quota.kube-vgpu.io/vgpu-number"
QUOTA_MEMORY_LABEL: Final = "quota.kube-vgpu.io/vgpu-memory"
QUOTA_CORES_LABEL: Final = "quota.kube-vgpu.io/vgpu-cores"

# Volcano's geometry ConfigMap (protocol §6.1).
DEVICE_CONFIG_MAP: Final = "volcano-vgpu-device-config"
DEVICE_CONFIG_KEY: Final = "device-config.yaml"

# The literal request type Volcano writes in every device record (protocol §4.2).
DEVICE_RECORD_TYPE: Final = "NVIDIA"
