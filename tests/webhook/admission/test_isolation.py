"""`webhook.isolation` as plain function calls: how mount paths are resolved and compared."""

from __future__ import annotations

import pytest

from kube_vgpu.contract.config import Config, NodeConfig
from kube_vgpu.contract.devices import DeviceRecord
from kube_vgpu.node.deviceplugin.hamicore import build_response
from kube_vgpu.webhook.admission.isolation import covers, find_escape, host_overlaps, normalize
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
