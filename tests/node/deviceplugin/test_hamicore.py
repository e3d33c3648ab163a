"""The hami-core environment and mounts."""

from __future__ import annotations

from typing import Any

import pytest

from kube_vgpu.contract.devices import DeviceRecord
from kube_vgpu.node.deviceplugin.hamicore import Mount, build_response, cache_dir
from tests.support.node import GPUS, UUID_A, UUID_B, container

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


@pytest.mark.parametrize(
    "env",
    [
        [{"name": "CUDA_DISABLE_CONTROL", "value": "true"}],
        [{"name": "CUDA_DISABLE_CONTROL"}],
        [{"name": "LD_PRELOAD", "value": ""}, {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "99999m"}],
        [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}, "not a mapping", {"name": None}],
    ],
)
def test_a_pods_env_never_changes_what_is_mounted_or_set(env: list[Any]) -> None:
    """A pod's own CUDA_DISABLE_CONTROL (or any env) never changes what the plugin mounts."""
    records = (DeviceRecord(UUID_A, 1000, 20),)
    plain = build_response(records, BY_UUID, container("c"), pod_uid="u", hook_path="/h", cache_file="c")
    hostile = build_response(
        records, BY_UUID, {**container("c"), "env": env}, pod_uid="u", hook_path="/h", cache_file="c"
    )
    assert hostile == plain
    assert [m.container_path for m in hostile.mounts] == [
        "/usr/local/vgpu/libvgpu.so",
        "/tmp/vgpu",
        "/tmp/vgpulock",
        "/etc/ld.so.preload",
    ]
    assert hostile.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1000m"


def test_cache_dir_layout() -> None:
    assert cache_dir("/usr/local/vgpu", "abc", "main") == "/usr/local/vgpu/vgpu/containers/abc_main"
