"""Every way a pod author tried to get around the rules (issue 11), through the real HTTPS webhook.

Each attempt goes the way the API server would send it: a CREATE through /mutate, then the name,
uid and creationTimestamp filled in, then /validate once (facts `apiserver-admission.md` §2); an
edit of a running pod as an UPDATE to /validate with `oldObject` and the writer's `userInfo`. Each
is refused with a message naming what was refused; the legitimate variants (a harmless env var or
volume, a label change by the author, a booking written by the scheduler's identity) still pass.
Quota-side ways in (charges, reinvocation, dry runs, stale caches): `test_webhook_bypass_quota.py`.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kube_vgpu.contract.config import Config, NodeConfig, WebhookConfig
from kube_vgpu.contract.names import (
    BIND_PHASE,
    CHARGED_GPU_MEMORY,
    DEVICES_TO_ALLOCATE,
    SCHEDULER_OWNED_ANNOTATIONS,
    USE_GPUTYPE,
    USE_GPUUUID,
    VGPU_IDS_NEW,
)
from kube_vgpu.standins.apiserver.admission_chain import admission_review, with_system_metadata
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from tests.support.webhook import gpu_uuid
from tests.support.webhook_bypass import (
    AUTHOR,
    BOOKING,
    NODE_PLUGIN,
    SCHEDULER,
    Cluster,
    gpu_pod,
    refused,
    running_pod,
    start,
)


@pytest.fixture
def cluster(apiserver: ApiServerStandin, tmp_path: Path) -> Iterator[Cluster]:
    made = start(apiserver, tmp_path)
    with made.webhook:
        yield made


# --- 1. no self-service exemption ---------------------------------------------------------------


def test_the_opt_out_label_on_a_pod_does_not_skip_quota(cluster: Cluster) -> None:
    first = cluster.create(gpu_pod("one-gpu", "a"))
    assert first["allowed"]
    opted = gpu_pod("one-gpu", "b")
    opted["metadata"]["labels"] = {"kube-vgpu.io/webhook": "ignore"}
    answer = cluster.create(opted)
    assert refused(answer, "one-gpu", "vgpu-number quota exceeded") and answer["phase"] == "validate"


def test_the_opt_out_label_on_a_pod_does_not_let_unparsable_limits_through(cluster: Cluster) -> None:
    opted = gpu_pod("one-gpu", memory="3Gi")
    opted["metadata"]["labels"] = {"kube-vgpu.io/webhook": "ignore"}
    assert refused(cluster.create(opted), "volcano.sh/vgpu-memory", "write 3072")


def test_the_opt_out_label_on_a_pod_does_not_let_a_forged_booking_through(cluster: Cluster) -> None:
    opted = gpu_pod()
    opted["metadata"]["labels"] = {"kube-vgpu.io/webhook": "ignore"}
    opted["metadata"]["annotations"] = {VGPU_IDS_NEW: BOOKING}
    assert refused(cluster.create(opted), VGPU_IDS_NEW, "remove them")


def test_unparsable_limits_are_refused_by_validation_too(cluster: Cluster) -> None:
    # As if the mutating phase were skipped (an outage under failurePolicy Ignore elsewhere).
    final = with_system_metadata(gpu_pod("one-gpu", memory="lots"))
    answer = cluster.call("/validate", admission_review(final, username=AUTHOR))
    assert refused(answer, "volcano.sh/vgpu-memory", "'lots'")


# --- 2. scheduler-owned annotations -------------------------------------------------------------


@pytest.mark.parametrize("key", SCHEDULER_OWNED_ANNOTATIONS)
def test_a_new_pod_carrying_a_scheduler_annotation_is_refused(cluster: Cluster, key: str) -> None:
    forged = gpu_pod()
    forged["metadata"]["annotations"] = {key: "x"}
    answer = cluster.create(forged)
    assert refused(answer, key, "written by the scheduler", "remove them")


@pytest.mark.parametrize(
    ("key", "old", "new"),
    [
        (VGPU_IDS_NEW, BOOKING, "GPU-0000,NVIDIA,1,0:;"),  # annotate --overwrite down to 1 MiB
        (DEVICES_TO_ALLOCATE, BOOKING, "GPU-0000,NVIDIA,81920,0:;"),  # edited before Allocate
        (BIND_PHASE, "allocating", None),  # removed
        (VGPU_IDS_NEW, None, BOOKING),  # added
    ],
)
def test_an_author_editing_a_booking_is_refused(
    cluster: Cluster, key: str, old: str | None, new: str | None
) -> None:
    before = running_pod(cluster, {key: old} if old is not None else {})
    after = copy.deepcopy(before)
    if new is None:
        del after["metadata"]["annotations"][key]
    else:
        after["metadata"]["annotations"][key] = new
    answer = cluster.update(before, after, AUTHOR)
    assert refused(answer, key, AUTHOR, "may not add, change or remove", "webhook.annotationWriters")


def test_the_scheduler_and_the_node_plugin_may_write_the_booking(cluster: Cluster) -> None:
    before = running_pod(cluster, {})
    booked = copy.deepcopy(before)
    booked["metadata"]["annotations"] |= {VGPU_IDS_NEW: BOOKING, DEVICES_TO_ALLOCATE: BOOKING}
    assert cluster.update(before, booked, SCHEDULER)["allowed"]
    consumed = copy.deepcopy(booked)
    consumed["metadata"]["annotations"] |= {DEVICES_TO_ALLOCATE: ";", BIND_PHASE: "success"}
    assert cluster.update(booked, consumed, NODE_PLUGIN)["allowed"]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("volcano.sh/vgpu-mode", "mig"),  # re-declared: a later replica would size it afresh
        ("nvidia.com/vgpu-mode", "mig"),
        ("nvidia.com/use-gputype", "T4"),  # a percentage re-sized against a smaller card
        ("volcano.sh/vgpu-use-gpuuuid", "GPU-other"),
        ("nvidia.com/nouse-gpuuuid", "GPU-other"),
    ],
)
def test_an_author_cannot_change_the_annotations_that_set_the_charge(
    cluster: Cluster, key: str, value: str
) -> None:
    # Quota sizes a pod from its mode and selectors; a replica that starts later reads them afresh,
    # so editing them after admission would re-price the pod.
    before = running_pod(cluster, {})
    after = copy.deepcopy(before)
    after["metadata"]["annotations"][key] = value
    assert refused(cluster.update(before, after, AUTHOR), key, "fixed when the pod is created")
    assert cluster.update(before, after, SCHEDULER)["allowed"]  # the configured writers may


def test_an_author_relabelling_or_annotating_their_pod_is_allowed(cluster: Cluster) -> None:
    before = running_pod(cluster, {VGPU_IDS_NEW: BOOKING})
    after = copy.deepcopy(before)
    after["metadata"]["labels"] = {"team": "vision"}
    after["metadata"]["annotations"]["example.com/owner"] = "alice"
    assert cluster.update(before, after, AUTHOR)["allowed"]


# --- 3. isolation escapes -----------------------------------------------------------------------

ESCAPE_ENV = [
    "CUDA_DEVICE_MEMORY_LIMIT",
    "CUDA_DEVICE_MEMORY_LIMIT_0",
    "CUDA_DEVICE_MEMORY_LIMIT_7",
    "CUDA_DEVICE_SM_LIMIT",
    "CUDA_DEVICE_SM_LIMIT_0",
    "CUDA_DEVICE_MEMORY_SHARED_CACHE",
    "CUDA_DISABLE_CONTROL",
    "CUDA_OVERSUBSCRIBE",
    "GPU_CORE_UTILIZATION_POLICY",
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "NVIDIA_MIG_CONFIG_DEVICES",
    "NVIDIA_MIG_MONITOR_DEVICES",
    "LD_PRELOAD",
    # The NVIDIA container toolkit's other device-granting variables, and the loader's audit hook.
    "NVIDIA_IMEX_CHANNELS",
    "NVIDIA_GDRCOPY",
    "NVIDIA_NVSWITCH",
    "NVIDIA_GDS",
    "NVIDIA_MOFED",
    "NVIDIA_ALLOW_ADDITIONAL_GIDS",
    "LD_AUDIT",
]


@pytest.mark.parametrize("name", ESCAPE_ENV)
def test_setting_a_limit_variable_is_refused(cluster: Cluster, name: str) -> None:
    escaping = gpu_pod()
    escaping["spec"]["containers"][0]["env"] = [
        {"name": "HOME", "value": "/x"},
        {"name": name, "value": "all"},
    ]
    assert refused(cluster.create(escaping), f"env {name}", "remove it from env")


def test_a_sidecar_or_init_container_setting_them_is_refused_too(cluster: Cluster) -> None:
    sidecar = gpu_pod()
    sidecar["spec"]["containers"].append(
        {"name": "side", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}
    )
    assert refused(cluster.create(sidecar), "containers[side]", "NVIDIA_VISIBLE_DEVICES")
    init = gpu_pod()
    init["spec"]["initContainers"] = [{"name": "warm", "env": [{"name": "LD_PRELOAD", "value": "/x.so"}]}]
    assert refused(cluster.create(init), "initContainers[warm]", "LD_PRELOAD")


@pytest.mark.parametrize("name", ESCAPE_ENV)
def test_a_limit_variable_taken_from_a_config_map_is_refused(cluster: Cluster, name: str) -> None:
    escaping = gpu_pod()
    escaping["spec"]["containers"][0]["env"] = [
        {"name": name, "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}}
    ]
    assert refused(cluster.create(escaping), f"env {name}", "remove it from env")


@pytest.mark.parametrize(
    "prefix", ["NVIDIA_", "NVIDIA_IMEX_", "LD_", "CUDA_DEVICE_MEMORY_LIMIT_", "CUDA_DEVICE_"]
)
def test_an_env_from_prefix_that_can_produce_a_limit_variable_is_refused(
    cluster: Cluster, prefix: str
) -> None:
    escaping = gpu_pod()
    escaping["spec"]["containers"][0]["envFrom"] = [{"prefix": prefix, "configMapRef": {"name": "cm"}}]
    assert refused(cluster.create(escaping), f"envFrom prefix {prefix!r}", "use a prefix")


@pytest.mark.parametrize("prefix", ["APP_", "NVIDIA_IMEX_CHANNELS", "LD_AUDIT", "nvidia_", "CUDA_VISIBLE_"])
def test_an_env_from_prefix_one_step_away_is_allowed(cluster: Cluster, prefix: str) -> None:
    # The kubelet appends a non-empty key, so a whole name as the prefix produces only longer names.
    harmless = gpu_pod()
    harmless["spec"]["containers"][0]["envFrom"] = [{"prefix": prefix, "configMapRef": {"name": "cm"}}]
    assert cluster.create(harmless)["allowed"]


@pytest.mark.parametrize(
    "name",
    [
        "CUDA_VISIBLE_DEVICES_NOT",
        "ld_preload",
        "MY_CUDA_DISABLE_CONTROL",
        "PYTHONPATH",
        # The toolkit looks names up exactly, case included.
        "NVIDIA_IMEX_CHANNELSX",
        "nvidia_imex_channels",
        "NVIDIA_GDRCOPY_",
        "LD_AUDITX",
        "NVIDIA_REQUIRE_CUDA",
        "NVIDIA_DISABLE_REQUIRE",
    ],
)
def test_harmless_variables_are_allowed(cluster: Cluster, name: str) -> None:
    harmless = gpu_pod()
    harmless["spec"]["containers"][0]["env"] = [{"name": name, "value": "1"}]
    assert cluster.create(harmless)["allowed"]


@pytest.mark.parametrize(
    "path",
    [
        "/etc/ld.so.preload",
        "/etc/ld.so.preload/",
        "//etc/ld.so.preload",
        "/etc/./ld.so.preload",
        "/etc/../etc/ld.so.preload",
        "/tmp/x/../../etc/ld.so.preload",
        "etc/ld.so.preload",
        "/usr/local/vgpu",
        "/usr/local/vgpu/libvgpu.so",
        "/usr/local/vgpu//",
        "/tmp/vgpu",
        "/tmp/vgpu/cache",
        "/tmp/vgpulock",
        "/tmp/vgpulock/lock0",
    ],
)
def test_mounting_over_a_path_the_node_plugin_mounts_is_refused(cluster: Cluster, path: str) -> None:
    escaping = gpu_pod()
    escaping["spec"]["volumes"] = [{"name": "v", "emptyDir": {}}]
    escaping["spec"]["containers"][0]["volumeMounts"] = [{"name": "v", "mountPath": path}]
    assert refused(cluster.create(escaping), f"volumeMounts path {path!r}", "mount the volume elsewhere")


def test_a_block_device_at_the_preload_path_is_refused(cluster: Cluster) -> None:
    escaping = gpu_pod()
    escaping["spec"]["volumes"] = [{"name": "v", "persistentVolumeClaim": {"claimName": "c"}}]
    escaping["spec"]["containers"][0]["volumeDevices"] = [{"name": "v", "devicePath": "/etc/ld.so.preload"}]
    assert refused(cluster.create(escaping), "volumeDevices path", "/etc/ld.so.preload")


@pytest.mark.parametrize(
    "path", ["/tmp", "/etc", "/etc/app", "/tmp/vgpufoo", "/usr/local", "/data", "/usr/local/vgpux"]
)
def test_harmless_mounts_are_allowed(cluster: Cluster, path: str) -> None:
    # (An emptyDir is written in place; atomic-writer volumes are the next tests.)
    # A parent folder is fine: the plugin's own, deeper bind mounts land on top of it.
    harmless = gpu_pod()
    harmless["spec"]["volumes"] = [{"name": "v", "emptyDir": {}}]
    harmless["spec"]["containers"][0]["volumeMounts"] = [{"name": "v", "mountPath": path}]
    assert cluster.create(harmless)["allowed"]


_SWAPPED_VOLUMES = [
    {"configMap": {"name": "cm", "items": [{"key": "k", "path": "ld.so.preload"}]}},
    {"secret": {"secretName": "s"}},
    {"projected": {"sources": [{"configMap": {"name": "cm"}}]}},
    {"downwardAPI": {"items": [{"path": "vgpu/libvgpu.so", "fieldRef": {"fieldPath": "metadata.name"}}]}},
]


@pytest.mark.parametrize("volume", _SWAPPED_VOLUMES)
@pytest.mark.parametrize(
    ("path", "below"),
    [
        ("/etc", "/etc/ld.so.preload"),
        ("/usr/local", "/usr/local/vgpu"),
        ("/", "/usr/local/vgpu"),
        ("/tmp/", "/tmp/vgpu"),
    ],
)
def test_an_atomic_writer_volume_above_a_plugin_path_is_refused(
    cluster: Cluster, volume: dict[str, Any], path: str, below: str
) -> None:
    # The kubelet swaps the volume's `..data` link on every update, replacing the file the plugin's
    # bind mount landed on.
    escaping = gpu_pod()
    escaping["spec"]["volumes"] = [{"name": "v", **volume}]
    escaping["spec"]["containers"][0]["volumeMounts"] = [{"name": "v", "mountPath": path}]
    assert refused(cluster.create(escaping), f"volumeMounts path {path!r} of 'v'", f"lies above {below}")


@pytest.mark.parametrize("volume", _SWAPPED_VOLUMES)
@pytest.mark.parametrize("path", ["/etc/app", "/usr/local/bin", "/usr/local/vgpux", "/tmp/vgpux", "/data"])
def test_an_atomic_writer_volume_at_a_sibling_path_is_allowed(
    cluster: Cluster, volume: dict[str, Any], path: str
) -> None:
    harmless = gpu_pod()
    harmless["spec"]["volumes"] = [{"name": "v", **volume}]
    harmless["spec"]["containers"][0]["volumeMounts"] = [{"name": "v", "mountPath": path}]
    assert cluster.create(harmless)["allowed"]


@pytest.mark.parametrize(
    "host",
    [
        "/usr/local/vgpu",
        "/usr/local/vgpu/",
        "/usr/local",
        "/",
        "/usr/local/vgpu/vgpu/containers",
        "/tmp/vgpulock",
        "/tmp",
        "/proc/1/cwd/usr/local/vgpu",  # the host's files through PID 1's working folder
        "/proc",
        "/sys/fs/cgroup",
        "/var/lib/kubelet/device-plugins",  # the plugin's and the kubelet's sockets
        "/var/lib/kubelet",
    ],
)
def test_a_host_path_reaching_the_node_plugins_folders_is_refused(cluster: Cluster, host: str) -> None:
    escaping = gpu_pod()
    escaping["spec"]["volumes"] = [{"name": "hook", "hostPath": {"path": host}}]
    escaping["spec"]["containers"][0]["volumeMounts"] = [{"name": "hook", "mountPath": "/mnt/h"}]
    assert refused(cluster.create(escaping), f"hostPath {host!r}", "node plugin's host folder")


def test_an_unrelated_host_path_is_not_this_webhooks_business(cluster: Cluster) -> None:
    # Pod Security `baseline` is what forbids hostPath in tenant namespaces (docs/security.md).
    other = gpu_pod()
    other["spec"]["volumes"] = [{"name": "data", "hostPath": {"path": "/srv/datasets"}}]
    assert cluster.create(other)["allowed"]


def test_privileged_and_hand_placed_vgpu_pods_are_refused(cluster: Cluster) -> None:
    privileged = gpu_pod()
    privileged["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    assert refused(cluster.create(privileged), "privileged", "remove securityContext.privileged")
    placed = gpu_pod()
    placed["spec"]["nodeName"] = "a100"
    assert refused(cluster.create(placed), "spec.nodeName", "nodeSelector")


def test_a_debug_container_setting_a_limit_variable_is_refused(cluster: Cluster) -> None:
    running = running_pod(cluster, {})

    def debug(env: list[dict[str, str]]) -> dict[str, Any]:
        debugged = copy.deepcopy(running)
        debugged["spec"]["ephemeralContainers"] = [{"name": "debug", "image": "busybox", "env": env}]
        review = admission_review(debugged, operation="UPDATE", old=running, username=AUTHOR)
        review["request"]["subResource"] = "ephemeralcontainers"
        return cluster.call("/validate", review)

    answer = debug([{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])
    assert refused(answer, "ephemeralContainers[debug]", "env NVIDIA_VISIBLE_DEVICES")
    assert debug([{"name": "TERM", "value": "xterm"}])["allowed"]


# --- 4. issue 22: debug containers, the library path, the NVIDIA runtime's device list ----------


def _debug(cluster: Cluster, debug_container: dict[str, Any]) -> dict[str, Any]:
    """`kubectl debug` on a running vGPU pod: an UPDATE of pods/ephemeralcontainers to /validate."""
    running = running_pod(cluster, {})
    debugged = copy.deepcopy(running)
    debugged["spec"]["ephemeralContainers"] = [{"name": "debug", "image": "busybox", **debug_container}]
    review = admission_review(debugged, operation="UPDATE", old=running, username=AUTHOR)
    review["request"]["subResource"] = "ephemeralcontainers"
    return cluster.call("/validate", review)


@pytest.mark.parametrize(
    ("security", "words"),
    [
        ({"privileged": True}, ("privileged", "remove securityContext.privileged")),
        ({"capabilities": {"add": ["SYS_ADMIN"]}}, ("SYS_ADMIN", "capabilities.add")),
        ({"capabilities": {"add": ["ALL"]}}, ("ALL", "capabilities.add")),
        ({"capabilities": {"add": ["NET_RAW", "CAP_SYS_ADMIN"]}}, ("CAP_SYS_ADMIN",)),
        ({"capabilities": {"add": ["all"]}}, ("all", "capabilities.add")),
    ],
)
def test_a_privileged_debug_container_is_refused(
    cluster: Cluster, security: dict[str, Any], words: tuple[str, ...]
) -> None:
    answer = _debug(cluster, {"securityContext": security})
    assert refused(answer, "'debug'", *words)
    assert answer["status"]["message"].startswith("container 'debug'")


def test_a_debug_container_with_harmless_security_settings_is_allowed(cluster: Cluster) -> None:
    # Other capabilities and a non-root user are Pod Security's business, as at CREATE.
    allowed = {"securityContext": {"privileged": False, "capabilities": {"add": ["NET_RAW", "SYS_PTRACE"]}}}
    assert _debug(cluster, allowed)["allowed"]


def test_a_debug_container_mounting_over_the_device_list_is_refused(cluster: Cluster) -> None:
    mount = {"volumeMounts": [{"name": "v", "mountPath": "/var/run/nvidia-container-devices/all"}]}
    assert refused(_debug(cluster, mount), "ephemeralContainers[debug]", "NVIDIA container runtime")


def test_a_privileged_debug_container_is_allowed_when_deny_privileged_is_off(
    apiserver: ApiServerStandin, tmp_path: Path
) -> None:
    # The same switch as at CREATE: one code path, one setting.
    config = Config(webhook=WebhookConfig(annotation_writers=(SCHEDULER, NODE_PLUGIN), deny_privileged=False))
    made = start(apiserver, tmp_path, config)
    with made.webhook:
        assert _debug(made, {"securityContext": {"privileged": True}})["allowed"]


@pytest.fixture
def moved_hook(apiserver: ApiServerStandin, tmp_path: Path) -> Iterator[Cluster]:
    """A cluster whose node plugin serves HAMi-core from another HOST folder (`node.hookPath`)."""
    config = Config(
        webhook=WebhookConfig(annotation_writers=(SCHEDULER, NODE_PLUGIN)),
        node=NodeConfig(hook_path="/var/lib/vgpu"),
    )
    made = start(apiserver, tmp_path, config)
    with made.webhook:
        yield made


@pytest.mark.parametrize(
    ("volume", "mount"),
    [
        ({"emptyDir": {}}, {"mountPath": "/usr/local/vgpu/libvgpu.so"}),
        (
            {"configMap": {"name": "fake-lib"}},
            {"mountPath": "/usr/local/vgpu/libvgpu.so", "subPath": "libvgpu.so"},
        ),
        ({"emptyDir": {}}, {"mountPath": "/usr/local/vgpu"}),
        ({"emptyDir": {}}, {"mountPath": "/usr/local//vgpu/./libvgpu.so"}),
        ({"emptyDir": {}}, {"mountPath": "/etc/ld.so.preload", "subPath": "empty"}),
        ({"emptyDir": {}}, {"mountPath": "/tmp/vgpu"}),
    ],
)
def test_the_library_path_is_protected_whatever_the_hook_path(
    moved_hook: Cluster, volume: dict[str, Any], mount: dict[str, Any]
) -> None:
    escaping = gpu_pod()
    escaping["spec"]["volumes"] = [{"name": "v", **volume}]
    escaping["spec"]["containers"][0]["volumeMounts"] = [{"name": "v", **mount}]
    answer = moved_hook.create(escaping)
    assert refused(answer, f"volumeMounts path {mount['mountPath']!r}", "which the node plugin mounts")


@pytest.mark.parametrize(
    "host", ["/var/lib/vgpu", "/var/lib/vgpu/vgpu/containers", "/var/lib", "/tmp/vgpulock"]
)
def test_the_moved_host_folder_is_still_refused_as_a_host_path(moved_hook: Cluster, host: str) -> None:
    escaping = gpu_pod()
    escaping["spec"]["volumes"] = [{"name": "hook", "hostPath": {"path": host}}]
    escaping["spec"]["containers"][0]["volumeMounts"] = [{"name": "hook", "mountPath": "/mnt/h"}]
    assert refused(moved_hook.create(escaping), f"hostPath {host!r}", "node plugin's host folder")


def test_the_hook_paths_name_inside_a_container_is_an_ordinary_path(moved_hook: Cluster) -> None:
    # /var/lib/vgpu is a HOST folder: a container's own emptyDir there replaces nothing.
    harmless = gpu_pod()
    harmless["spec"]["volumes"] = [{"name": "v", "emptyDir": {}}]
    harmless["spec"]["containers"][0]["volumeMounts"] = [{"name": "v", "mountPath": "/var/lib/vgpu"}]
    assert moved_hook.create(harmless)["allowed"]


@pytest.mark.parametrize(
    "path",
    [
        "/var/run/nvidia-container-devices/all",
        "/var/run/nvidia-container-devices/GPU-0000",
        "/var/run/nvidia-container-devices",
        "/var/run//nvidia-container-devices/./all",
        "/var/run/x/../nvidia-container-devices/0",
        "/var/run/nvidia-container-devicesall",  # the runtime matches by plain prefix
    ],
)
def test_a_mount_in_the_nvidia_device_list_is_refused(cluster: Cluster, path: str) -> None:
    escaping = gpu_pod()
    escaping["spec"]["volumes"] = [{"name": "null", "hostPath": {"path": "/dev/null"}}]
    escaping["spec"]["containers"].append(
        {"name": "side", "image": "busybox", "volumeMounts": [{"name": "null", "mountPath": path}]}
    )
    answer = cluster.create(escaping)
    assert refused(
        answer, "containers[side]", f"{path!r}", "NVIDIA container runtime", "mount the volume elsewhere"
    )


@pytest.mark.parametrize("path", ["/var/run", "/var/run/secrets/app", "/var/run/nvidia-container"])
def test_mounts_beside_the_nvidia_device_list_are_allowed(cluster: Cluster, path: str) -> None:
    harmless = gpu_pod()
    harmless["spec"]["volumes"] = [{"name": "v", "emptyDir": {}}]
    harmless["spec"]["containers"][0]["volumeMounts"] = [{"name": "v", "mountPath": path}]
    assert cluster.create(harmless)["allowed"]


# --- 5. issue 22: pods that cost everyone ------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "words"),
    [
        ("containers", ("20000 containers", "the limit is 256 (webhook.maxContainers)")),
        ("volumes", ("spec.volumes has 40000 volumes", "the limit is 1024 (webhook.maxVolumes)")),
    ],
)
def test_a_dry_run_pod_too_large_to_review_cheaply_is_refused_by_both_phases(
    cluster: Cluster, shape: str, words: tuple[str, ...]
) -> None:
    # Issue 22's pods: legal, 1.5-2.3 MiB, and dry runs never reach the API server's size limit.
    heavy = gpu_pod()
    if shape == "containers":
        each = heavy["spec"]["containers"][0]
        heavy["spec"]["containers"] = [{**each, "name": f"c{i}"} for i in range(20_000)]
    else:
        heavy["spec"]["volumes"] = [
            {"name": f"h{i}", "hostPath": {"path": f"/srv/{i}"}} for i in range(40_000)
        ]
    for path in ("/mutate", "/validate"):
        answer = cluster.call(
            path, admission_review(with_system_metadata(heavy), username=AUTHOR, dry_run=True)
        )
        assert refused(answer, *words)


# --- a share of a card is charged on a GPU it cannot outgrow -------------------------------------


def _share(namespace: str, annotations: dict[str, str] | None = None, **amounts: Any) -> dict[str, Any]:
    made = gpu_pod(namespace, "share", **amounts)
    if annotations:
        made["metadata"]["annotations"] = dict(annotations)
    return made


@pytest.mark.parametrize("amounts", [{"percent": 30}, {"number": 1}, {"percent": 30, "cores": 10}])
def test_a_share_of_a_card_with_no_type_choice_is_refused_under_a_memory_quota(
    cluster: Cluster, amounts: dict[str, Any]
) -> None:
    # Charged on today's largest GPU (40960 MiB), it could be booked on a larger one joining later.
    answer = cluster.create(_share("mem-15000", **amounts))
    assert answer["phase"] == "mutate"
    assert refused(
        answer,
        "namespace mem-15000 has a GPU memory quota and container 'main' asks for a share",
        "state the memory in MiB (volcano.sh/vgpu-memory)",
        "nvidia.com/use-gputype",
    )


@pytest.mark.parametrize("namespace", ["free", "one-gpu"])
def test_a_share_of_a_card_without_a_memory_quota_is_admitted_and_records_nothing(
    cluster: Cluster, namespace: str
) -> None:
    forged = {CHARGED_GPU_MEMORY: "999999"}
    answer = cluster.create(_share(namespace, forged, percent=30))
    assert answer["allowed"]
    assert CHARGED_GPU_MEMORY not in answer["pod"]["metadata"]["annotations"]


@pytest.mark.parametrize(
    "annotations",
    [
        {USE_GPUTYPE: "A100"},
        {USE_GPUTYPE: "A100", CHARGED_GPU_MEMORY: "999999"},
        {USE_GPUTYPE: "A100", CHARGED_GPU_MEMORY: "1"},
        {USE_GPUUUID: gpu_uuid("a100", 0)},
    ],
)
def test_a_share_of_a_card_with_a_type_choice_records_its_charge_whatever_the_author_wrote(
    cluster: Cluster, annotations: dict[str, str]
) -> None:
    # Reinvoked, the mutation finds its own figure and patches nothing (create asserts it).
    answer = cluster.create(_share("mem-15000", annotations, percent=30), reinvoke=1)
    assert answer["allowed"], answer
    assert answer["pod"]["metadata"]["annotations"][CHARGED_GPU_MEMORY] == "40960"


def test_an_explicit_memory_records_nothing(cluster: Cluster) -> None:
    answer = cluster.create(_share("mem-15000", {CHARGED_GPU_MEMORY: "999999"}, memory=10000))
    assert answer["allowed"]
    assert CHARGED_GPU_MEMORY not in answer["pod"]["metadata"]["annotations"]


def test_the_recorded_charge_cannot_be_changed_or_removed_by_the_author(cluster: Cluster) -> None:
    admitted = cluster.create(_share("mem-15000", {USE_GPUTYPE: "A100"}, percent=30))
    assert admitted["allowed"]
    old = admitted["pod"]
    for value in ("81920", None):
        new = copy.deepcopy(old)
        if value is None:
            del new["metadata"]["annotations"][CHARGED_GPU_MEMORY]
        else:
            new["metadata"]["annotations"][CHARGED_GPU_MEMORY] = value
        assert refused(cluster.update(old, new, AUTHOR), CHARGED_GPU_MEMORY, "fixed when the pod is created")
        assert cluster.update(old, new, NODE_PLUGIN)["allowed"]
