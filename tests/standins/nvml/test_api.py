"""The simulated pynvml surface: lifecycle, devices, handles, errors, events on a fake clock, loss."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from kube_vgpu.standins.nvml.api import SimProcess, SimulatedNvml, SimulationError, load_simulation
from kube_vgpu.standins.nvml.config import default_gpu_uuid
from kube_vgpu.standins.nvml.events import FakeClock, SystemClock

TWO_NODES = """
gpus:
  - model: NVIDIA A100-SXM4-80GB
    count: 2
  - model: Tesla V100-PCIE-32GB
    memoryMiB: 32768
events:
  - {after: 30, gpu: 1, xid: 79}
  - {after: 60, gpu: 2, lost: true}
  - {after: 90, gpu: 2, lost: false}
"""


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start=1000.0)


@pytest.fixture
def nvml(clock: FakeClock) -> Iterator[SimulatedNvml]:
    sim = load_simulation(TWO_NODES, "node-a", clock=clock)
    sim.nvmlInit()
    yield sim


def test_calls_before_init_and_after_the_last_shutdown_raise_uninitialized() -> None:
    sim = load_simulation(TWO_NODES, "node-a", clock=FakeClock())
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        sim.nvmlDeviceGetCount()
    sim.nvmlInit()
    sim.nvmlInit()
    sim.nvmlShutdown()
    assert sim.nvmlDeviceGetCount() == 3  # one reference left
    sim.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        sim.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        sim.nvmlShutdown()


def test_every_simulated_function_has_pynvml_parameter_names() -> None:
    names = [n for n, v in inspect.getmembers(SimulatedNvml) if n.startswith("nvml") and callable(v)]
    assert len(names) > 45
    for name in names:
        real = inspect.signature(getattr(pynvml, name))
        ours = inspect.signature(getattr(SimulatedNvml, name))
        ours_params = [(p.name, p.default) for p in ours.parameters.values()][1:]
        assert ours_params == [(p.name, p.default) for p in real.parameters.values()], name


def test_identity_of_each_gpu(nvml: SimulatedNvml) -> None:
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    assert [nvml.nvmlDeviceGetName(h) for h in handles] == ["NVIDIA A100-SXM4-80GB"] * 2 + [
        "Tesla V100-PCIE-32GB"
    ]
    uuids = [nvml.nvmlDeviceGetUUID(h) for h in handles]
    assert uuids == [default_gpu_uuid("node-a", i) for i in range(3)]
    assert [nvml.nvmlDeviceGetMinorNumber(h) for h in handles] == [0, 1, 2]
    assert [nvml.nvmlDeviceGetIndex(h) for h in handles] == [0, 1, 2]
    bus_ids = [nvml.nvmlDeviceGetPciInfo(h).busId for h in handles]
    assert len(set(bus_ids)) == 3 and all(b.startswith("00000000:") for b in bus_ids)
    assert nvml.nvmlDeviceGetPciInfo(handles[0]).pciDeviceId == 0x20B210DE
    assert nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByPciBusId(bus_ids[2])) == uuids[2]
    assert nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByUUID(uuids[1])) == uuids[1]
    assert nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByUUID(uuids[1].encode())) == uuids[1]
    memory = nvml.nvmlDeviceGetMemoryInfo(handles[2])
    assert (memory.total, memory.used, memory.free) == (32768 << 20, 0, 32768 << 20)
    assert nvml.nvmlSystemGetDriverVersion() == "550.54.15"
    assert not nvml.nvmlDeviceIsMigDeviceHandle(handles[0])


def test_lookups_that_fail_raise_the_real_nvml_errors(nvml: SimulatedNvml) -> None:
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetHandleByIndex(3)
    with pytest.raises(pynvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetName("not a handle")
    other = load_simulation(TWO_NODES, "node-a", clock=FakeClock())
    other.nvmlInit()
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetName(other.nvmlDeviceGetHandleByIndex(0))
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetName(nvml.nvmlEventSetCreate())
    # Every error is a pynvml.NVMLError carrying its code.
    with pytest.raises(pynvml.NVMLError) as info:
        nvml.nvmlDeviceGetMigMode(nvml.nvmlDeviceGetHandleByIndex(2))
    assert info.value.value == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_other_names_are_the_real_module_and_unsimulated_calls_are_not_found(nvml: SimulatedNvml) -> None:
    assert nvml.NVML_DEVICE_MIG_ENABLE == pynvml.NVML_DEVICE_MIG_ENABLE == 1
    assert nvml.NVMLError_NotFound is pynvml.NVMLError_NotFound
    assert nvml.c_nvmlGpuInstance_t is pynvml.c_nvmlGpuInstance_t
    assert nvml.nvmlEventTypeXidCriticalError == pynvml.nvmlEventTypeXidCriticalError
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        nvml.nvmlDeviceGetSerial(nvml.nvmlDeviceGetHandleByIndex(0))
    with pytest.raises(AttributeError, match="no attribute 'nvmlNoSuchThing'"):
        _ = nvml.nvmlNoSuchThing


def test_processes_utilisation_and_used_memory(nvml: SimulatedNvml) -> None:
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.set_processes(0, [SimProcess(pid=41, used_bytes=3 << 30), SimProcess(pid=42)])
    nvml.set_utilization(0, gpu=55, memory=20)
    procs = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    assert [(p.pid, p.usedGpuMemory) for p in procs] == [(41, 3 << 30), (42, None)]
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    assert memory.used == 3 << 30 and memory.free == memory.total - (3 << 30)
    rates = nvml.nvmlDeviceGetUtilizationRates(handle)
    assert (rates.gpu, rates.memory) == (55, 20)


def _xid_set(nvml: SimulatedNvml, gpu: int) -> object:
    event_set = nvml.nvmlEventSetCreate()
    handle = nvml.nvmlDeviceGetHandleByIndex(gpu)
    mask = nvml.nvmlDeviceGetSupportedEventTypes(handle) & pynvml.nvmlEventTypeXidCriticalError
    nvml.nvmlDeviceRegisterEvents(handle, mask, event_set)
    return event_set


def test_a_timed_xid_arrives_after_its_delay_on_the_fake_clock(nvml: SimulatedNvml, clock: FakeClock) -> None:
    event_set = _xid_set(nvml, 1)
    timeouts = 0
    while True:
        try:
            data = nvml.nvmlEventSetWait_v2(event_set, 5000)
            break
        except pynvml.NVMLError_Timeout:
            timeouts += 1
            assert timeouts < 10
    assert timeouts == 5  # 5 s waits: nothing at 5, 10, ... 25 s, the XID at 30 s
    assert clock.monotonic() == 1030.0
    assert (data.eventType, data.eventData) == (pynvml.nvmlEventTypeXidCriticalError, 79)
    assert (data.gpuInstanceId, data.computeInstanceId) == (0xFFFFFFFF, 0xFFFFFFFF)
    assert nvml.nvmlDeviceGetUUID(data.device) == default_gpu_uuid("node-a", 1)
    with pytest.raises(pynvml.NVMLError_Timeout):
        nvml.nvmlEventSetWait_v2(event_set, 0)


def test_events_reach_only_sets_registered_for_them_before_they_happened(
    nvml: SimulatedNvml, clock: FakeClock
) -> None:
    other_gpu = _xid_set(nvml, 0)
    ecc_only = nvml.nvmlEventSetCreate()
    nvml.nvmlDeviceRegisterEvents(
        nvml.nvmlDeviceGetHandleByIndex(1), pynvml.nvmlEventTypeDoubleBitEccError, ecc_only
    )
    clock.advance(40)
    late = _xid_set(nvml, 1)  # registered after the XID at 30 s
    for event_set in (other_gpu, ecc_only, late):
        with pytest.raises(pynvml.NVMLError_Timeout):
            nvml.nvmlEventSetWait_v2(event_set, 1000)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceRegisterEvents(nvml.nvmlDeviceGetHandleByIndex(0), 1 << 40, late)


def test_injected_xid_carries_instance_ids_and_freed_sets_are_invalid(nvml: SimulatedNvml) -> None:
    event_set = _xid_set(nvml, 0)
    nvml.inject_xid(0, 48, gpu_instance_id=3, compute_instance_id=0)
    data = nvml.nvmlEventSetWait(event_set, 0)
    assert (data.eventData, data.gpuInstanceId, data.computeInstanceId) == (48, 3, 0)
    nvml.nvmlEventSetFree(event_set)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlEventSetWait_v2(event_set, 0)
    with pytest.raises(ValueError, match="GPU index 7"):
        nvml.inject_xid(7, 79)


def test_a_waiting_thread_wakes_for_an_injected_xid() -> None:
    sim = load_simulation(TWO_NODES, "node-a", clock=SystemClock())
    sim.nvmlInit()
    event_set = _xid_set(sim, 2)
    got: list[int] = []

    def wait() -> None:
        got.append(sim.nvmlEventSetWait_v2(event_set, 60_000).eventData)

    waiter = threading.Thread(target=wait)
    waiter.start()
    sim.inject_xid(2, 31)
    waiter.join(timeout=30)
    assert not waiter.is_alive() and got == [31]


@pytest.mark.parametrize("ending", ["free", "shutdown"])
def test_freeing_the_set_or_shutting_down_wakes_a_waiter(ending: str) -> None:
    sim = load_simulation(TWO_NODES, "node-a", clock=SystemClock())
    sim.nvmlInit()
    event_set = _xid_set(sim, 0)
    errors: list[type[BaseException]] = []

    def wait() -> None:
        try:
            sim.nvmlEventSetWait_v2(event_set, 60_000)
        except pynvml.NVMLError as exc:
            errors.append(type(exc))

    waiter = threading.Thread(target=wait)
    waiter.start()
    if ending == "free":
        sim.nvmlEventSetFree(event_set)
    else:
        sim.nvmlShutdown()
    waiter.join(timeout=30)
    assert not waiter.is_alive()
    # The waiter either saw the ending while blocked or on entry; both are NVML errors.
    expected = pynvml.NVMLError_InvalidArgument if ending == "free" else pynvml.NVMLError_Uninitialized
    assert errors == [expected]


def test_a_lost_gpu_raises_gpu_is_lost_until_it_answers_again(nvml: SimulatedNvml, clock: FakeClock) -> None:
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.set_lost(0, True)
    for call in (nvml.nvmlDeviceGetMemoryInfo, nvml.nvmlDeviceGetUUID, nvml.nvmlDeviceGetSupportedEventTypes):
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            call(handle)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetCount() == 3
    nvml.set_lost(0, False)
    assert nvml.nvmlDeviceGetMemoryInfo(handle).total == 81920 << 20
    # The file loses GPU 2 at 60 s and brings it back at 90 s.
    gpu2 = nvml.nvmlDeviceGetHandleByIndex(2)
    clock.advance(61)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetName(gpu2)
    clock.advance(30)
    assert nvml.nvmlDeviceGetName(gpu2) == "Tesla V100-PCIE-32GB"


def test_load_from_a_path_text_or_mapping(tmp_path: Path) -> None:
    path = tmp_path / "sim.yaml"
    path.write_text("gpus:\n  - {model: NVIDIA H200, count: 2}\n")
    for source in (path, str(path), path.read_text(), {"gpus": [{"model": "NVIDIA H200", "count": 2}]}):
        sim = load_simulation(source, "n1")
        sim.nvmlInit()
        assert sim.nvmlDeviceGetCount() == 2
    with pytest.raises(SimulationError, match=r"cannot read simulation file .*missing\.yaml"):
        load_simulation(str(tmp_path / "missing.yaml"), "n1")
    path.write_text("gpus:\n  - {model: NVIDIA H200, count: -1}\n")
    with pytest.raises(SimulationError, match=r"sim\.yaml: gpus\[0\]\.count"):
        load_simulation(path, "n1")
