"""What kube-vgpu's DRA driver publishes and the webhook charges against: one set of constants.

The node plugin writes these into each device's capacity request policy (`node/dra/slices.py`); the
webhook rounds a ResourceClaim's capacity requests the same way before charging them against a
namespace's quota, so a claim is charged what the scheduler will make it consume.
"""

from __future__ import annotations

from typing import Final

DRIVER: Final = "vgpu.kube-vgpu.io"
# The DeviceClass the chart installs for DRA node groups (named after the driver).
DEVICE_CLASS: Final = DRIVER
# The smallest memory share: a CUDA context alone takes a few hundred MiB on current GPUs, so a
# smaller share could not run a kernel; 256 MiB keeps every share usable and still lets an 80 GiB
# card be split 320 ways, past any realistic count of processes on one GPU.
MEMORY_MIN_MIB: Final = 256
# Memory is handed out in steps of 1 MiB (the request policy's validRange.step).
MEMORY_STEP_MIB: Final = 1
# `cores` is a percentage of the GPU's SMs: default 100, 1 to 100 in steps of 1.
CORES: Final = 100
CORES_MIN: Final = 1
# The capacity names a device of this driver publishes.
MEMORY_CAPACITY: Final = "memory"
CORES_CAPACITY: Final = "cores"
