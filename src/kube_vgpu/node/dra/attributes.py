"""What a published GPU device says about itself: the facts read once from NVML, and the device
attributes users select on in CEL, named and typed as the ResourceSlice API allows.

Attribute names follow NVIDIA's own DRA driver where it has one (kubernetes-sigs/dra-driver-nvidia-gpu,
`cmd/gpu-kubelet-plugin/deviceinfo.go`: `type`, `uuid`, `productName`, `architecture`,
`cudaComputeCapability`, `driverVersion`, `cudaDriverVersion`), so a selector written for one reads the
same on the other. Versions are `version` attributes only where they are semver (validation.go refuses
anything else), so CEL can compare them with `isGreaterThan(semver("12.4.0"))`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from kube_vgpu.contract.models import model_segments
from kube_vgpu.node.nvml.gpus import GpuInfo, nvml_text
from kube_vgpu.node.nvml.surface import Nvml

# k8s.io/api/resource/v1/types.go: DeviceAttributeMaxValueLength.
ATTRIBUTE_VALUE_MAX = 64

# nvml.h `nvmlDeviceArchitecture_t`, as NVIDIA's driver names them (lower case).
_ARCHITECTURES = {
    2: "kepler",
    3: "maxwell",
    4: "pascal",
    5: "volta",
    6: "turing",
    7: "ampere",
    8: "ada-lovelace",
    9: "hopper",
    10: "blackwell",
}
# Where NVML does not answer (older drivers, the simulator): the architecture and compute capability
# of a model, by the first segment of its name that names one. NVIDIA's published compute capabilities.
_KNOWN_MODELS: dict[str, tuple[str, tuple[int, int]]] = {
    "v100": ("volta", (7, 0)),
    "t4": ("turing", (7, 5)),
    "a100": ("ampere", (8, 0)),
    "a30": ("ampere", (8, 0)),
    "a10": ("ampere", (8, 6)),
    "a40": ("ampere", (8, 6)),
    "a16": ("ampere", (8, 6)),
    "l4": ("ada-lovelace", (8, 9)),
    "l40": ("ada-lovelace", (8, 9)),
    "l40s": ("ada-lovelace", (8, 9)),
    "h100": ("hopper", (9, 0)),
    "h200": ("hopper", (9, 0)),
    "h20": ("hopper", (9, 0)),
    "gh200": ("hopper", (9, 0)),
    "b200": ("blackwell", (10, 0)),
    "gb200": ("blackwell", (10, 0)),
}
_NUMERIC = re.compile(r"^\d+(\.\d+)*$")


class AttributeValue(TypedDict, total=False):
    """`resource.k8s.io/v1` DeviceAttribute: exactly one of the four."""

    bool: bool
    int: int
    string: str
    version: str


@dataclass(frozen=True)
class GpuFacts:
    """One GPU as a DRA device describes it; everything but health is fixed at start."""

    index: int
    minor: int
    uuid: str
    product_name: str
    memory_mib: int
    driver_version: str = ""
    cuda_driver_version: int | None = None  # NVML's encoding: 12040 is CUDA 12.4
    compute_capability: tuple[int, int] | None = None
    architecture: str = ""
    mig_capable: bool = False

    @property
    def device_name(self) -> str:
        """The device's name in the slice, `gpu-<minor>` as NVIDIA's driver names it (a DNS label; the
        minor number is stable across reboots where the index is not, dra-driver-nvidia-gpu #563)."""
        return f"gpu-{self.minor}"


def model_name(product_name: str) -> str:
    """The model users write, normalised as the webhook's type selectors read a model: lower-case
    segments joined by `-`, without the leading `nvidia` (`NVIDIA A100-SXM4-80GB` -> `a100-sxm4-80gb`).
    CEL selects a model by whole segments with `.matches("(^|-)a100(-|$)")`."""
    segments = model_segments(product_name)
    if segments and segments[0] == "nvidia" and len(segments) > 1:
        segments = segments[1:]
    return "-".join(segments)[:ATTRIBUTE_VALUE_MAX]


def semver(text: str) -> str | None:
    """`text` as a semver string (`550.54` -> `550.54.0`, as Masterminds/semver reads it for NVIDIA's
    driver), or None when it is not a dotted number."""
    text = text.strip()
    if not _NUMERIC.match(text):
        return None
    parts = [str(int(p)) for p in text.split(".")]
    if len(parts) > 3:
        return None
    return ".".join([*parts, "0", "0"][:3])


def cuda_version(encoded: int) -> str:
    """NVML's CUDA driver version (`1000 * major + 10 * minor`) as semver: 12040 -> `12.4.0`."""
    return f"{encoded // 1000}.{(encoded % 1000) // 10}.0"


def device_attributes(facts: GpuFacts) -> dict[str, AttributeValue]:
    """The attributes of one GPU device (names in the driver's own domain, so CEL reads them as
    `device.attributes["vgpu.kube-vgpu.io"].productName`)."""
    attributes: dict[str, AttributeValue] = {
        "type": {"string": "gpu"},
        "uuid": {"string": facts.uuid[:ATTRIBUTE_VALUE_MAX]},
        "index": {"int": facts.index},
        "minor": {"int": facts.minor},
        "productName": {"string": facts.product_name[:ATTRIBUTE_VALUE_MAX]},
        "model": {"string": model_name(facts.product_name)},
        # Attributes and capacities share no names; the consumable memory is the `memory` capacity.
        "memoryMiB": {"int": facts.memory_mib},
        "migCapable": {"bool": facts.mig_capable},
    }
    if driver := semver(facts.driver_version):
        attributes["driverVersion"] = {"version": driver}
    if facts.cuda_driver_version:
        attributes["cudaDriverVersion"] = {"version": cuda_version(facts.cuda_driver_version)}
    if facts.compute_capability is not None:
        major, minor = facts.compute_capability
        attributes["cudaComputeCapability"] = {"version": f"{major}.{minor}.0"}
    if facts.architecture:
        attributes["architecture"] = {"string": facts.architecture}
    return attributes


# -- reading NVML ------------------------------------------------------------------------------------


def read_facts(nvml: Nvml, gpus: Sequence[GpuInfo]) -> list[GpuFacts]:
    """The facts of each discovered GPU, read through a `pynvml`-shaped module after `nvmlInit()`.

    Only identity (from discovery) is required; a call the driver does not answer leaves its
    attribute out, except that architecture and compute capability fall back to the model's
    published values."""
    driver = _optional(nvml, "nvmlSystemGetDriverVersion")
    cuda = _optional(nvml, "nvmlSystemGetCudaDriverVersion")
    facts: list[GpuFacts] = []
    for gpu in gpus:
        handle = nvml.nvmlDeviceGetHandleByIndex(gpu.index)
        capability = _optional(nvml, "nvmlDeviceGetCudaComputeCapability", handle)
        architecture = _optional(nvml, "nvmlDeviceGetArchitecture", handle)
        known = _known_model(gpu.name)
        facts.append(
            GpuFacts(
                index=gpu.index,
                minor=gpu.minor,
                uuid=gpu.uuid,
                product_name=gpu.name,
                memory_mib=gpu.memory_mib,
                driver_version=nvml_text(driver) if driver is not None else "",
                cuda_driver_version=int(cuda) if isinstance(cuda, int) else None,
                compute_capability=(
                    (int(capability[0]), int(capability[1]))
                    if isinstance(capability, tuple | list) and len(capability) == 2
                    else (known[1] if known else None)
                ),
                architecture=_ARCHITECTURES.get(architecture, "")
                if isinstance(architecture, int)
                else (known[0] if known else ""),
                mig_capable=_optional(nvml, "nvmlDeviceGetMigMode", handle) is not None,
            )
        )
    return facts


def _known_model(product_name: str) -> tuple[str, tuple[int, int]] | None:
    # The first segment naming a known model: `Tesla V100-SXM2-32GB` is a V100.
    for segment in model_segments(product_name):
        if segment in _KNOWN_MODELS:
            return _KNOWN_MODELS[segment]
    return None


def _optional(nvml: Nvml, call: str, *args: Any) -> Any:
    """`nvml.<call>(*args)`, or None when the library lacks the call or the GPU does not support it
    (NVMLError_NotSupported is how NVML says a GPU is not MIG-capable)."""
    function = getattr(nvml, call, None)
    if function is None:
        return None
    try:
        return function(*args)
    except nvml.NVMLError:
        return None
