"""MIG on the simulated NVML: profiles, placements, instances, MIG devices, mode and its errors."""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml
import pytest

from kube_vgpu.contract.mig.geometry import geometry_for_type
from kube_vgpu.contract.mig.shipped import default_device_config
from kube_vgpu.standins.nvml.api import SimProcess, SimulatedNvml, SimulationError, load_simulation
from kube_vgpu.standins.nvml.events import FakeClock
from kube_vgpu.standins.nvml.profiles import MODELS

MIG_MODELS = sorted(MODELS)
GI_PROFILES = [
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE,
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1,
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2,
    pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE,
    pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE,
    pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE,
    pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE,
]
SHARED = pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED


def sim(model: str = "NVIDIA A100-SXM4-40GB", /, **flags: Any) -> tuple[SimulatedNvml, Any]:
    gpu = {"model": model, "migCapable": True, "migEnabled": True, **flags}
    nvml = load_simulation({"gpus": [gpu]}, "node-a", clock=FakeClock())
    nvml.nvmlInit()
    return nvml, nvml.nvmlDeviceGetHandleByIndex(0)


def profile_ids(nvml: SimulatedNvml, device: Any) -> dict[str, Any]:
    infos = [nvml.nvmlDeviceGetGpuInstanceProfileInfo(device, p) for p in GI_PROFILES]
    return {info.name.removeprefix("MIG "): info for info in infos}


def placements(nvml: SimulatedNvml, device: Any, profile_id: int) -> list[tuple[int, int]]:
    count = ctypes.c_uint()
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(device, profile_id, None, ctypes.byref(count))
    array = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(device, profile_id, array, ctypes.byref(count))
    return [(p.start, p.size) for p in array[: count.value]]


def full_ci(nvml: SimulatedNvml, gi: Any) -> Any:
    """Create the compute instance that spans the whole GPU instance (`nvidia-smi mig -cci`):
    the largest compute profile the instance offers."""
    for profile in reversed(range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT)):
        try:
            info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, profile, SHARED)
        except pynvml.NVMLError_NotSupported:
            continue
        return nvml.nvmlGpuInstanceCreateComputeInstance(gi, info.id)
    raise AssertionError("no compute instance profile")


def with_placement(start: int, size: int) -> Any:
    placement = pynvml.c_nvmlGpuInstancePlacement_t()
    placement.start, placement.size = start, size
    return ctypes.byref(placement)


@pytest.mark.parametrize("model", MIG_MODELS)
def test_each_model_fills_to_each_profile_instance_count_and_no_further(model: str) -> None:
    nvml, device = sim(model)
    for name, info in profile_ids(nvml, device).items():
        assert nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(device, info.id) == info.instanceCount
        created = [nvml.nvmlDeviceCreateGpuInstance(device, info.id) for _ in range(info.instanceCount)]
        with pytest.raises(pynvml.NVMLError_InsufficientResources):
            nvml.nvmlDeviceCreateGpuInstance(device, info.id)
        assert nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(device, info.id) == 0
        taken = [nvml.nvmlGpuInstanceGetInfo(g).placement for g in created]
        slices = [s for p in taken for s in range(p.start, p.start + p.size)]
        assert len(slices) == len(set(slices)), name  # no two instances share a memory slice
        assert {(p.start, p.size) for p in taken} <= set(placements(nvml, device, info.id)), name
        assert len({nvml.nvmlGpuInstanceGetInfo(g).id for g in created}) == info.instanceCount, name
        for gi in created:
            nvml.nvmlGpuInstanceDestroy(gi)


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        (
            "NVIDIA A100-SXM4-40GB",
            {"1g.5gb": (19, 4864, 7), "2g.10gb": (14, 9856, 3), "7g.40gb": (0, 40192, 1)},
        ),
        (
            "NVIDIA A100 80GB PCIe",
            {"1g.10gb": (19, 9728, 7), "3g.40gb": (9, 40192, 2), "7g.80gb": (0, 80896, 1)},
        ),
        (
            "NVIDIA H100 80GB HBM3",
            {"1g.20gb": (15, 20096, 4), "4g.40gb": (5, 40448, 1), "7g.80gb": (0, 81152, 1)},
        ),
        (
            "NVIDIA H200",
            {
                "1g.18gb": (19, 16384, 7),
                "1g.18gb+me": (20, 16384, 1),
                "1g.35gb": (15, 33280, 4),
                "2g.35gb": (14, 33280, 3),
                "3g.71gb": (9, 66560, 2),
                "4g.71gb": (5, 66560, 1),
                "7g.141gb": (0, 143360, 1),
            },
        ),
    ],
)
def test_profile_tables_report_ids_memory_and_counts(
    model: str, expected: dict[str, tuple[int, int, int]]
) -> None:
    nvml, device = sim(model)
    infos = profile_ids(nvml, device)
    for name, (profile_id, memory, count) in expected.items():
        info = infos[name]
        assert (info.id, info.memorySizeMB, info.instanceCount) == (profile_id, memory, count), name


def test_placements_follow_the_memory_slices(nvml_a100: tuple[SimulatedNvml, Any]) -> None:
    nvml, device = nvml_a100
    ids = {name: info.id for name, info in profile_ids(nvml, device).items()}
    assert placements(nvml, device, ids["1g.5gb"]) == [(s, 1) for s in range(7)]
    assert placements(nvml, device, ids["1g.10gb"]) == [(0, 2), (2, 2), (4, 2), (6, 2)]
    assert placements(nvml, device, ids["2g.10gb"]) == [(0, 2), (2, 2), (4, 2)]
    assert placements(nvml, device, ids["3g.20gb"]) == [(0, 4), (4, 4)]
    assert placements(nvml, device, ids["7g.40gb"]) == [(0, 8)]
    small = (pynvml.c_nvmlGpuInstancePlacement_t * 2)()
    count = ctypes.c_uint()
    with pytest.raises(pynvml.NVMLError_InsufficientSize):
        nvml.nvmlDeviceGetGpuInstancePossiblePlacements(device, ids["1g.5gb"], small, ctypes.byref(count))
    assert count.value == 7
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetGpuInstanceProfileInfo(device, pynvml.NVML_GPU_INSTANCE_PROFILE_6_SLICE)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetGpuInstanceProfileInfo(device, pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT)


@pytest.fixture
def nvml_a100() -> tuple[SimulatedNvml, Any]:
    return sim("NVIDIA A100-SXM4-40GB")


def test_volcano_group2_layout_gives_mig_devices_in_position_order(
    nvml_a100: tuple[SimulatedNvml, Any],
) -> None:
    nvml, device = nvml_a100
    ids = {name: info.id for name, info in profile_ids(nvml, device).items()}
    # Created out of order on purpose: MIG device order follows placement, not creation.
    for name, start, size in [("1g.5gb", 6, 1), ("2g.10gb", 2, 2), ("2g.10gb", 0, 2), ("2g.10gb", 4, 2)]:
        full_ci(
            nvml,
            nvml.nvmlDeviceCreateGpuInstanceWithPlacement(device, ids[name], with_placement(start, size)),
        )
    assert nvml.nvmlDeviceGetMaxMigDeviceCount(device) == 7
    migs = [nvml.nvmlDeviceGetMigDeviceHandleByIndex(device, i) for i in range(4)]
    assert [nvml.nvmlDeviceGetName(m) for m in migs] == ["NVIDIA A100-SXM4-40GB MIG 2g.10gb"] * 3 + [
        "NVIDIA A100-SXM4-40GB MIG 1g.5gb"
    ]
    assert [nvml.nvmlDeviceGetGpuInstanceId(m) for m in migs] == [3, 4, 5, 13]
    assert [nvml.nvmlDeviceGetComputeInstanceId(m) for m in migs] == [0, 0, 0, 0]
    with pytest.raises(pynvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(device, 4)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(device, 7)
    attrs = nvml.nvmlDeviceGetAttributes(migs[0])
    assert (attrs.memorySizeMB, attrs.gpuInstanceSliceCount, attrs.computeInstanceSliceCount) == (9856, 2, 2)
    assert nvml.nvmlDeviceGetMemoryInfo(migs[3]).total == 4864 << 20
    mig_uuid = nvml.nvmlDeviceGetUUID(migs[0])
    assert mig_uuid.startswith("MIG-") and len(mig_uuid) == 40
    assert nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByUUID(mig_uuid)) == mig_uuid
    parent = nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(migs[0])
    assert nvml.nvmlDeviceGetUUID(parent) == nvml.nvmlDeviceGetUUID(device)
    assert nvml.nvmlDeviceIsMigDeviceHandle(migs[0]) and not nvml.nvmlDeviceIsMigDeviceHandle(device)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetGpuInstanceId(device)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(device)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetUtilizationRates(device)


def test_placements_must_be_offered_and_free(nvml_a100: tuple[SimulatedNvml, Any]) -> None:
    nvml, device = nvml_a100
    ids = {name: info.id for name, info in profile_ids(nvml, device).items()}
    nvml.nvmlDeviceCreateGpuInstanceWithPlacement(device, ids["3g.20gb"], with_placement(4, 4))
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        nvml.nvmlDeviceCreateGpuInstanceWithPlacement(device, ids["2g.10gb"], with_placement(4, 2))
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceCreateGpuInstanceWithPlacement(device, ids["2g.10gb"], with_placement(1, 2))
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceCreateGpuInstanceWithPlacement(device, ids["2g.10gb"], with_placement(0, 4))
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceCreateGpuInstance(device, 99)
    # 4g + 3g fill all seven compute slices; nothing else fits.
    nvml.nvmlDeviceCreateGpuInstance(device, ids["4g.20gb"])
    assert nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(device, ids["1g.5gb"]) == 0
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        nvml.nvmlDeviceCreateGpuInstance(device, ids["1g.5gb"])


def test_listing_and_destroying_instances(nvml_a100: tuple[SimulatedNvml, Any]) -> None:
    nvml, device = nvml_a100
    ids = {name: info.id for name, info in profile_ids(nvml, device).items()}
    first = nvml.nvmlDeviceCreateGpuInstance(device, ids["3g.20gb"])
    second = nvml.nvmlDeviceCreateGpuInstance(device, ids["3g.20gb"])
    ci = full_ci(nvml, first)
    count = ctypes.c_uint()
    array = (pynvml.c_nvmlGpuInstance_t * 2)()
    assert (
        nvml.nvmlDeviceGetGpuInstances(device, ids["3g.20gb"], array, ctypes.byref(count))
        == pynvml.NVML_SUCCESS
    )
    assert count.value == 2 and [nvml.nvmlGpuInstanceGetInfo(array[i]).id for i in range(2)] == [1, 2]
    with pytest.raises(pynvml.NVMLError_InsufficientSize):
        nvml.nvmlDeviceGetGpuInstances(
            device, ids["3g.20gb"], (pynvml.c_nvmlGpuInstance_t * 1)(), ctypes.byref(count)
        )
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetGpuInstances(device, ids["3g.20gb"], None, ctypes.byref(count))
    gi_id = nvml.nvmlGpuInstanceGetInfo(first).id
    assert nvml.nvmlGpuInstanceGetInfo(nvml.nvmlDeviceGetGpuInstanceById(device, gi_id)).id == gi_id
    with pytest.raises(pynvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetGpuInstanceById(device, 9)
    ci_info = nvml.nvmlComputeInstanceGetInfo(ci)
    assert (ci_info.id, nvml.nvmlGpuInstanceGetInfo(ci_info.gpuInstance).id) == (0, gi_id)
    assert nvml.nvmlDeviceGetUUID(ci_info.device) == nvml.nvmlDeviceGetUUID(device)
    # A GPU instance with a compute instance is in use; a compute instance with a process too.
    with pytest.raises(pynvml.NVMLError_InUse):
        nvml.nvmlGpuInstanceDestroy(first)
    nvml.set_processes(
        0, [SimProcess(pid=7, used_bytes=1 << 30, gpu_instance_id=gi_id, compute_instance_id=0)]
    )
    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(device, 0)
    assert nvml.nvmlDeviceGetMemoryInfo(mig).used == 1 << 30
    assert [p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(mig)] == [7]
    with pytest.raises(pynvml.NVMLError_InUse):
        nvml.nvmlComputeInstanceDestroy(ci)
    nvml.set_processes(0, [])
    nvml.nvmlComputeInstanceDestroy(ci)
    nvml.nvmlGpuInstanceDestroy(first)
    nvml.nvmlGpuInstanceDestroy(second)
    # Handles of destroyed instances and their MIG devices are invalid now.
    for call, handle in [(nvml.nvmlGpuInstanceGetInfo, first), (nvml.nvmlComputeInstanceGetInfo, ci)]:
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            call(handle)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetUUID(mig)


def test_compute_instances_inside_a_full_gpu_instance(nvml_a100: tuple[SimulatedNvml, Any]) -> None:
    nvml, device = nvml_a100
    gi = nvml.nvmlDeviceCreateGpuInstance(device, profile_ids(nvml, device)["7g.40gb"].id)
    offered = {}
    for profile in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
        try:
            info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, profile, SHARED)
        except pynvml.NVMLError_NotSupported:
            continue
        offered[info.name] = (info.sliceCount, info.instanceCount)
    assert offered == {
        "MIG 1c.7g.40gb": (1, 7),
        "MIG 2c.7g.40gb": (2, 3),
        "MIG 3c.7g.40gb": (3, 2),
        "MIG 4c.7g.40gb": (4, 1),
        "MIG 7g.40gb": (7, 1),
    }
    three = pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE
    cis = [nvml.nvmlGpuInstanceCreateComputeInstance(gi, three) for _ in range(2)]
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        nvml.nvmlGpuInstanceCreateComputeInstance(gi, three)
    assert (
        nvml.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(
            gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE
        )
        == 1
    )
    count = ctypes.c_uint()
    array = (pynvml.c_nvmlComputeInstance_t * 2)()
    nvml.nvmlGpuInstanceGetComputeInstances(gi, three, array, ctypes.byref(count))
    assert count.value == 2 and {
        nvml.nvmlComputeInstanceGetInfo(array[i]).placement.start for i in range(2)
    } == {0, 3}
    # Two compute instances are two MIG devices sharing the instance's memory.
    migs = [nvml.nvmlDeviceGetMigDeviceHandleByIndex(device, i) for i in range(2)]
    assert {nvml.nvmlDeviceGetAttributes(m).computeInstanceSliceCount for m in migs} == {3}
    assert nvml.nvmlDeviceGetName(migs[0]) == "NVIDIA A100-SXM4-40GB MIG 3c.7g.40gb"
    assert len(cis) == 2
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, three, 1)


def test_a_recreated_instance_is_a_new_mig_device(nvml_a100: tuple[SimulatedNvml, Any]) -> None:
    nvml, device = nvml_a100
    profile = profile_ids(nvml, device)["7g.40gb"].id
    uuids = []
    for _ in range(2):
        gi = nvml.nvmlDeviceCreateGpuInstance(device, profile)
        ci = full_ci(nvml, gi)
        uuids.append(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetMigDeviceHandleByIndex(device, 0)))
        nvml.nvmlComputeInstanceDestroy(ci)
        nvml.nvmlGpuInstanceDestroy(gi)
    assert uuids[0] != uuids[1]


@pytest.mark.parametrize(
    ("flags", "mode"),
    [
        ({"migEnabled": False}, [0, 0]),
        ({"migEnabled": False, "migPending": True}, [0, 1]),
        ({"migPending": True}, [1, 0]),
    ],
)
def test_instances_need_mig_on_with_nothing_pending(flags: dict[str, bool], mode: list[int]) -> None:
    nvml, device = sim(**flags)
    assert nvml.nvmlDeviceGetMigMode(device) == mode
    profile = profile_ids(nvml, device)["1g.5gb"].id
    assert len(placements(nvml, device, profile)) == 7  # placements are listed whatever the mode
    for call in (nvml.nvmlDeviceCreateGpuInstance, nvml.nvmlDeviceGetGpuInstanceRemainingCapacity):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call(device, profile)


def test_mig_mode_changes_apply_on_an_idle_gpu_or_wait_for_a_reset() -> None:
    nvml, device = sim(migEnabled=False)
    assert nvml.nvmlDeviceGetMaxMigDeviceCount(device) == 0
    assert nvml.nvmlDeviceSetMigMode(device, pynvml.NVML_DEVICE_MIG_ENABLE) == pynvml.NVML_SUCCESS
    assert nvml.nvmlDeviceGetMigMode(device) == [1, 1]
    gi = nvml.nvmlDeviceCreateGpuInstance(device, profile_ids(nvml, device)["7g.40gb"].id)
    with pytest.raises(pynvml.NVMLError_InUse):
        nvml.nvmlDeviceSetMigMode(device, pynvml.NVML_DEVICE_MIG_DISABLE)
    nvml.nvmlGpuInstanceDestroy(gi)
    nvml.set_processes(0, [SimProcess(pid=1)])
    assert nvml.nvmlDeviceSetMigMode(device, pynvml.NVML_DEVICE_MIG_DISABLE) == pynvml.NVML_ERROR_IN_USE
    assert nvml.nvmlDeviceGetMigMode(device) == [1, 0]
    nvml.reset_gpu(0)
    assert nvml.nvmlDeviceGetMigMode(device) == [0, 0]
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceSetMigMode(device, 2)


def test_gpus_that_are_not_mig_capable_say_not_supported() -> None:
    nvml = load_simulation({"gpus": [{"model": "NVIDIA A100-SXM4-40GB"}]}, "n", clock=FakeClock())
    nvml.nvmlInit()
    device = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetMaxMigDeviceCount(device) == 0
    for call in (nvml.nvmlDeviceGetMigMode, lambda d: nvml.nvmlDeviceGetGpuInstanceProfileInfo(d, 0)):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call(device)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(device, 0)


def test_a_lost_gpu_takes_its_instances_and_mig_devices_with_it(nvml_a100: tuple[SimulatedNvml, Any]) -> None:
    nvml, device = nvml_a100
    gi = nvml.nvmlDeviceCreateGpuInstance(device, profile_ids(nvml, device)["7g.40gb"].id)
    full_ci(nvml, gi)
    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(device, 0)
    nvml.set_lost(0, True)
    for call, handle in [(nvml.nvmlGpuInstanceGetInfo, gi), (nvml.nvmlDeviceGetUUID, mig)]:
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            call(handle)
    nvml.set_lost(0, False)
    assert nvml.nvmlDeviceGetUUID(mig).startswith("MIG-")


def test_instances_from_the_file_exist_at_start() -> None:
    nvml, device = sim("NVIDIA H100 80GB HBM3", migInstances=["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"])
    names = [nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetMigDeviceHandleByIndex(device, i)) for i in range(4)]
    assert sorted(n.split(" MIG ")[1] for n in names) == ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]
    with pytest.raises(SimulationError, match=r"migInstances do not fit together \(7g.80gb does not\)"):
        sim("NVIDIA H100 80GB HBM3", migInstances=["3g.40gb", "7g.80gb"])


@pytest.mark.parametrize("model", MIG_MODELS)
def test_the_shipped_geometry_matches_the_simulated_profiles(model: str) -> None:
    # Every simulated MIG model has a shipped geometry ("NVIDIA H200" also covers the H200 NVL).
    groups = geometry_for_type(default_device_config(), "NVIDIA-" + model)
    assert groups is not None, model
    nvml, device = sim(model)
    memory = {name: info.memorySizeMB for name, info in profile_ids(nvml, device).items()}
    for group in groups:
        for instance in group.instance_types:
            assert memory[instance.name] == instance.memory_mib, (model, instance.name)
