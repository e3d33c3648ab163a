"""`webhook.isolation` as plain function calls: how mount paths are resolved and compared."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from kube_vgpu.contract.config import Config, NodeConfig
from kube_vgpu.contract.container_env import reachable_by_prefix, reserved
from kube_vgpu.contract.devices import DeviceRecord
from kube_vgpu.node.deviceplugin.hamicore import build_response
from kube_vgpu.webhook.admission.isolation import (
    covers,
    find_escape,
    grouped_containers,
    host_overlaps,
    normalize,
)
from tests.support.node import GPUS, UUID_A


@pytest.mark.parametrize(
    ("written", "resolved"),
    [
        ("/etc/ld.so.preload", "/etc/ld.so.preload"),
        ("//etc/ld.so.preload", "/etc/ld.so.preload"),
        ("///etc//ld.so.preload/", "/etc/ld.so.preload"),
        ("/../../etc/ld.so.preload", "/etc/ld.so.preload"),
        ("etc/ld.so.preload", "/etc/ld.so.preload"),
        ("/", "/"),
        ("", "/"),
    ],
)
def test_normalize_resolves_as_the_runtime_does(written: str, resolved: str) -> None:
    assert normalize(written) == resolved


def test_covers_compares_whole_segments() -> None:
    assert covers("/tmp/vgpu", "/tmp/vgpu")
    assert covers("/tmp/vgpu/a/b", "/tmp/vgpu")
    assert not covers("/tmp/vgpufoo", "/tmp/vgpu")
    assert not covers("/tmp", "/tmp/vgpu")  # a parent is covered by the plugin's deeper mount


def test_host_overlaps_goes_both_ways() -> None:
    assert host_overlaps("/", "/usr/local/vgpu")
    assert host_overlaps("/usr/local/vgpu/vgpu/containers/x", "/usr/local/vgpu")
    assert not host_overlaps("/usr/local/vgpux", "/usr/local/vgpu")
    assert not host_overlaps("/srv", "/usr/local/vgpu")


def test_the_hook_path_is_a_host_folder_not_a_container_path() -> None:
    config = Config(node=NodeConfig(hook_path="/opt/hami"))

    def mounting(path: str) -> dict[str, object]:
        return {"spec": {"containers": [{"name": "c", "volumeMounts": [{"name": "v", "mountPath": path}]}]}}

    # Inside the container the node plugin mounts at the fixed paths, whatever the host folder is.
    escape = find_escape(mounting("/usr/local/vgpu/libvgpu.so"), config)
    assert escape is not None and "covers /usr/local/vgpu," in escape.message()
    assert find_escape(mounting("/opt/hami/libvgpu.so"), config) is None
    # On the host, the configured folder is the one refused as a hostPath.
    moved = {"spec": {"volumes": [{"name": "h", "hostPath": {"path": "/opt/hami"}}]}}
    assert find_escape(moved, config) is not None
    old = {"spec": {"volumes": [{"name": "h", "hostPath": {"path": "/usr/local/vgpu"}}]}}
    assert find_escape(old, config) is None


@pytest.mark.parametrize("hook_path", ["/usr/local/vgpu", "/var/lib/vgpu", "/opt/hami"])
def test_every_path_the_node_plugin_mounts_is_protected(hook_path: str) -> None:
    # Both sides read one definition (contract.container_paths); this pins that they agree.
    records = (DeviceRecord(UUID_A, 1000, 20),)
    response = build_response(
        records, {g.uuid: g for g in GPUS}, {"name": "c"}, pod_uid="u", hook_path=hook_path, cache_file="x"
    )
    config = Config(node=NodeConfig(hook_path=hook_path))
    assert len(response.mounts) == 4
    for mount in response.mounts:
        pod = {"spec": {"containers": [{"name": "c", "volumeMounts": [{"mountPath": mount.container_path}]}]}}
        escape = find_escape(pod, config)
        assert escape is not None, mount
        host = {"spec": {"volumes": [{"name": "h", "hostPath": {"path": mount.host_path}}]}}
        assert find_escape(host, config) is not None, mount


@pytest.mark.parametrize(
    "spec",
    [
        {"containers": [{"name": "c", "env": [{"name": None}, "junk", {"valueFrom": {}}]}]},
        {"containers": [{"name": "c", "volumeMounts": [{"mountPath": 5}, None]}]},
        {"volumes": [{"name": "v", "hostPath": None}, {"hostPath": {"path": ["/"]}}, 7]},
        {"containers": "not-a-list-of-objects"},
    ],
)
def test_malformed_parts_are_not_escapes_and_do_not_crash(spec: dict[str, object]) -> None:
    assert find_escape({"spec": spec}, Config()) is None


def test_ephemeral_containers_are_checked_too() -> None:
    pod = {"spec": {"ephemeralContainers": [{"name": "debug", "env": [{"name": "NVIDIA_VISIBLE_DEVICES"}]}]}}
    escape = find_escape(pod, Config())
    assert escape is not None and "ephemeralContainers[debug]" in escape.message()


# --- every rule at its edge (written to kill mutmut's mutants; docs/testing.md) -------------------


def _container_pod(container: Mapping[str, Any], **spec: Any) -> dict[str, Any]:
    return {"spec": {"containers": [container], **spec}}


def _message(pod: Mapping[str, Any], config: Config | None = None) -> str:
    escape = find_escape(pod, config or Config())
    assert escape is not None
    return escape.message()


@pytest.mark.parametrize(
    "written",
    ["/etc/ld.so.preload", "/a/b", "/usr/local/vgpu/libvgpu.so", "/x.y/z", "/a.", "/tmp/vgpu.d"],
)
def test_normalize_leaves_a_clean_absolute_path_as_it_is(written: str) -> None:
    assert normalize(written) == written


@pytest.mark.parametrize(
    ("written", "resolved"),
    [
        ("/tmp/vgpu/", "/tmp/vgpu"),
        ("/a/./b", "/a/b"),
        ("/a/../b", "/b"),
        ("a/b", "/a/b"),
        ("/a//b", "/a/b"),
        ("//a", "/a"),
        ("/.", "/"),
        ("/Xdata/", "/Xdata"),  # only slashes are stripped from the front, not the segment's letters
        ("//X/", "/X"),
    ],
)
def test_normalize_resolves_each_kind_of_detour(written: str, resolved: str) -> None:
    assert normalize(written) == resolved


def test_covers_normalises_both_sides() -> None:
    assert not covers("/opt/Y", "/opt/X")  # only a slash is stripped from the protected path's end
    assert covers("/tmp//vgpu/", "/tmp/vgpu")
    assert covers("/tmp/vgpu/x", "/tmp/vgpu/")
    assert covers("/tmp/vgpu", "//tmp/vgpu")


def test_host_overlaps_normalises_and_compares_segments() -> None:
    assert host_overlaps("/usr/local/", "/usr/local/vgpu")  # above it
    assert host_overlaps("/usr//local/vgpu/x", "/usr/local/vgpu/")  # inside it
    assert not host_overlaps("/usr/local/vgp", "/usr/local/vgpu")


@pytest.mark.parametrize(
    "name",
    [
        "CUDA_DEVICE_SM_LIMIT",
        "CUDA_DEVICE_SM_LIMIT_3",
        "CUDA_DEVICE_MEMORY_LIMIT",
        "CUDA_DEVICE_MEMORY_LIMIT_0",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE",
        "CUDA_DISABLE_CONTROL",
        "CUDA_OVERSUBSCRIBE",
        "GPU_CORE_UTILIZATION_POLICY",
    ],
)
def test_each_hami_core_variable_is_an_escape_with_the_whole_message(name: str) -> None:
    pod = _container_pod({"name": "c", "env": [{"name": "HOME"}, {"name": name, "value": "x"}]})
    assert _message(pod) == (
        f"containers[c]: env {name} is set by the node plugin for vGPU containers (it carries the GPU "
        "memory and core limits): remove it from env; the limits come from the container's vgpu resources"
    )


@pytest.mark.parametrize(
    ("name", "grants"),
    [
        ("NVIDIA_VISIBLE_DEVICES", "the GPUs it names (`all`: every GPU of the node)"),
        ("NVIDIA_DRIVER_CAPABILITIES", "the driver capabilities it names"),
        ("NVIDIA_MIG_CONFIG_DEVICES", "MIG configuration rights over the GPUs it names"),
        ("NVIDIA_MIG_MONITOR_DEVICES", "MIG monitoring rights over the GPUs it names"),
        ("NVIDIA_IMEX_CHANNELS", "the IMEX channels it names, which share GPU memory across nodes"),
        ("NVIDIA_GDS", "GPUDirect Storage devices (`/dev/nvidia-fs*`)"),
        ("NVIDIA_MOFED", "Mellanox OFED devices (`/dev/infiniband`)"),
        ("NVIDIA_NVSWITCH", "the node's NVSwitch devices (`/dev/nvidia-nvswitch*`)"),
        ("NVIDIA_GDRCOPY", "the GDRCopy device (`/dev/gdrdrv`), a direct map of GPU memory"),
        ("NVIDIA_ALLOW_ADDITIONAL_GIDS", "the groups that own the injected device nodes"),
    ],
)
def test_each_runtime_variable_is_an_escape_with_the_whole_message(name: str, grants: str) -> None:
    pod = _container_pod({"name": "c", "env": [{"name": name, "valueFrom": {"fieldRef": {}}}]})
    assert _message(pod) == (
        f"containers[c]: env {name} makes the NVIDIA container runtime hand the container {grants}: "
        "remove it from env; a vGPU pod gets its GPUs from its vgpu resources, never from the runtime's "
        "variables"
    )


@pytest.mark.parametrize(
    ("name", "why"),
    [
        (
            "LD_PRELOAD",
            "loads a library into every process ahead of HAMi-core, which enforces the vGPU limits",
        ),
        (
            "LD_AUDIT",
            "loads an auditing library that can redirect every symbol binding, HAMi-core's limits included",
        ),
    ],
)
def test_each_loader_variable_is_an_escape_with_the_whole_message(name: str, why: str) -> None:
    pod = _container_pod({"name": "c", "env": [{"name": name, "value": "/x.so"}]})
    assert _message(pod) == (
        f"containers[c]: env {name} {why}: remove it from env; bake libraries into the image instead"
    )


@pytest.mark.parametrize(
    "name",
    [
        "CUDA_DEVICE_SM",
        "CUDA_DEVICE_MEMORY",
        "NVIDIA_VISIBLE_DEVICE",
        "LD_PRELOAD_X",
        "XCUDA_DISABLE_CONTROL",
        "cuda",
        "NVIDIA_IMEX_CHANNELSX",
        "NVIDIA_IMEX_CHANNEL",
        "nvidia_imex_channels",
        "NVIDIA_GDRCOP",
        "LD_AUDITS",
        "ld_audit",
        "NVIDIA_REQUIRE_CUDA",
        "NVIDIA_DISABLE_REQUIRE",
    ],
)
def test_names_that_only_look_reserved_are_not(name: str) -> None:
    assert find_escape(_container_pod({"name": "c", "env": [{"name": name}]}), Config()) is None


@pytest.mark.parametrize(
    ("prefix", "reached"),
    [
        ("N", "NVIDIA_VISIBLE_DEVICES"),
        ("NVIDIA_", "NVIDIA_VISIBLE_DEVICES"),
        ("NVIDIA_IMEX_CHANNEL", "NVIDIA_IMEX_CHANNELS"),
        ("LD_", "LD_PRELOAD"),
        ("LD_AUDI", "LD_AUDIT"),
        ("CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_MEMORY_LIMIT*"),
        ("CUDA_DEVICE_MEMORY_LIMIT_", "CUDA_DEVICE_MEMORY_LIMIT*"),
        ("CUDA_DEVICE_SM_LIMIT", "CUDA_DEVICE_SM_LIMIT*"),
        ("CUDA_DEVICE_MEMORY_L", "CUDA_DEVICE_MEMORY_LIMIT*"),
    ],
)
def test_an_env_from_prefix_that_reaches_a_reserved_name_is_an_escape(prefix: str, reached: str) -> None:
    pod = _container_pod({"name": "c", "envFrom": [{"prefix": "APP_"}, {"prefix": prefix, "secretRef": {}}]})
    assert _message(pod) == (
        f"containers[c]: envFrom prefix {prefix!r} can produce {reached}, which a vGPU pod may not set: "
        "use a prefix no reserved variable starts with (for example APP_)"
    )


@pytest.mark.parametrize(
    "prefix", ["", "APP_", "NVIDIA_IMEX_CHANNELS", "LD_PRELOAD", "nvidia_", "X", "CUDA_VISIBLE_", None, 3]
)
def test_an_env_from_prefix_that_reaches_no_reserved_name_is_not(prefix: object) -> None:
    pod = _container_pod({"name": "c", "envFrom": [{"prefix": prefix}, "junk", {"configMapRef": {}}]})
    assert find_escape(pod, Config()) is None


def test_a_container_without_a_name_is_named_by_a_question_mark() -> None:
    pod = {"spec": {"initContainers": [{"env": [{"name": "LD_PRELOAD"}]}]}}
    assert _message(pod).startswith("initContainers[?]: env LD_PRELOAD")


def test_every_group_is_checked_and_named() -> None:
    for group in ("initContainers", "containers", "ephemeralContainers"):
        pod = {"spec": {group: [{"name": "x", "env": [{"name": "LD_PRELOAD"}]}]}}
        assert _message(pod).startswith(f"{group}[x]: env LD_PRELOAD")


def test_the_first_escape_in_container_order_is_reported() -> None:
    pod: dict[str, Any] = {
        "spec": {
            "containers": [{"name": "app", "volumeMounts": [{"mountPath": "/tmp/vgpu"}]}],
            "initContainers": [{"name": "init", "env": [{"name": "LD_PRELOAD"}]}],
            "volumes": [{"name": "h", "hostPath": {"path": "/proc"}}],
        }
    }
    assert _message(pod).startswith("initContainers[init]: env LD_PRELOAD")
    del pod["spec"]["initContainers"]
    assert _message(pod).startswith("containers[app]: volumeMounts path '/tmp/vgpu'")


PROTECTED = "/usr/local/vgpu, /etc/ld.so.preload, /tmp/vgpu, /tmp/vgpulock, /var/run/nvidia-container-devices"


@pytest.mark.parametrize(
    ("path", "hit"),
    [
        ("/usr/local/vgpu/libvgpu.so", "/usr/local/vgpu"),
        ("/etc/ld.so.preload", "/etc/ld.so.preload"),
        ("/tmp/vgpu/a", "/tmp/vgpu"),
        ("/tmp/vgpulock", "/tmp/vgpulock"),
    ],
)
def test_a_mount_over_a_plugin_path_has_the_whole_message(path: str, hit: str) -> None:
    pod = _container_pod({"name": "c", "volumeMounts": [{"name": "v", "mountPath": path}]})
    assert _message(pod) == (
        f"containers[c]: volumeMounts path {path!r} covers {hit}, which the node plugin mounts to enforce "
        f"the vGPU limits: mount the volume elsewhere (not at or under {PROTECTED})"
    )


def test_a_mount_in_the_nvidia_device_list_has_the_whole_message() -> None:
    path = "/var/run/nvidia-container-devices/all"
    pod = _container_pod({"name": "c", "volumeDevices": [{"name": "v", "devicePath": path}]})
    assert _message(pod) == (
        f"containers[c]: volumeDevices path {path!r} covers /var/run/nvidia-container-devices, where the "
        "NVIDIA container runtime reads which GPUs to hand out (a mount there can ask for every GPU of the "
        f"node): mount the volume elsewhere (not at or under {PROTECTED})"
    )


@pytest.mark.parametrize(
    "path",
    [
        "/var/run/nvidia-container-devices",
        "/var/run/nvidia-container-devicesX",
        "/var/run/nvidia-container-devices/",
    ],
)
def test_the_nvidia_device_list_is_matched_by_plain_prefix(path: str) -> None:
    pod = _container_pod({"name": "c", "volumeMounts": [{"mountPath": path}]})
    assert "covers /var/run/nvidia-container-devices," in _message(pod)


@pytest.mark.parametrize(
    "path", ["/usr/local/vgpux", "/etc/ld.so.preload.d", "/tmp/vgpulock2", "/var/run/nvidia"]
)
def test_plugin_paths_are_matched_by_segment(path: str) -> None:
    assert find_escape(_container_pod({"name": "c", "volumeMounts": [{"mountPath": path}]}), Config()) is None


def test_only_devices_or_only_mounts_are_each_checked() -> None:
    only_devices = _container_pod({"name": "c", "volumeDevices": [{"devicePath": "/etc/ld.so.preload"}]})
    assert "volumeDevices path" in _message(only_devices)
    only_mounts = _container_pod({"name": "c", "volumeMounts": [{"mountPath": "/etc/ld.so.preload"}]})
    assert "volumeMounts path" in _message(only_mounts)


def test_unreadable_mounts_are_skipped_not_the_ones_after_them() -> None:
    container = {
        "name": "c",
        "volumeMounts": ["junk", {"mountPath": None}, {"mountPath": "/data"}, {"mountPath": "/tmp/vgpu"}],
        "volumeDevices": [7, {"devicePath": 5}],
    }
    assert "'/tmp/vgpu'" in _message(_container_pod(container))
    env = {"name": "c", "env": ["junk", {"name": 3}, {"name": "LD_PRELOAD"}]}
    assert "env LD_PRELOAD" in _message(_container_pod(env))


@pytest.mark.parametrize(
    ("host", "folder"),
    [
        ("/usr/local/vgpu", "/usr/local/vgpu"),
        ("/tmp/vgpulock/x", "/tmp/vgpulock"),
        ("/var/lib/kubelet/device-plugins/kubelet.sock", "/var/lib/kubelet/device-plugins"),
        ("/proc/1/root", "/proc"),
        ("/sys/fs/cgroup", "/sys"),
        ("/", "/usr/local/vgpu"),
    ],
)
def test_a_host_path_escape_has_the_whole_message(host: str, folder: str) -> None:
    pod = {"spec": {"volumes": [{"name": "h", "hostPath": {"path": host}}]}}
    assert _message(pod) == (
        f"volume 'h': hostPath {host!r} reaches {folder}, a node plugin's host folder or one that "
        "reaches it, where HAMi-core and every container's limits live: use an emptyDir or another "
        "volume type instead"
    )


def test_an_unnamed_host_path_volume_is_named_by_a_question_mark() -> None:
    pod = {"spec": {"volumes": [{"hostPath": {"path": "/proc"}}]}}
    assert _message(pod).startswith("volume '?': hostPath '/proc'")


def test_unreadable_volumes_are_skipped_not_the_ones_after_them() -> None:
    volumes: list[Any] = [
        "junk",
        {"name": "a", "hostPath": "x"},
        {"name": "b", "hostPath": {"path": 1}},
        {"name": "c"},
    ]
    volumes.append({"name": "d", "hostPath": {"path": "/srv"}})
    volumes.append({"name": "e", "hostPath": {"path": "/sys"}})
    assert _message({"spec": {"volumes": volumes}}).startswith("volume 'e'")


@pytest.mark.parametrize("hook", ["/opt/hami", "/var/lib/vgpu"])
def test_the_protected_paths_do_not_move_with_the_hook_path(hook: str) -> None:
    config = Config(node=NodeConfig(hook_path=hook))
    pod = _container_pod({"name": "c", "volumeMounts": [{"mountPath": "/tmp/vgpu"}]})
    assert f"(not at or under {PROTECTED})" in _message(pod, config)
    host = {"spec": {"volumes": [{"name": "h", "hostPath": {"path": hook + "/x"}}]}}
    assert f"reaches {hook}," in _message(host, config)


# --- volumes the kubelet writes through its atomic writer -----------------------------------------

_SWAPPED = ("configMap", "secret", "projected", "downwardAPI")


@pytest.mark.parametrize("kind", _SWAPPED)
@pytest.mark.parametrize(
    ("path", "below"),
    [
        ("/etc", "/etc/ld.so.preload"),
        ("//etc/", "/etc/ld.so.preload"),
        ("/usr/local", "/usr/local/vgpu"),
        ("/usr", "/usr/local/vgpu"),
        ("/", "/usr/local/vgpu"),
        ("/tmp", "/tmp/vgpu"),
    ],
)
def test_an_atomic_writer_volume_above_a_plugin_path_has_the_whole_message(
    kind: str, path: str, below: str
) -> None:
    pod = _container_pod(
        {
            "name": "c",
            "volumeMounts": [{"name": "w", "mountPath": "/data"}, {"name": "v", "mountPath": path}],
        },
        volumes=[{"name": "w", "emptyDir": {}}, "junk", {"name": "v", kind: {}}],
    )
    assert _message(pod) == (
        f"containers[c]: volumeMounts path {path!r} of 'v', a volume the kubelet updates by swapping "
        f"symlinks, lies above {below}, which the node plugin mounts to enforce the vGPU limits (an update "
        "would replace it): mount the volume at a folder that holds none of /usr/local/vgpu, "
        "/etc/ld.so.preload, /tmp/vgpu, /tmp/vgpulock (for example /etc/app, not /etc)"
    )


@pytest.mark.parametrize("kind", _SWAPPED)
@pytest.mark.parametrize(
    "path", ["/etc/app", "/et", "/usr/local/bin", "/usr/local/vgpux", "/tmp/vgpux", "/var/run"]
)
def test_an_atomic_writer_volume_beside_a_plugin_path_is_not_an_escape(kind: str, path: str) -> None:
    pod = _container_pod(
        {"name": "c", "volumeMounts": [{"name": "v", "mountPath": path}]}, volumes=[{"name": "v", kind: {}}]
    )
    assert find_escape(pod, Config()) is None


@pytest.mark.parametrize(
    "volume",
    [
        {"name": "v", "emptyDir": {}},
        {"name": "v", "hostPath": None},
        {"name": "v", "configMap": None},
        {"name": "w", "configMap": {}},
    ],
)
def test_other_volumes_above_a_plugin_path_keep_the_in_place_rule(volume: dict[str, Any]) -> None:
    pod = _container_pod(
        {"name": "c", "volumeMounts": [{"name": "v", "mountPath": "/etc"}]}, volumes=[volume]
    )
    assert find_escape(pod, Config()) is None


def test_an_unnamed_atomic_writer_volume_matches_no_mount() -> None:
    pod = _container_pod(
        {"name": "c", "volumeMounts": [{"name": "None", "mountPath": "/etc"}]},
        volumes=[{"name": None, "configMap": {}}, {"configMap": {}}],
    )
    assert find_escape(pod, Config()) is None


def test_an_atomic_writer_volume_is_found_by_name_in_every_container_group() -> None:
    pod = {
        "spec": {
            "volumes": [{"name": "cm", "configMap": {"name": "x"}}],
            "containers": [{"name": "app", "volumeMounts": [{"name": "cm", "mountPath": "/etc/app"}]}],
            "ephemeralContainers": [
                {"name": "dbg", "volumeMounts": [{"name": "cm", "mountPath": "/usr/local"}]}
            ],
        }
    }
    assert _message(pod).startswith("ephemeralContainers[dbg]: volumeMounts path '/usr/local' of 'cm'")


@pytest.mark.parametrize("name", ["PATH", "", "CUDA_DEVICE_MEMORY", "nvidia_visible_devices", "LD_AUDIT_"])
def test_a_name_no_rule_reserves_has_no_reason(name: str) -> None:
    assert reserved(name) is None


def test_a_reserved_name_or_prefix_has_its_reason() -> None:
    found = reserved("CUDA_DEVICE_MEMORY_LIMIT_7")
    assert found is not None and "GPU memory and core limits" in found.why
    assert reserved("NVIDIA_GDS") is not None and reserved("LD_AUDIT") is not None
    assert reachable_by_prefix("") is None


def test_the_container_list_given_is_the_one_checked() -> None:
    # `check_containers` hands over the list it built; the pod's own is not listed again.
    pod = _container_pod({"name": "c", "env": [{"name": "LD_AUDIT"}]})
    assert find_escape(pod, Config(), []) is None
    assert find_escape(pod, Config(), grouped_containers(pod)) is not None
