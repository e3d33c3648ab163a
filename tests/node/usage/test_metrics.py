"""Usage metrics: what NVML says the GPUs and each container's processes are doing, with
every process mapped to its pod and container through its cgroup and the pod's container statuses."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pynvml
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.node.deviceplugin.bookings import Ledger
from kube_vgpu.node.metrics import Metrics
from kube_vgpu.node.nvml.gpus import discover
from kube_vgpu.node.nvml.inventory import LiveGpus
from kube_vgpu.node.usage.metrics import UsageSampler
from kube_vgpu.node.usage.sample import read_usage
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.standins.nvml.api import SimProcess, SimulatedNvml, SimulationError, load_simulation
from tests.support.node import (
    UUID_A,
    UUID_B,
    node_object,
    one_gpu_pod,
    running_plugin,
    short_tempdir,
    simulation,
)
from tests.support.timeouts import HANG_S

NODE = "gpu-node-1"
MIB = 1 << 20
UID_A = "5f0c3a1e-8b2d-4c6f-9a7e-1d2b3c4d5e6f"
UID_B = "0a1b2c3d-4e5f-4061-8293-a4b5c6d7e8f9"
UID_GONE = "99999999-8888-4777-8666-555555555555"
CID_A = "a" * 63 + "1"
CID_A_SIDE = "a" * 63 + "2"
CID_B = "b" * 64
CID_GONE = "c" * 64


def systemd_cgroup(uid: str, cid: str) -> str:
    slice_ = f"kubepods-burstable-pod{uid.replace('-', '_')}.slice"
    return f"0::/kubepods.slice/kubepods-burstable.slice/{slice_}/cri-containerd-{cid}.scope\n"


def pod(namespace: str, name: str, uid: str, containers: dict[str, str], runtime: str) -> dict[str, Any]:
    return {
        "metadata": {"namespace": namespace, "name": name, "uid": uid},
        "spec": {"nodeName": NODE},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {"name": c, "containerID": f"{runtime}://{cid}"} for c, cid in containers.items()
            ],
        },
    }


PODS = [
    pod("team-a", "train", UID_A, {"trainer": CID_A, "sidecar": CID_A_SIDE}, "containerd"),
    pod("team-b", "infer", UID_B, {"server": CID_B}, "cri-o"),
]


def process(gpu: int, pid: int, mib: int, util: int | None, cgroup: str) -> dict[str, Any]:
    entry = {"gpu": gpu, "pid": pid, "usedMemoryMiB": mib, "smUtilPercent": util, "cgroup": cgroup}
    return {k: v for k, v in entry.items() if v is not None}


TRAINER = systemd_cgroup(UID_A, CID_A)
HAMI_SIMULATION = {
    "gpus": [{"model": "NVIDIA A100-SXM4-80GB", "count": 2}],
    "processes": [
        # team-a/train's trainer: two processes on GPU 0, one on GPU 1
        process(0, 100, 2048, 35, TRAINER),
        process(0, 101, 1024, 10, TRAINER),
        process(1, 102, 512, 5, TRAINER),
        # team-b/infer's server, cgroup v1 with the cgroupfs driver
        process(0, 200, 4096, 20, f"5:memory:/kubepods/besteffort/pod{UID_B}/crio-{CID_B}\n"),
        # a host process, and a container of a pod this node does not list
        process(1, 300, 8192, 50, "0::/user.slice/user-0.slice/session-1.scope\n"),
        process(1, 400, 256, None, systemd_cgroup(UID_GONE, CID_GONE)),
    ],
}


def started(simulation: dict[str, Any]) -> Iterator[SimulatedNvml]:
    nvml = load_simulation(simulation, NODE)
    nvml.nvmlInit()
    yield nvml
    nvml.nvmlShutdown()


@pytest.fixture
def hami() -> Iterator[SimulatedNvml]:
    yield from started(HAMI_SIMULATION)


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(nvml: SimulatedNvml, pods: list[dict[str, Any]], read_cgroup: Any = None) -> Samples:
    """Render the node plugin's registry after one usage refresh, as Prometheus would parse it."""
    gpus = discover(nvml)
    sampler = UsageSampler(nvml, gpus, NODE, read_cgroup or nvml.process_cgroup)
    sampler.pods_seen(pods)
    sampler.refresh()
    metrics = Metrics(LiveGpus(gpus, 10, NODE), Ledger(gpus, 10, ResourceNames(), NODE), sampler)
    text = metrics.render().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def series(samples: Samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: value for (metric, labels), value in samples.items() if metric == name}


def container(namespace: str, pod_name: str, name: str, gpu: str) -> tuple[tuple[str, str], ...]:
    labels = {"node": NODE, "namespace": namespace, "pod": pod_name, "container": name, "gpu": gpu}
    return tuple(sorted(labels.items()))


def gpu_labels(uuid: str) -> tuple[tuple[str, str], ...]:
    return (("gpu", uuid), ("node", NODE))


def test_two_pods_and_a_host_process_per_container_and_per_gpu(hami: SimulatedNvml) -> None:
    hami.set_utilization(0, 70, 40)
    hami.set_utilization(1, 15, 5)
    gpu0, gpu1 = (g.uuid for g in discover(hami))
    samples = scrape(hami, PODS)

    # Every process counts on its GPU, those Kubernetes does not know included.
    assert series(samples, "kube_vgpu_gpu_memory_used_mib") == {
        gpu_labels(gpu0): 2048 + 1024 + 4096,
        gpu_labels(gpu1): 512 + 8192 + 256,
    }
    assert series(samples, "kube_vgpu_gpu_utilization_percent") == {
        gpu_labels(gpu0): 70,
        gpu_labels(gpu1): 15,
    }
    # Containers get their own processes only, summed per GPU; the sidecar runs nothing on a GPU.
    assert series(samples, "kube_vgpu_container_memory_used_mib") == {
        container("team-a", "train", "trainer", gpu0): 3072,
        container("team-a", "train", "trainer", gpu1): 512,
        container("team-b", "infer", "server", gpu0): 4096,
    }
    assert series(samples, "kube_vgpu_container_sm_utilization_percent") == {
        container("team-a", "train", "trainer", gpu0): 45,
        container("team-a", "train", "trainer", gpu1): 5,
        container("team-b", "infer", "server", gpu0): 20,
    }


def test_a_pod_whose_container_status_is_not_written_yet_counts_on_its_gpu_only(hami: SimulatedNvml) -> None:
    without_status = [PODS[0], {**PODS[1], "status": {"phase": "Pending"}}]
    samples = series(scrape(hami, without_status), "kube_vgpu_container_memory_used_mib")
    assert {dict(labels)["pod"] for labels in samples} == {"train"}
    assert sum(series(scrape(hami, without_status), "kube_vgpu_gpu_memory_used_mib").values()) == 16128


def test_processes_nvml_reports_without_memory_or_samples_count_as_zero(hami: SimulatedNvml) -> None:
    hami.set_processes(0, [])
    hami.set_processes(1, [])
    gpu1 = discover(hami)[1].uuid
    hami.set_processes(1, [SimProcess(pid=100, used_bytes=None, cgroup=systemd_cgroup(UID_A, CID_A))])
    samples = scrape(hami, PODS)
    key = container("team-a", "train", "trainer", gpu1)
    assert series(samples, "kube_vgpu_container_memory_used_mib") == {key: 0}
    # NVML has no utilisation sample for it: NotFound, read as idle
    assert series(samples, "kube_vgpu_container_sm_utilization_percent") == {key: 0}


MIG_SIMULATION = {
    "gpus": [
        {
            "model": "NVIDIA H100 80GB HBM3",
            "migCapable": True,
            "migEnabled": True,
            "migInstances": ["3g.40gb", "1g.10gb"],
        }
    ],
    "processes": [
        {"gpu": 0, "mig": 2, "pid": 100, "usedMemoryMiB": 30000, "cgroup": systemd_cgroup(UID_A, CID_A)},
        {"gpu": 0, "mig": 10, "pid": 200, "usedMemoryMiB": 9000, "cgroup": systemd_cgroup(UID_B, CID_B)},
        {"gpu": 0, "mig": 10, "pid": 300, "usedMemoryMiB": 500, "cgroup": "0::/system.slice/x.service\n"},
    ],
}


def test_mig_processes_are_read_per_mig_device_and_carry_memory_only() -> None:
    for nvml in started(MIG_SIMULATION):
        gpu = nvml.nvmlDeviceGetHandleByIndex(0)
        mig_ids = set()
        for index in range(nvml.nvmlDeviceGetMaxMigDeviceCount(gpu)):
            try:
                device = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, index)
            except pynvml.NVMLError_NotFound:
                continue
            mig_ids.add(nvml.nvmlDeviceGetGpuInstanceId(device))
        assert mig_ids == {2, 10}  # the GPU instances the file's `mig:` keys name
        uuid = discover(nvml)[0].uuid
        samples = scrape(nvml, PODS)
        assert series(samples, "kube_vgpu_gpu_memory_used_mib") == {gpu_labels(uuid): 39500}
        assert series(samples, "kube_vgpu_gpu_utilization_percent") == {}  # NVML: NotSupported in MIG mode
        assert series(samples, "kube_vgpu_container_memory_used_mib") == {
            container("team-a", "train", "trainer", uuid): 30000,
            container("team-b", "infer", "server", uuid): 9000,
        }
        assert series(samples, "kube_vgpu_container_sm_utilization_percent") == {}


@pytest.mark.parametrize(
    "text",
    [
        "\x00" * 100,
        "0::/" + "kubepods-pod" * 50_000,
        "0::/kubepods.slice/kubepods-podzzz.slice/cri-containerd-" + "g" * 64 + ".scope",
        "0::/kubepods.slice/kubepods-pod" + UID_A.replace("-", "_") + ".slice/runc-" + CID_A + ".scope",
        "9" * 1_000_000,
    ],
)
def test_hostile_cgroup_texts_never_break_the_metrics(hami: SimulatedNvml, text: str) -> None:
    samples = scrape(hami, PODS, read_cgroup=lambda pid: text)
    assert series(samples, "kube_vgpu_container_memory_used_mib") == {}
    assert sum(series(samples, "kube_vgpu_gpu_memory_used_mib").values()) == 16128


def test_a_gpu_nvml_cannot_read_is_left_out_and_named() -> None:
    for nvml in started(HAMI_SIMULATION):
        gpus = discover(nvml)
        nvml.set_lost(1, True)
        sample = read_usage(nvml, gpus)
        assert [g.uuid for g in sample.gpus] == [gpus[0].uuid]
        assert len(sample.errors) == 1 and gpus[1].uuid in sample.errors[0]


@pytest.mark.parametrize(
    ("process", "complaint"),
    [
        ({"gpu": 5, "pid": 1, "usedMemoryMiB": 1}, "processes[0].gpu"),
        ({"gpu": 0, "pid": 0, "usedMemoryMiB": 1}, "processes[0].pid"),
        ({"gpu": 0, "pid": 1}, "missing key 'usedMemoryMiB'"),
        ({"gpu": 0, "pid": 1, "usedMemoryMiB": 1, "smUtilPercent": 101}, "smUtilPercent"),
        ({"gpu": 0, "pid": 1, "usedMemoryMiB": 1, "mig": 1}, "not migCapable"),
        ({"gpu": 0, "pid": 1, "usedMemoryMiB": 1, "cgroup": 7}, "processes[0].cgroup"),
        ({"gpu": 0, "pid": 1, "usedMemoryMiB": 1, "owner": "x"}, "unknown key 'owner'"),
    ],
)
def test_the_simulation_file_refuses_bad_processes(process: dict[str, Any], complaint: str) -> None:
    with pytest.raises(SimulationError, match=re.escape(complaint)):
        load_simulation({"gpus": [{"model": "NVIDIA A100-SXM4-80GB"}], "processes": [process]}, NODE)


def test_one_pid_with_two_cgroups_is_refused() -> None:
    processes = [
        {"gpu": 0, "pid": 1, "usedMemoryMiB": 1, "cgroup": "0::/a"},
        {"gpu": 0, "pid": 1, "usedMemoryMiB": 1, "cgroup": "0::/b"},
    ]
    with pytest.raises(SimulationError, match="two cgroups"):
        load_simulation({"gpus": [{"model": "NVIDIA A100-SXM4-80GB"}], "processes": processes}, NODE)


def test_process_utilization_answers_as_pynvml_does(hami: SimulatedNvml) -> None:
    handle = hami.nvmlDeviceGetHandleByIndex(1)
    samples = hami.nvmlDeviceGetProcessUtilization(handle, 0)
    assert all(isinstance(s, pynvml.c_nvmlProcessUtilizationSample_t) for s in samples)
    assert {s.pid: s.smUtil for s in samples} == {102: 5, 300: 50}  # pid 400 has no sample
    # nothing newer than a moment still to come: NotFound, as NVML answers an empty buffer
    future = max(s.timeStamp for s in samples) + 3600 * 1_000_000
    with pytest.raises(pynvml.NVMLError_NotFound):
        hami.nvmlDeviceGetProcessUtilization(handle, future)
    hami.set_processes(0, [])
    with pytest.raises(pynvml.NVMLError_NotFound):
        hami.nvmlDeviceGetProcessUtilization(hami.nvmlDeviceGetHandleByIndex(0), 0)


async def test_the_running_plugin_serves_usage_from_its_own_pod_list(
    apiserver: ApiServerStandin, tmp_path: Path
) -> None:
    apiserver.put(node_object())
    train = one_gpu_pod("train", UUID_A, uid=UID_A)
    train["status"] = PODS[0]["status"]
    uid = apiserver.put(train)["metadata"]["uid"]  # the API server's, as on a cluster
    trainer = systemd_cgroup(uid, CID_A)
    sim = simulation(processes=[process(0, 100, 1500, 25, trainer), process(1, 300, 700, 60, "0::/\n")])
    scraped: list[str] = []

    async def scrape_http(port: int) -> str:
        url = f"http://127.0.0.1:{port}/metrics"
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            assert response.status == 200
            return await response.text()

    with short_tempdir() as kdir:
        async with running_plugin(apiserver, kdir, tmp_path, sim=sim) as h:
            assert h.plugin.metrics_server is not None
            port = h.plugin.metrics_server.port
            wanted = (
                f'kube_vgpu_container_memory_used_mib{{container="trainer",gpu="{UUID_A}",namespace="default",'
                f'node="{NODE}",pod="train"}} 1500.0'
            )

            async def seen() -> bool:
                scraped.append(await scrape_http(port))
                return wanted in scraped[-1]

            async with asyncio.timeout(HANG_S):
                while not await seen():  # noqa: ASYNC110 (polling the scrape itself)
                    await asyncio.sleep(0.05)
    text = scraped[-1]
    assert f'kube_vgpu_gpu_memory_used_mib{{gpu="{UUID_B}",node="{NODE}"}} 700.0' in text
    assert f'kube_vgpu_gpu_memory_used_mib{{gpu="{UUID_A}",node="{NODE}"}} 1500.0' in text
    assert 'container_sm_utilization_percent{container="trainer"' in text
    assert text.count("kube_vgpu_container_memory_used_mib{") == 1  # the host process has none


async def test_a_hung_nvml_read_holds_one_thread_and_scrapes_get_the_previous_sample(
    hami: SimulatedNvml,
) -> None:
    sampler = UsageSampler(hami, discover(hami), NODE, hami.process_cgroup, refresh_timeout=0.2)
    sampler.refresh()  # the previous sample, taken without the bound (a loaded machine may take longer)
    before = sampler.sample
    assert before.gpus
    gate = threading.Event()
    calls: list[int] = []
    real = hami.nvmlDeviceGetMemoryInfo

    def hung(handle: object, version: int | None = None) -> Any:
        calls.append(1)
        gate.wait(10)
        return real(handle, version)

    hami.nvmlDeviceGetMemoryInfo = hung  # type: ignore[method-assign]
    try:
        await asyncio.gather(*(sampler.refresh_async() for _ in range(5)))
        assert sampler.sample is before  # served the previous sample, within the bound
        assert len(calls) == 1  # five scrapes shared one refresh: one thread held, not five
    finally:
        gate.set()
        await sampler.drain()
    assert sampler.sample is not before  # the shared refresh finished once NVML answered


def with_statuses(statuses: Any) -> dict[str, Any]:
    return {"metadata": PODS[0]["metadata"], "status": {"containerStatuses": statuses}}


@pytest.mark.parametrize(
    "broken",
    [
        {"metadata": None, "status": None},
        {"metadata": {"uid": 7, "namespace": "x", "name": "y"}},
        {"metadata": PODS[0]["metadata"], "status": "Running"},
        with_statuses(["not a mapping", None, 3]),
        with_statuses(5),
        with_statuses([{"name": "trainer", "containerID": 5}]),
        with_statuses([{"name": "trainer", "containerID": CID_A}]),  # no runtime:// prefix
    ],
)
def test_pods_of_odd_shapes_never_break_the_attribution(hami: SimulatedNvml, broken: dict[str, Any]) -> None:
    # the well-formed team-b pod is still attributed; the odd one is skipped
    samples = series(scrape(hami, [broken, PODS[1]]), "kube_vgpu_container_memory_used_mib")
    assert {dict(labels)["pod"] for labels in samples} == {"infer"}
