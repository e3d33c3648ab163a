"""`kube-vgpu top` against the stand-in API server: per node GPUs and bookings, per namespace quota."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from kube_vgpu.cli.main import main
from kube_vgpu.contract.config import Config
from kube_vgpu.contract.dra import DEVICE_CLASS
from kube_vgpu.contract.names import (
    DEVICE_CONFIG_KEY,
    HAMI_CORE,
    MIG,
    MODE_LABEL,
    NODE_REGISTER,
    QUOTA_CORES_LABEL,
    QUOTA_MEMORY_LABEL,
    VGPU_MODE,
)
from kube_vgpu.contract.register import GpuRecord, encode_register
from kube_vgpu.kubeapi.client import Kube, load_api_client
from kube_vgpu.standins.apiserver.dra import FeatureGates
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.webhook.cache import ClusterCache
from kube_vgpu.webhook.metrics import WebhookMetrics
from kube_vgpu.webhook.quota.charge import Charge
from kube_vgpu.webhook.service import build_quota
from tests.support import webhook as support
from tests.support.node import CORES, COUNT, MEMORY, container, make_pod, one_gpu_pod
from tests.support.records import as_pod
from tests.support.webhook_quota import memory_book, request_for

A1 = "GPU-a1000000-0000-4000-8000-000000000001"
A2 = "GPU-a1000000-0000-4000-8000-000000000002"
H1 = "GPU-b1000000-0000-4000-8000-000000000001"


def gpu_node(name: str, records: list[GpuRecord], mode: str = "hami-core") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {MODE_LABEL: mode},
            "annotations": {NODE_REGISTER: encode_register(records)},
        },
    }


def namespace(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}}


@pytest.fixture
def cluster(apiserver: ApiServerStandin, tmp_path: Path) -> Path:
    api = apiserver
    # Claims keep their capacity requests only where DRAConsumableCapacity is on (1.36).
    api.feature_gates = FeatureGates.of_release(36)
    api.put(
        gpu_node(
            "gpu-a100",
            [
                GpuRecord(A1, 10, 81920, "NVIDIA-NVIDIA A100-SXM4-80GB", True, "hami-core"),
                # out of service: count 0, as the node plugin publishes it
                GpuRecord(A2, 0, 81920, "NVIDIA-NVIDIA A100-SXM4-80GB", False, "hami-core"),
            ],
        )
    )
    api.put(
        gpu_node("gpu-h100", [GpuRecord(H1, 10, 81559, "NVIDIA-NVIDIA H100 80GB HBM3", True, "hami-core")])
    )
    api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu-only"}})
    api.put(namespace("team-a", {QUOTA_MEMORY_LABEL: "30000", QUOTA_CORES_LABEL: "200"}))
    api.put(namespace("team-b"))
    api.put(namespace("idle", {QUOTA_MEMORY_LABEL: "1000"}))
    api.put(one_gpu_pod("train", A1, mem=10240, cores=30, namespace="team-a", node="gpu-a100"))
    api.put(one_gpu_pod("infer", A1, mem=4096, cores=20, namespace="team-b", node="gpu-a100"))
    api.put(one_gpu_pod("h", H1, mem=2048, cores=0, namespace="team-a", node="gpu-h100"))
    done = one_gpu_pod("done", A1, mem=50000, cores=50, namespace="team-a", node="gpu-a100")
    done["status"] = {"phase": "Succeeded"}
    api.put(done)
    # not scheduled yet: charged against the quota, booked on no node
    pending = make_pod("pending", [container("c", {COUNT: "1", MEMORY: "1000", CORES: "10"})], node="")
    pending["metadata"]["namespace"] = "team-a"
    pending["spec"].pop("nodeName")
    api.put(pending)
    api.put(make_pod("plain", [container("c")], namespace="team-b"))  # no GPU: not counted
    return api.write_kubeconfig(tmp_path / "kubeconfig")


def top(kubeconfig: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    code = main(["top", "--kubeconfig", str(kubeconfig), *extra])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_view_per_node_and_per_namespace(cluster: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = top(cluster, capsys, "-o", "json")
    assert code == 0
    view = json.loads(out)
    nodes = {n["name"]: n for n in view["nodes"]}
    assert set(nodes) == {"gpu-a100", "gpu-h100"}  # the CPU node carries no register annotation
    a100 = nodes["gpu-a100"]
    assert (a100["gpus"], a100["healthy_gpus"]) == (2, 1)
    assert a100["memory_mib"] == 81920 and a100["cores"] == 100  # only the GPU in service
    assert a100["memory_allocated_mib"] == 10240 + 4096 and a100["cores_allocated"] == 50
    assert a100["vgpus_allocated"] == 2 and sorted(a100["pods"]) == ["team-a/train", "team-b/infer"]
    assert nodes["gpu-h100"]["memory_allocated_mib"] == 2048
    spaces = {s["name"]: s for s in view["namespaces"]}
    assert set(spaces) == {"team-a", "team-b", "idle"}
    team_a = spaces["team-a"]
    assert team_a["pods"] == 3  # train, h, pending; the finished pod is not charged
    assert team_a["memory_mib"] == {"used": 10240 + 2048 + 1000, "limit": 30000}
    # "h" states vgpu-cores 0: no SM limit, so it is charged a whole GPU's cores.
    assert team_a["cores"] == {"used": 30 + 100 + 10, "limit": 200}
    assert team_a["vgpus"] == {"used": 3, "limit": None}
    assert spaces["team-b"]["memory_mib"] == {"used": 4096, "limit": None}
    assert spaces["idle"] == {
        "name": "idle",
        "pods": 0,
        "vgpus": {"used": 0, "limit": None},
        "memory_mib": {"used": 0, "limit": 1000},
        "cores": {"used": 0, "limit": None},
        "uncounted": [],
        "claims": 0,
    }
    assert view["dra_devices"] == []  # no ResourceClaims in this cluster


def test_text_view_is_two_tables(cluster: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = top(cluster, capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == [
        "NODE",
        "MODE",
        "GPUS",
        "MEMORY(MiB)",
        "MEMORY%",
        "CORES(%)",
        "CORES%",
        "VGPUS",
        "PODS",
    ]
    a100 = next(line.split() for line in lines if line.startswith("gpu-a100"))
    assert a100 == ["gpu-a100", "hami-core", "1/2", "14336/81920", "17%", "50/100", "50%", "2/10", "2"]
    team_a = next(line.split() for line in lines if line.startswith("team-a"))
    assert team_a == ["team-a", "3", "0", "3/-", "13288/30000", "140/200"]  # "h": no SM limit, 100


def test_a_broken_register_annotation_is_named_not_fatal(
    apiserver: ApiServerStandin, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node = gpu_node("bad", [])
    node["metadata"]["annotations"][NODE_REGISTER] = "garbage,,:::"
    apiserver.put(node)
    code, out, _ = top(apiserver.write_kubeconfig(tmp_path / "kc"), capsys)
    assert code == 0 and "node bad:" in out and NODE_REGISTER in out


def test_an_unreachable_api_server_exits_1_with_the_reason(
    apiserver: ApiServerStandin, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kc")
    text = kubeconfig.read_text().replace(apiserver.url, "https://127.0.0.1:1")
    kubeconfig.write_text(text)
    code, out, err = top(kubeconfig, capsys)
    assert code == 1 and out == "" and "cannot read the cluster" in err


async def test_top_and_the_webhook_count_a_namespace_alike(
    apiserver: ApiServerStandin, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 34: a 9000 MiB `mig` pod holds a 9984 MiB slot (1g.10gb of an H100 80GB); a share of a
    # card counts against the largest GPU its mode offers; `top` must show what the webhook enforces.
    apiserver.put(support.gpu_node("a100", "hami-core", [(support.A100, 40960)]))
    apiserver.put(support.gpu_node("h100", "mig", [(support.H100, 81920)]))
    apiserver.put(namespace("team-q", {QUOTA_MEMORY_LABEL: "40000"}))
    pods = {
        "hami": support.pod(support.container(memory=2048, cores=20), annotations={VGPU_MODE: HAMI_CORE}),
        "mig": support.pod(support.container(memory=9000, cores=30), annotations={VGPU_MODE: MIG}),
        "half": support.pod(support.container(percent=50)),  # the default mode: hami-core's A100
        "tenth-mig": support.pod(support.container(percent=10, cores=10), annotations={VGPU_MODE: MIG}),
    }
    for name, obj in pods.items():
        obj["metadata"] |= {"name": name, "namespace": "team-q"}
        apiserver.put(obj)
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    code, out, _ = top(kubeconfig, capsys, "-o", "json")
    assert code == 0
    shown = next(s for s in json.loads(out)["namespaces"] if s["name"] == "team-q")

    kube = Kube(load_api_client(str(kubeconfig)), component="webhook")
    cache = ClusterCache(kube, watch_timeout_seconds=5, retry_seconds=0.05)
    quota = build_quota(cache, Config(), WebhookMetrics(), memory_book())
    await cache.start()
    try:
        async with asyncio.timeout(30):
            await cache.wait_synced()
        enforced = quota.usage("team-q")
        # 2048 + the 9984 MiB slot + half of the 40960 MiB A100 + 10 % of the H100 (8192 MiB) in a
        # 1g.10gb slot; "half" states no cores: the whole GPU's.
        assert enforced == Charge(4, 2048 + 9984 + 20480 + 9984, 20 + 30 + 100 + 10)
        assert shown["memory_mib"] == {"used": enforced.memory_mib, "limit": 40000}
        assert shown["vgpus"]["used"] == enforced.number and shown["cores"]["used"] == enforced.cores
        assert shown["pods"] == 4 and shown["uncounted"] == []
        # And the next review is refused with the very figure `top` shows.
        following = support.pod(support.container(memory=9000, cores=30), annotations={VGPU_MODE: MIG})
        following["metadata"] |= {"name": "next", "namespace": "team-q", "uid": "u-next"}
        message = await quota.admit(request_for(as_pod(following), {QUOTA_MEMORY_LABEL: "40000"}))
        assert message is not None and f"in use {shown['memory_mib']['used']} MiB of 40000 MiB" in message
    finally:
        await cache.stop()
        kube.close()


DEVICE_CONFIG = """\
nvidia:
  resourceCountName: volcano.sh/vgpu-number
  resourceMemoryName: volcano.sh/vgpu-memory
  resourceMemoryPercentageName: volcano.sh/vgpu-memory-percentage
  resourceCoreName: volcano.sh/vgpu-cores
  knownMigGeometries:
  - models: ["H100 80GB HBM3"]
    allowedGeometries:
    - group: group1
      geometries: [{name: 1g.12gb, memory: 12000, count: 6}]
"""


@pytest.mark.parametrize(("text", "charged"), [(DEVICE_CONFIG, 12000), ("nvidia: [", 9984)])
def test_top_charges_mig_pods_by_volcanos_device_configmap_as_the_webhook_does(
    apiserver: ApiServerStandin, tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, charged: int
) -> None:
    node = Config().node
    apiserver.put(namespace(node.device_config_namespace))
    apiserver.put(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": node.device_config_name, "namespace": node.device_config_namespace},
            "data": {DEVICE_CONFIG_KEY: text},
        }
    )
    apiserver.put(support.gpu_node("h100", "mig", [(support.H100, 81920)]))
    apiserver.put(namespace("team-q"))
    mig = support.pod(
        support.container(memory=9000), annotations={VGPU_MODE: MIG}, name="m", namespace="team-q"
    )
    apiserver.put(mig)
    code, out, _ = top(apiserver.write_kubeconfig(tmp_path / "kubeconfig"), capsys, "-o", "json")
    assert code == 0
    # A geometry that does not parse: the shipped one (1g.10gb), as the webhook falls back to.
    assert (
        next(s for s in json.loads(out)["namespaces"] if s["name"] == "team-q")["memory_mib"]["used"]
        == charged
    )


def dra_claim(
    name: str,
    namespace: str,
    memory: str | None,
    cores: str | None,
    results: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": DEVICE_CLASS}
    amounts = {k: v for k, v in (("memory", memory), ("cores", cores)) if v is not None}
    if amounts:
        exactly["capacity"] = {"requests": amounts}
    claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }
    if results is not None:
        claim["status"] = {"allocation": {"devices": {"results": results}}}
    return claim


def result(device: str, consumed: dict[str, str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"request": "gpu", "driver": DEVICE_CLASS, "pool": "dra-node", "device": device}
    if consumed is not None:
        out["consumedCapacity"] = consumed
    return out


def test_dra_shares_per_gpu_and_claims_per_namespace(
    cluster: Path, apiserver: ApiServerStandin, capsys: pytest.CaptureFixture[str]
) -> None:
    """Claims count in their namespace with the webhook's ledger (20 GiB/30; a claim naming
    nothing: 100 cores, and the largest known GPU's memory); each allocated GPU shows what its
    claims consumed, a result without consumedCapacity (a whole device) named apart."""
    apiserver.put(
        dra_claim("a", "team-a", "20Gi", "30", [result("gpu-0", {"memory": "20Gi", "cores": "30"})])
    )
    apiserver.put(dra_claim("b", "team-b", "10Gi", "5", [result("gpu-0", {"memory": "10Gi", "cores": "5"})]))
    apiserver.put(dra_claim("whole", "team-b", None, None, [result("gpu-1", None)]))
    apiserver.put(dra_claim("waiting", "team-a", "300Mi", "1"))  # not allocated yet: charged, on no GPU
    other = dra_claim("nic", "team-a", "1Gi", "1", [result("nic-0", {"memory": "1Gi"})])
    other["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "nic.example.com"
    other["status"]["allocation"]["devices"]["results"][0]["driver"] = "nic.example.com"
    apiserver.put(other)
    code, out, _ = top(cluster, capsys, "-o", "json")
    assert code == 0
    view = json.loads(out)
    spaces = {s["name"]: s for s in view["namespaces"]}
    assert spaces["team-a"]["claims"] == 2 and spaces["team-a"]["pods"] == 3
    assert spaces["team-a"]["memory_mib"]["used"] == 10240 + 2048 + 1000 + 20480 + 300
    assert spaces["team-b"]["claims"] == 2
    # No node of this cluster labels its GPUs' UUIDs, so no GPU size is known: the claim naming no
    # memory is counted without it, and named, as the webhook's ledger counts it.
    assert spaces["team-b"]["memory_mib"]["used"] == 4096 + 10240
    assert spaces["team-b"]["uncounted"] == ["team-b/resourceclaim/whole"]
    assert spaces["team-b"]["cores"]["used"] == 20 + 5 + 100
    assert view["dra_devices"] == [
        {
            "pool": "dra-node",
            "device": "gpu-0",
            "claims": ["team-a/a", "team-b/b"],
            "memory_mib": 30720,
            "cores": 35,
            "whole": [],
        },
        {
            "pool": "dra-node",
            "device": "gpu-1",
            "claims": ["team-b/whole"],
            "memory_mib": 0,
            "cores": 0,
            "whole": ["team-b/whole"],
        },
    ]
    code, text, _ = top(cluster, capsys)
    assert "DRA GPU (POOL/DEVICE)" in text
    assert [line.split() for line in text.splitlines() if line.startswith("dra-node/")] == [
        ["dra-node/gpu-0", "2", "30720", "35"],
        ["dra-node/gpu-1", "1", "0", "+", "1", "whole", "0"],
    ]


def test_an_admin_access_result_shows_no_share(
    cluster: Path, apiserver: ApiServerStandin, capsys: pytest.CaptureFixture[str]
) -> None:
    """A monitoring claim's result (adminAccess, in a namespace labelled for it) consumed nothing
    for anyone: it adds no claim, memory or cores to its GPU, and no charge to its namespace."""
    apiserver.put(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": "gpu-ops", "labels": {"resource.kubernetes.io/admin-access": "true"}},
        }
    )
    apiserver.put(
        dra_claim("a", "team-a", "20Gi", "30", [result("gpu-0", {"memory": "20Gi", "cores": "30"})])
    )
    monitor = dra_claim(
        "monitor",
        "gpu-ops",
        "256Mi",
        "1",
        [{**result("gpu-0", {"memory": "256Mi", "cores": "1"}), "adminAccess": True}],
    )
    monitor["spec"]["devices"]["requests"][0]["exactly"]["adminAccess"] = True
    apiserver.put(monitor)
    code, out, _ = top(cluster, capsys, "-o", "json")
    assert code == 0
    view = json.loads(out)
    (gpu,) = view["dra_devices"]
    assert (gpu["claims"], gpu["memory_mib"], gpu["cores"]) == (["team-a/a"], 20480, 30)
    assert all(s["name"] != "gpu-ops" or s["claims"] == 0 for s in view["namespaces"])
