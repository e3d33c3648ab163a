"""`webhook.isolation` as plain function calls: how mount paths are resolved and compared."""

from __future__ import annotations

import pytest

from kube_vgpu.contract.config import Config, NodeConfig
from kube_vgpu.webhook.admission.isolation import covers, find_escape, host_overlaps, normalize


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


def test_the_configured_hook_path_is_protected_not_the_default() -> None:
    config = Config(node=NodeConfig(hook_path="/opt/hami"))
    pod = {
        "spec": {
            "containers": [
                {"name": "c", "volumeMounts": [{"name": "v", "mountPath": "/opt/hami/libvgpu.so"}]}
            ]
        }
    }
    escape = find_escape(pod, config)
    assert escape is not None and "/opt/hami" in escape.message()
    moved = {"spec": {"volumes": [{"name": "h", "hostPath": {"path": "/opt/hami"}}]}}
    assert find_escape(moved, config) is not None
    assert (
        find_escape({"spec": {"volumes": [{"name": "h", "hostPath": {"path": "/usr/local/vgpu"}}]}}, config)
        is None
    )


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
