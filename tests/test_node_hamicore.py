"""The hami-core environment and mounts (protocol §5.6)."""

from __future__ import annotations

from test_node_support import GPUS, UUID_A, UUID_B, container

from contract.devices import DeviceRecord
from node.hamicore import Mount, build_response, cache_dir

BY_UUID = {g.uuid: g for g in GPUS}


def test_two_device_container() -> None:
    records = (DeviceRecord(UUID_A, 2048, 0), DeviceRecord(UUID_B, 2048, 0))
    response = build_response(
        records, BY_UUID, container("c2"), pod_uid="u1", hook_path="/usr/local/vgpu", cache_file="x.cache"
    )
    assert response.envs == {
        "NVIDIA_VISIBLE_DEVICES": f"{UUID_A},{UUID_B}",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "2048m",
        "CUDA_DEVICE_MEMORY_LIMIT_1": "2048m",
        "CUDA_DEVICE_SM_LIMIT": "0",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/tmp/vgpu/x.cache",
    }
    assert response.mounts == (
        Mount("/usr/local/vgpu/libvgpu.so", "/usr/local/vgpu/libvgpu.so", True),
        Mount("/tmp/vgpu", "/usr/local/vgpu/vgpu/containers/u1_c2", False),
        Mount("/tmp/vgpulock", "/tmp/vgpulock", False),
        Mount("/etc/ld.so.preload", "/usr/local/vgpu/ld.so.preload", True),
    )


def test_cores_from_first_device_and_whole_card_for_zero_memory() -> None:
    records = (DeviceRecord(UUID_A, 0, 30),)
    response = build_response(records, BY_UUID, container("c"), pod_uid="u", hook_path="/h", cache_file="c")
    assert response.envs["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert response.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "32768m"


def test_disable_control_drops_the_preload() -> None:
    c = container("c", env=[{"name": "CUDA_DISABLE_CONTROL", "value": "true"}])
    response = build_response(
        (DeviceRecord(UUID_A, 1, 0),), BY_UUID, c, pod_uid="u", hook_path="/h", cache_file="c", lock_dir="/l"
    )
    assert [m.container_path for m in response.mounts] == [
        "/usr/local/vgpu/libvgpu.so",
        "/tmp/vgpu",
        "/tmp/vgpulock",
    ]
    assert response.mounts[2].host_path == "/l"


def test_cache_dir_layout() -> None:
    assert cache_dir("/usr/local/vgpu", "abc", "main") == "/usr/local/vgpu/vgpu/containers/abc_main"
