"""The cache's reduced objects give every decision the answers the whole objects give: quota usage and
charges (the ledger and the shared book's view of it), placement, never-fits warnings, the GPU
inventory; and pods that ask for no vGPU, and nodes with no kube-vgpu label, are dropped.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.contract.devices import DeviceRecord, encode_pod_devices
from kube_vgpu.contract.mig.shipped import default_device_config
from kube_vgpu.contract.names import (
    HOSTNAME_LABEL,
    NOUSE_GPUTYPE,
    NOUSE_GPUUUID,
    USE_GPUTYPE,
    USE_GPUUUID,
    USE_GPUUUID_ALIAS,
    VGPU_IDS_NEW,
    VGPU_MODE,
    VGPU_MODE_ALIAS,
)
from kube_vgpu.contract.resources import RequestError, parse_pod
from kube_vgpu.standins.apiserver.realistic import realistic_pod
from kube_vgpu.webhook.placement.fit import never_fits_in
from kube_vgpu.webhook.placement.inventory import Inventory, node_gpus
from kube_vgpu.webhook.placement.resolve import resolve_placement
from kube_vgpu.webhook.placement.selectors import SelectorError, parse_selectors
from kube_vgpu.webhook.quota.ledger import QuotaLedger
from kube_vgpu.webhook.quota.sizing import mig_slot_sizer, placement_sizer
from kube_vgpu.webhook.records import PodRecord
from kube_vgpu.webhook.reduced import (
    NODE_PREFILTER,
    pod_prefilter,
    pod_reducer,
    reduce_namespace,
    reduce_node,
)
from tests.support.records import as_node, as_pod
from tests.support.webhook import A100, H100, gpu_node, gpu_uuid

NAMES = ResourceNames()
REDUCE = pod_reducer(NAMES)
NODES = [
    gpu_node("a100-1", "hami-core", [(A100, 40960), (A100, 40960)]),
    gpu_node("h100-1", "mig", [(H100, 81920)]),
    gpu_node("l4-1", "hami-core", [("NVIDIA L4", 23034)], reference_form=True),
]
UUIDS = [gpu_uuid("a100-1", 0), gpu_uuid("a100-1", 1), gpu_uuid("h100-1", 0), gpu_uuid("l4-1", 0)]


def inventory() -> Inventory:
    inv = Inventory()
    for node in NODES:
        inv.upsert(node)
    return inv


# -- the corpus -----------------------------------------------------------------------------------

# Mostly well-formed amounts (what admission lets through), now and then not (pods that bypassed it).
VALUES = {
    NAMES.count: st.sampled_from(["1", "2", "3", "1", "2", "0"]),
    NAMES.memory: st.sampled_from(["1000", "3k", "4096", "1000", "3k", "3Gi"]),
    NAMES.memory_percentage: st.sampled_from(["50", "100", "25", "50", "100", "150"]),
    NAMES.cores: st.sampled_from(["30", "100", "50", "30", "100", "500m"]),
    "cpu": st.just("2"),
    "nvidia.com/gpu": st.just("1"),
}


@st.composite
def amounts(draw: st.DrawFn) -> dict[str, str]:
    keys = draw(st.lists(st.sampled_from(sorted(VALUES)), max_size=4, unique=True))
    return {key: draw(VALUES[key]) for key in keys}


@st.composite
def containers(draw: st.DrawFn, *, init: bool) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": draw(st.sampled_from(["main", "side", "init", "app"])),
        "image": "registry.example.com/app:v1",
        "env": [{"name": "A", "value": "b"}],
    }
    resources: dict[str, Any] = {}
    if draw(st.booleans()):
        resources["limits"] = draw(amounts())
    if draw(st.booleans()):
        resources["requests"] = draw(amounts())
    container["resources"] = resources
    if init and draw(st.booleans()):
        container["restartPolicy"] = "Always"
    return container


def booking(draw: st.DrawFn) -> str:
    entries = [
        [
            DeviceRecord(draw(st.sampled_from(UUIDS)), draw(st.sampled_from([1000, 3000, 4096])), 0)
            for _ in range(draw(st.integers(1, 2)))
        ]
        for _ in range(draw(st.integers(0, 2)))
    ]
    return encode_pod_devices(entries) if entries else draw(st.sampled_from(["", "garbage", "a,b:"]))


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    """A realistic pod (managedFields, probes, status...) with drawn containers, annotations, phase."""
    pod = realistic_pod(draw(st.integers(0, 10_000)))
    pod["metadata"]["namespace"] = draw(st.sampled_from(["team-a", "team-b"]))
    pod["spec"]["containers"] = draw(st.lists(containers(init=False), min_size=1, max_size=3))
    if draw(st.booleans()):
        pod["spec"]["initContainers"] = draw(st.lists(containers(init=True), max_size=2))
    annotations = pod["metadata"]["annotations"]
    optional = {
        VGPU_MODE: st.sampled_from(["hami-core", "mig", "bogus"]),
        VGPU_MODE_ALIAS: st.sampled_from(["hami-core", "mig"]),
        USE_GPUTYPE: st.sampled_from(["A100", "H100", "A10,L4", "", "B200"]),
        NOUSE_GPUTYPE: st.sampled_from(["A100", "L4"]),
        USE_GPUUUID: st.sampled_from([UUIDS[0], f"{UUIDS[1]},{UUIDS[2]}", "GPU-none"]),
        USE_GPUUUID_ALIAS: st.sampled_from([UUIDS[3]]),
        NOUSE_GPUUUID: st.sampled_from([UUIDS[0], ""]),
        "kubectl.kubernetes.io/last-applied-configuration": st.just('{"big": "' + "x" * 2000 + '"}'),
        "example.com/owner": st.just("someone"),
    }
    for key, values in optional.items():
        if draw(st.booleans()):
            annotations[key] = draw(values)
    if draw(st.booleans()):
        annotations[VGPU_IDS_NEW] = booking(draw)
    phase = draw(st.sampled_from(["Running", "Pending", "Succeeded", "Failed", None]))
    if phase is None:
        del pod["status"]["phase"]
    else:
        pod["status"]["phase"] = phase
    if draw(st.booleans()):
        pod["metadata"]["deletionTimestamp"] = draw(
            # Long past, in the future, and 10 s before the ledger's wall clock (inside a 30 s grace).
            st.sampled_from(["2023-11-14T22:00:00Z", "2030-01-01T00:00:00Z", "2027-01-15T07:59:50Z", "x"])
        )
        pod["metadata"]["deletionGracePeriodSeconds"] = draw(st.sampled_from([0, 30, "30"]))
    return pod


# -- what each decision answers ---------------------------------------------------------------------


def ledger() -> QuotaLedger:
    inv = inventory()
    return QuotaLedger(
        names=NAMES,
        pending_seconds=60,
        gpu_size=placement_sizer(lambda: inv, NAMES, "hami-core"),
        gpu_memory=lambda uuid: None if inv.gpu(uuid) is None else inv.gpu(uuid).memory_mib,  # type: ignore[union-attr]
        slot_size=mig_slot_sizer(lambda: inv, default_device_config, NAMES, "hami-core"),
        clock=lambda: 1000.0,
        wall_clock=lambda: 1_800_000_000.0,
    )


def placement_answer(pod: PodRecord) -> object:
    try:
        request = parse_pod(pod, NAMES)
        selectors = parse_selectors(pod["metadata"].get("annotations") or {})
    except (RequestError, SelectorError) as exc:
        return ("error", str(exc))
    placement = resolve_placement(selectors, request, inventory(), "hami-core")
    return (placement, never_fits_in(request, inventory()))


def quota_answers(pods: Sequence[PodRecord], uids: list[str]) -> object:
    book = ledger()
    for pod in pods:
        book.pod_seen(pod)
    state = {ns: book.cache_state(ns) for ns in ("team-a", "team-b")}
    return (
        {ns: (book.usage(ns), book.unsized(ns)) for ns in ("team-a", "team-b")},
        {ns: (s.pods, [(s.accounts_for(u), s.released(u)) for u in uids]) for ns, s in state.items()},
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(pods(), min_size=1, max_size=6, unique_by=lambda p: p["metadata"]["uid"]))
def test_decisions_from_reduced_pods_equal_those_from_whole_pods(corpus: list[dict[str, Any]]) -> None:
    whole = copy.deepcopy(corpus)
    reduced = [r for r in (REDUCE(p) for p in corpus) if r is not None]
    kept_uids = {r["metadata"]["uid"] for r in reduced}
    # Quota and the shared book's view of it: the same usage, pods counted and released.
    uids = [p["metadata"]["uid"] for p in whole]
    assert quota_answers([as_pod(p) for p in whole], uids) == quota_answers(reduced, uids)
    for pod in whole:
        slim = REDUCE(copy.deepcopy(pod))
        if slim is None:
            # Dropped at the edge: it names no vGPU resource, so no decision counts it.
            assert pod["metadata"]["uid"] not in kept_uids
            assert not any(k in orjson.dumps(pod["spec"]).decode() for k in NAMES.all())
            continue
        # Placement and never-fits warnings, as a review and the quota sizers resolve them.
        assert placement_answer(as_pod(pod)) == placement_answer(slim)
        # The raw prefilter never drops a pod the reducer keeps.
        assert pod_prefilter(NAMES)(orjson.dumps(pod))
        assert len(orjson.dumps(slim)) < len(orjson.dumps(pod)) / 4
    assert corpus == whole  # reducing never changes the object it reads


@given(
    st.lists(st.sampled_from(NODES), min_size=1, max_size=3),
    st.dictionaries(st.sampled_from(["team", "topology.kubernetes.io/zone"]), st.just("x"), max_size=2),
    # Cloud nodes are often named apart from their hostname label, which placement's affinity names.
    st.sampled_from([None, "ip-10-0-3-7.ec2.internal"]),
)
def test_nodes_reduce_to_the_same_inventory_facts(
    nodes: list[dict[str, Any]], noise: dict[str, str], hostname: str | None
) -> None:
    for original in nodes:
        node = copy.deepcopy(original)
        node["metadata"]["labels"] |= noise
        if hostname is not None:
            node["metadata"]["labels"][HOSTNAME_LABEL] = hostname
        node["metadata"]["annotations"]["node.alpha.kubernetes.io/ttl"] = "0"
        node["status"] = {"allocatable": {"cpu": "64", "volcano.sh/vgpu-number": "80"}, "images": ["x"] * 50}
        slim = reduce_node(node)
        assert slim is not None and node_gpus(slim) == node_gpus(as_node(node))
        assert slim["status"] == {"allocatable": node["status"]["allocatable"]}
        assert NODE_PREFILTER(orjson.dumps(node))


def test_a_node_without_kube_vgpu_labels_is_dropped() -> None:
    plain = {"metadata": {"name": "cpu-1", "labels": {"kubernetes.io/hostname": "cpu-1"}}, "status": {}}
    assert reduce_node(plain) is None and node_gpus(as_node(plain)) is None
    assert not NODE_PREFILTER(orjson.dumps(plain))


def test_pods_without_a_vgpu_resource_are_dropped_and_gpu_pods_kept() -> None:
    assert REDUCE(realistic_pod(1)) is None  # a CPU pod of the realistic corpus
    slim = REDUCE(realistic_pod(10))
    assert slim is not None
    assert slim["spec"]["containers"] == [
        {
            "name": "app",
            "resources": {
                "limits": {NAMES.count: "1", NAMES.memory: "3k"},
                "requests": {NAMES.count: "1", NAMES.memory: "3k"},
            },
        }
    ]
    assert slim["metadata"]["annotations"] == {VGPU_MODE: "hami-core"}
    assert slim["status"] == {"phase": "Running"} and slim["spec"]["nodeName"] == "gpu-node-00010"
    # A vGPU name in requests alone is a vGPU pod too (Volcano reads the limit first, then the request).
    pod = realistic_pod(1)
    pod["spec"]["containers"][0]["resources"]["requests"][NAMES.cores] = "30"
    assert REDUCE(pod) is not None


def test_namespaces_keep_their_name_and_labels() -> None:
    ns = {
        "metadata": {
            "name": "team",
            "uid": "u",
            "resourceVersion": "7",
            "labels": {"q": "1"},
            "annotations": {"a": "b"},
        },
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    }
    assert reduce_namespace(ns) == {
        "metadata": {"name": "team", "uid": "u", "resourceVersion": "7", "labels": {"q": "1"}}
    }
