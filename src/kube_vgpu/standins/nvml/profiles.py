"""The GPUs the NVML simulator knows: NVML names, memory, PCI IDs and their real MIG profile tables.

Sources (read, not copied):
- Profile IDs, names and instance counts: NVIDIA MIG User Guide, "Supported MIG Profiles" and the
  `nvidia-smi mig -lgip` listings in "Getting Started with MIG" (A100-SXM4-40GB), and
  `nvidia-smi mig -lgip` output captured on A100-SXM4-80GB and H100 80GB HBM3 / H100 PCIe machines
  and quoted in public repositories (e.g. notes in a GPU-infrastructure guide listing
  `MIG 7g.80gb 0 1/1 79.00` for the A100 80GB and `79.25` for the H100).
- Memory: NVML `memorySizeMB` is what `nvidia-smi mig -lgip` prints divided by 1024, e.g.
  4.75 GiB = 4864 MiB for A100-40GB 1g.5gb. The A100-40GB values match NVIDIA/go-nvml's mock
  tables (pkg/nvml/mock/shared/gpus/a100.go). H200: `-lgip` output quoted in public test fixtures
  gives 1g.18gb 16.00, 2g.35gb 32.50 and 7g.141gb 140.00 GiB; the 4-slice size (65.00 GiB) is
  the 69.8 GB (10^9 bytes) CUDA reports for a 3g.71gb instance in published benchmark logs.
- Placements (start, size) are in memory slices, 8 per GPU: `nvidia-smi mig -lgipp` in the MIG
  User Guide lists {0..6}:1 for 1g, {0,2,4,6}:2 for 1g.10gb (A100-40GB), {0,2,4}:2 for 2g, {0,4}:4
  for 3g, {0}:4 for 4g and {0}:8 for 7g; Hopper uses the same layout.
- PCI device IDs: the device filters of NVIDIA mig-parted's example configuration.
"""

from __future__ import annotations

from dataclasses import dataclass

import pynvml

# A GPU has 7 compute slices and 8 memory slices on every model here.
COMPUTE_SLICES = 7


@dataclass(frozen=True)
class MigProfile:
    """One GPU instance profile as `nvmlDeviceGetGpuInstanceProfileInfo` describes it."""

    profile: int  # the NVML_GPU_INSTANCE_PROFILE_* index the info call takes
    id: int  # the profile ID NVML reports and the create calls take
    name: str  # e.g. "1g.5gb", "1g.5gb+me"
    slice_count: int  # compute slices
    placement_size: int  # memory slices one instance occupies
    starts: tuple[int, ...]  # possible placement starts, in memory slices
    instance_count: int
    memory_size_mb: int
    multiprocessor_count: int
    copy_engine_count: int
    decoder_count: int
    jpeg_count: int
    ofa_count: int


@dataclass(frozen=True)
class GpuModel:
    """A GPU model: its NVML name, total memory, PCI device ID and (when MIG-capable) profiles."""

    name: str
    memory_mib: int
    pci_device_id: int
    multiprocessor_count: int
    mig_profiles: tuple[MigProfile, ...] = ()

    def profile_by_index(self, profile: int) -> MigProfile | None:
        """The profile for an NVML_GPU_INSTANCE_PROFILE_* index, if the model has it."""
        return next((p for p in self.mig_profiles if p.profile == profile), None)

    def profile_by_id(self, profile_id: int) -> MigProfile | None:
        """The profile with this profile ID, if the model has it."""
        return next((p for p in self.mig_profiles if p.id == profile_id), None)

    def profile_by_name(self, name: str) -> MigProfile | None:
        """The profile called `name` (e.g. "3g.40gb"), if the model has it."""
        return next((p for p in self.mig_profiles if p.name == name), None)


@dataclass(frozen=True)
class _Family:
    """What differs between models: profile names, per-size memory and SM counts, engines."""

    names: tuple[str, str, str, str, str, str]  # 1g, 1g on two memory slices, 2g, 3g, 4g, 7g
    memory: tuple[int, int, int, int]  # MiB for 1, 2, 4 and 8 memory slices
    sms: tuple[int, int, int, int, int]  # SMs of 1g, 2g, 3g, 4g, 7g
    decoders: tuple[int, int, int, int, int, int]  # 1g, 1g+me, 2g, 3g, 4g, 7g
    hopper: bool  # Hopper gives every 1g a JPEG engine; Ampere only the +me one


def _profiles(f: _Family) -> tuple[MigProfile, ...]:
    one, one_wide, two, three, four, seven = f.names
    m1, m2, m4, m8 = f.memory
    s1, s2, s3, s4, s7 = f.sms
    d1, dme, d2, d3, d4, d7 = f.decoders
    jpeg = (lambda n: n) if f.hopper else (lambda n: 0)
    ce7 = 8 if f.hopper else 7  # `-lgip` lists 8 copy engines for Hopper's 7g
    # (index, id, name, compute slices, memory slices, starts, instances, MiB, SMs, CE, DEC, JPEG, OFA)
    rows = [
        (pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 19, one, 1, 1, range(7), 7, m1, s1, 1, d1, jpeg(1), 0),
        (
            pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1,
            20,
            one + "+me",
            1,
            1,
            range(7),
            1,
            m1,
            s1,
            1,
            dme,
            1,
            1,
        ),
        (
            pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2,
            15,
            one_wide,
            1,
            2,
            (0, 2, 4, 6),
            4,
            m2,
            s1,
            1,
            1,
            jpeg(1),
            0,
        ),
        (pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE, 14, two, 2, 2, (0, 2, 4), 3, m2, s2, 2, d2, jpeg(2), 0),
        (pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9, three, 3, 4, (0, 4), 2, m4, s3, 3, d3, jpeg(3), 0),
        (pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE, 5, four, 4, 4, (0,), 1, m4, s4, 4, d4, jpeg(4), 0),
        (pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0, seven, 7, 8, (0,), 1, m8, s7, ce7, d7, jpeg(7) or 1, 1),
    ]
    return tuple(
        MigProfile(
            profile=index,
            id=pid,
            name=name,
            slice_count=slices,
            placement_size=size,
            starts=tuple(starts),
            instance_count=count,
            memory_size_mb=mib,
            multiprocessor_count=sms,
            copy_engine_count=ce,
            decoder_count=dec,
            jpeg_count=jp,
            ofa_count=ofa,
        )
        for index, pid, name, slices, size, starts, count, mib, sms, ce, dec, jp, ofa in rows
    )


_A100_40GB = _Family(
    names=("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
    memory=(4864, 9856, 19968, 40192),
    sms=(14, 28, 42, 56, 98),
    decoders=(0, 1, 1, 2, 2, 5),
    hopper=False,
)
_A100_80GB = _Family(
    names=("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    memory=(9728, 19968, 40192, 80896),
    sms=(14, 28, 42, 56, 98),
    decoders=(0, 1, 1, 2, 2, 5),
    hopper=False,
)
_H100_80GB = _Family(
    names=("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    memory=(9984, 20096, 40448, 81152),
    sms=(16, 32, 60, 64, 132),
    decoders=(1, 1, 2, 3, 4, 7),
    hopper=True,
)
_H100_PCIE = _Family(
    names=_H100_80GB.names,
    memory=_H100_80GB.memory,
    sms=(14, 30, 46, 62, 114),
    decoders=_H100_80GB.decoders,
    hopper=True,
)
_H200 = _Family(
    names=("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
    memory=(16384, 33280, 66560, 143360),
    sms=(16, 32, 60, 64, 132),
    decoders=(1, 1, 2, 3, 4, 7),
    hopper=True,
)

# Keyed by NVML name; `memory_mib` is the total NVML reports for the whole card.
MODELS: dict[str, GpuModel] = {
    m.name: m
    for m in (
        GpuModel("NVIDIA A100-SXM4-40GB", 40960, 0x20B010DE, 108, _profiles(_A100_40GB)),
        GpuModel("NVIDIA A100-PCIE-40GB", 40960, 0x20F110DE, 108, _profiles(_A100_40GB)),
        GpuModel("NVIDIA A100-SXM4-80GB", 81920, 0x20B210DE, 108, _profiles(_A100_80GB)),
        GpuModel("NVIDIA A100 80GB PCIe", 81920, 0x20B510DE, 108, _profiles(_A100_80GB)),
        GpuModel("NVIDIA H100 80GB HBM3", 81559, 0x233010DE, 132, _profiles(_H100_80GB)),
        GpuModel("NVIDIA H100 PCIe", 81559, 0x233110DE, 114, _profiles(_H100_PCIE)),
        GpuModel("NVIDIA H200", 143771, 0x233510DE, 132, _profiles(_H200)),
        GpuModel("NVIDIA H200 NVL", 143771, 0x233B10DE, 132, _profiles(_H200)),
    )
}


def gpu_instance_id(start: int, placement_size: int) -> int:
    """The GPU instance ID NVML gives an instance at this placement.

    NVML numbers GPU instances by the memory slices they cover, as a binary tree over the 8
    slices: 0 for all of them, 1-2 for the halves, 3-6 for the quarters, 7-14 for single slices
    (observed: 1g.5gb at 6:1 is 13, 2g.10gb at 4:2 is 5, 4g.20gb at 0:4 is 1, 3g.40gb at 4:4 is 2).
    Two live instances never share an ID, since they never share a memory slice.
    """
    first_id = {8: 0, 4: 1, 2: 3, 1: 7}[placement_size]
    return first_id + start // placement_size


# Compute-instance shapes a GPU instance of n compute slices offers (as `nvidia-smi mig -lcip`
# lists them); the full-size one is the default `-cci` profile.
_CI_SIZES: dict[int, tuple[int, ...]] = {1: (1,), 2: (1, 2), 3: (1, 2, 3), 4: (1, 2, 4), 7: (1, 2, 3, 4, 7)}
# Compute instance profile index == profile ID for these shapes (NVML_COMPUTE_INSTANCE_PROFILE_*).
_CI_PROFILE_FOR_SIZE: dict[int, int] = {
    1: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
    2: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
    3: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
    4: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
    7: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
}


@dataclass(frozen=True)
class ComputeProfile:
    """A compute instance profile inside a GPU instance profile."""

    id: int
    slice_count: int
    starts: tuple[int, ...]  # in compute slices of the GPU instance

    @property
    def instance_count(self) -> int:
        """How many instances of this shape fit in the GPU instance."""
        return len(self.starts)


def compute_profiles(gi: MigProfile) -> dict[int, ComputeProfile]:
    """The compute instance profiles a GPU instance of profile `gi` offers, by profile ID."""
    sizes = _CI_SIZES[gi.slice_count]
    return {
        _CI_PROFILE_FOR_SIZE[s]: ComputeProfile(
            id=_CI_PROFILE_FOR_SIZE[s],
            slice_count=s,
            starts=tuple(range(0, gi.slice_count - s + 1, s)),
        )
        for s in sizes
    }
