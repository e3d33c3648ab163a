"""Namespace GPU quotas at admission, through the shared reservations every webhook wires: limits,
charges, messages, relabels, dryRun."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from kube_vgpu.contract.devices import DeviceRecord, encode_pod_devices
from kube_vgpu.contract.mig.geometry import parse_device_config
from kube_vgpu.contract.mig.shipped import default_device_config
from kube_vgpu.contract.names import (
    QUOTA_CORES_LABEL,
    QUOTA_MEMORY_LABEL,
    QUOTA_NUMBER_LABEL,
    USE_GPUTYPE,
    VGPU_IDS_NEW,
    VGPU_MODE,
)
from kube_vgpu.kubeapi.client import ApiUnavailable
from kube_vgpu.webhook.admission import gates
from kube_vgpu.webhook.placement.inventory import Inventory
from kube_vgpu.webhook.quota.charge import Charge, QuotaLimits
from kube_vgpu.webhook.quota.gate import NamespaceQuota
from kube_vgpu.webhook.quota.shared import Entry, decode_entries, object_name
from kube_vgpu.webhook.quota.sizing import mig_slot_sizer, placement_sizer, pod_ledger
from kube_vgpu.webhook.records import PodRecord
from tests.support.memory_store import MemoryStore
from tests.support.records import as_pod
from tests.support.webhook import A100, H100, gpu_node, gpu_uuid
from tests.support.webhook_quota import (
    MEM_80G,
    NAMES,
    PENDING,
    RELEASE,
    Clocks,
    admit,
    close,
    in_cache,
    make_gate,
    make_pod,
    request_for,
)


def test_the_issue_example_is_denied_word_for_word() -> None:
    gate = make_gate()
    for i in range(4):
        gate.ledger.pod_seen(in_cache(make_pod(16384, name=f"old-{i}")))
    message = admit(gate, make_pod(24576, name="new"), MEM_80G)
    assert message == (
        "namespace team-a: vgpu-memory quota exceeded: requested 24576 MiB, in use 65536 MiB of 81920 MiB"
    )


def test_a_pod_that_fills_the_quota_exactly_is_admitted_and_the_next_is_not() -> None:
    gate = make_gate()
    gate.ledger.pod_seen(in_cache(make_pod(65536, name="old")))
    assert admit(gate, make_pod(16384, name="fits"), MEM_80G) is None
    assert gate.usage("team-a") == Charge(2, 81920, 200)
    assert "in use 81920 MiB of 81920 MiB" in (admit(gate, make_pod(1, name="one-more"), MEM_80G) or "")


def test_zero_allows_none_and_absent_labels_are_unlimited() -> None:
    gate = make_gate()
    assert admit(gate, make_pod(1, name="a"), {QUOTA_NUMBER_LABEL: "0"}) == (
        "namespace team-a: vgpu-number quota exceeded: requested 1 vGPU, in use 0 vGPUs of 0 vGPUs"
    )
    for i in range(50):
        assert admit(gate, make_pod(81920, number=8, cores=100, name=f"big-{i}"), {}) is None
    # A label on one resource leaves the others unlimited.
    assert admit(gate, make_pod(81920, number=8, cores=100, name="c"), {QUOTA_CORES_LABEL: "100000"}) is None


def test_cores_quota_counts_number_times_cores() -> None:
    gate = make_gate()
    labels = {QUOTA_CORES_LABEL: "400"}
    assert admit(gate, make_pod(1000, number=3, cores=100, name="a"), labels) is None
    assert admit(gate, make_pod(1000, number=2, cores=60, name="b"), labels) == (
        "namespace team-a: vgpu-cores quota exceeded: requested 120%, in use 300% of 400%"
    )
    assert admit(gate, make_pod(1000, number=2, cores=50, name="c"), labels) is None


@pytest.mark.parametrize("value", ["10Gi", "-1", "lots"])
def test_an_invalid_label_denies_every_vgpu_pod_naming_the_label(value: str) -> None:
    gate = make_gate()
    labels = {QUOTA_MEMORY_LABEL: value, QUOTA_NUMBER_LABEL: "100"}
    message = admit(gate, make_pod(1, name="tiny"), labels)
    assert message is not None and QUOTA_MEMORY_LABEL in message and "team-a" in message
    # A pod asking for no vGPU is not the quota's business.
    plain = as_pod(
        {"metadata": {"namespace": "team-a", "name": "web"}, "spec": {"containers": [{"name": "c"}]}}
    )
    assert admit(gate, plain, labels) is None
    assert gate.usage("team-a") == Charge()


def test_relabelling_a_namespace_takes_effect_on_the_next_review() -> None:
    gate = make_gate()
    gate.ledger.pod_seen(in_cache(make_pod(40000, name="old")))
    assert admit(gate, make_pod(40000, name="a"), MEM_80G) is None
    assert admit(gate, make_pod(40000, name="b"), MEM_80G) is not None
    assert admit(gate, make_pod(40000, name="b"), {QUOTA_MEMORY_LABEL: "120000"}) is None
    assert admit(gate, make_pod(40000, name="c"), {QUOTA_MEMORY_LABEL: "120000"}) is not None
    assert admit(gate, make_pod(40000, name="c"), {}) is None  # label removed: unlimited
    assert admit(gate, make_pod(1, name="d"), {QUOTA_MEMORY_LABEL: "0"}) is not None


def test_percentages_count_against_the_largest_gpu_the_pod_could_land_on() -> None:
    gate = make_gate()
    labels = {QUOTA_MEMORY_LABEL: "61440"}
    # Restricted to 40 GiB cards: half a card is 20480 MiB; on an 80 GiB card it is 40960.
    assert admit(gate, make_pod(None, percent=50, name="small"), labels, gpu=40960) is None
    assert admit(gate, make_pod(None, percent=50, name="large"), labels, gpu=81920) is None
    assert gate.usage("team-a").memory_mib == 61440
    message = admit(gate, make_pod(None, percent=10, name="more"), labels, gpu=24576)
    assert message is not None and "requested 2457 MiB, in use 61440 MiB of 61440 MiB" in message


def test_a_share_of_a_card_with_no_gpu_to_size_it_is_denied_only_under_a_memory_quota() -> None:
    gate = make_gate()
    message = admit(gate, make_pod(None, percent=50, name="a"), MEM_80G, gpu=None)
    assert message is not None and "vgpu-memory" in message and "team-a" in message
    assert admit(gate, make_pod(None, percent=50, name="a"), {QUOTA_NUMBER_LABEL: "2"}, gpu=None) is None
    # A whole card (no memory asked) is not sized either: nothing is charged for memory until it can be.
    assert admit(gate, make_pod(None, number=1, name="b"), {QUOTA_NUMBER_LABEL: "2"}, gpu=None) is None
    assert gate.usage("team-a") == Charge(2, 0, 200)


def test_dry_run_is_decided_the_same_way_and_reserves_nothing() -> None:
    gate = make_gate()
    gate.ledger.pod_seen(in_cache(make_pod(65536, name="old")))
    assert admit(gate, make_pod(16384, name="a"), MEM_80G, dry_run=True) is None
    assert admit(gate, make_pod(16385, name="a"), MEM_80G, dry_run=True) == (
        "namespace team-a: vgpu-memory quota exceeded: requested 16385 MiB, in use 65536 MiB of 81920 MiB"
    )
    assert gate.usage("team-a") == Charge(1, 65536, 100)
    assert gate.reserved("team-a") == Charge()


def test_namespaces_are_counted_apart() -> None:
    gate = make_gate()
    assert admit(gate, make_pod(81920, name="a", namespace="team-a"), MEM_80G) is None
    assert admit(gate, make_pod(81920, name="a", namespace="team-b"), MEM_80G) is None
    assert admit(gate, make_pod(1, name="b", namespace="team-b"), MEM_80G) is not None


def test_init_containers_are_charged_as_kubernetes_counts_them() -> None:
    gate = make_gate()
    p = in_cache(make_pod(1000, name="with-init"))
    p["spec"]["initContainers"] = [
        {"name": "warm", "resources": {"limits": {NAMES.count: "2", NAMES.memory: "8000"}}}
    ]
    labels = {QUOTA_MEMORY_LABEL: "16000", QUOTA_NUMBER_LABEL: "2"}
    assert admit(gate, p, labels) is None
    assert gate.usage("team-a") == Charge(2, 16000, 200)
    gate.ledger.pod_seen(in_cache(p))
    assert gate.usage("team-a") == Charge(2, 16000, 200)


def test_the_gate_is_the_quota_step_the_admission_pipeline_calls() -> None:
    step: gates.QuotaGate = make_gate()
    p = make_pod(1024, name="a")
    assert asyncio.run(step.admit(request_for(p, {QUOTA_NUMBER_LABEL: "0"}, gpu=None)))


def test_cache_pods_are_sized_against_the_largest_gpu_their_selectors_allow() -> None:
    inventory = Inventory()
    inventory.upsert(gpu_node("small", "hami-core", [(A100, 40960)]))
    inventory.upsert(gpu_node("big", "hami-core", [(H100, 81920)]))
    size = placement_sizer(lambda: inventory, NAMES, "hami-core")
    anywhere = in_cache(make_pod(None, percent=50, name="any"))
    on_a100 = in_cache(make_pod(None, percent=50, name="a100", annotations={USE_GPUTYPE: "A100"}))
    assert (size(anywhere), size(on_a100)) == (81920, 40960)
    gate = make_gate(gpu_size=size)
    gate.ledger.pod_seen(anywhere)
    gate.ledger.pod_seen(on_a100)
    assert gate.usage("team-a").memory_mib == 40960 + 20480
    broken = in_cache(make_pod(None, percent=50, name="x", annotations={VGPU_MODE: "fast"}))
    assert size(broken) is None


# A ceiling only a hang reaches.
HANG = 30.0

# -- the shared reservations behind the quota step --------------------------------------------------------


def stored(store: MemoryStore, namespace: str = "team-a") -> dict[str, Entry]:
    """The reservations booked in `namespace`'s shared object."""
    return decode_entries(store.get("configmap", object_name(namespace), namespace=RELEASE), namespace)


def failing_gate() -> NamespaceQuota:
    """A gate whose API server does not answer."""
    store = MemoryStore()

    def fail(call: str) -> None:
        raise ApiUnavailable("the API server did not answer")

    store.before = fail
    return make_gate(store=store)


def full_gate() -> NamespaceQuota:
    """A gate whose shared object holds as many reservations as it may already."""
    return make_gate(max_entries=0)


def test_each_pod_is_booked_by_its_uid_and_charge_and_a_dry_run_books_nothing() -> None:
    store = MemoryStore()
    clocks = Clocks()
    gate = make_gate(clocks, store=store)
    assert admit(gate, make_pod(40960, name="a"), MEM_80G, review="uid-a") is None
    assert admit(gate, make_pod(40960, name="b"), MEM_80G, review="uid-b", dry_run=True) is None
    expires = int(clocks.wall + PENDING)
    assert stored(store) == {"uid-a": Entry(Charge(1, 40960, 100), expires)}
    assert gate.reserved("team-a") == Charge(1, 40960, 100)
    assert gate.usage("team-a") == Charge(1, 40960, 100)
    # Over quota: the denial names the usage the book saw.
    message = admit(gate, make_pod(40961, name="c"), MEM_80G, review="uid-c")
    assert message == (
        "namespace team-a: vgpu-memory quota exceeded: requested 40961 MiB, in use 40960 MiB of 81920 MiB"
    )
    # A namespace with no quota costs the API nothing.
    calls = len(store.calls)
    assert admit(gate, make_pod(10**6, name="d"), {}, review="uid-d") is None
    assert len(store.calls) == calls
    gate.forget_namespace("team-a")
    assert "team-a" not in gate.last_limits and gate.reserved("team-a") == Charge()


def test_a_review_that_cannot_be_recorded_is_refused() -> None:
    message = admit(failing_gate(), make_pod(1), MEM_80G)
    assert message is not None and "quota cannot be checked right now" in message
    assert "the API server did not answer" in message and "retry in a few seconds" in message
    message = admit(full_gate(), make_pod(1), MEM_80G)
    assert message is not None and "too many GPU pods are being admitted at once" in message


def test_a_pod_of_a_namespace_the_cache_does_not_know_is_refused_and_nothing_is_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryStore()
    gate = make_gate(store=store)
    denials = Denials()
    gate.denials = denials
    with caplog.at_level(logging.INFO, logger="kube_vgpu.webhook.quota"):
        message = admit(gate, make_pod(1, name="a", namespace="ghost"), None, review="uid-g")
    assert message == (
        "namespace 'ghost' is unknown to the webhook: it does not exist, or it was created in the last "
        "few seconds and the webhook has not seen it yet (then retry)"
    )
    assert [r.getMessage() for r in caplog.records] == [
        "event=quota_unknown_namespace namespace='ghost' pod_uid=uid-g"
    ]
    assert store.calls == [] and denials.denied_for == [] and gate.last_limits == {}
    # One step away: a known namespace without labels admits the pod.
    assert admit(gate, make_pod(1, name="a", namespace="ghost"), {}, review="uid-g") is None
    # A pod asking for no vGPU is not the quota's business, known namespace or not.
    plain = as_pod(
        {"metadata": {"namespace": "ghost", "name": "web"}, "spec": {"containers": [{"name": "c"}]}}
    )
    assert admit(gate, plain, None) is None


# -- edges of the quota step (mutation testing: docs/testing.md) ----------------------------------------


class Denials:
    """A DenialCounter that records what it is told."""

    def __init__(self) -> None:
        self.denied_for: list[tuple[str, str]] = []
        self.forgotten: list[str] = []

    def denied(self, namespace: str, reason: str) -> None:
        self.denied_for.append((namespace, reason))

    def forget(self, namespace: str) -> None:
        self.forgotten.append(namespace)


async def test_usage_is_the_cache_plus_the_shared_reservations_per_namespace() -> None:
    store = MemoryStore()
    gate = make_gate(store=store)
    denials = Denials()
    gate.denials = denials
    gate.ledger.pod_seen(in_cache(make_pod(2048, name="old")))
    assert await gate.admit(request_for(make_pod(1024, name="new"), MEM_80G)) is None
    assert await gate.admit(request_for(make_pod(4096, name="new", namespace="team-b"), MEM_80G)) is None
    assert gate.last_limits == {
        "team-a": QuotaLimits(memory_mib=81920),
        "team-b": QuotaLimits(memory_mib=81920),
    }
    assert (gate.reserved("team-a"), gate.usage("team-a")) == (Charge(1, 1024, 100), Charge(2, 3072, 200))
    assert (gate.reserved("team-b"), gate.usage("team-b")) == (Charge(1, 4096, 100), Charge(1, 4096, 100))
    gate.forget_namespace("team-a")
    assert gate.usage("team-a") == Charge() and gate.ledger.namespaces() == []
    assert list(gate.last_limits) == ["team-b"] and gate.usage("team-b") == Charge(1, 4096, 100)
    assert denials.forgotten == ["team-a"]
    # The deleted namespace's object is deleted with it (in the background); the other's stays.
    async with asyncio.timeout(HANG):
        while store.get("configmap", object_name("team-a"), namespace=RELEASE) is not None:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    assert [e.charge for e in stored(store, "team-b").values()] == [Charge(1, 4096, 100)]
    gate.forget_namespace("never-reviewed")  # nothing kept for it: nothing to drop, no error
    assert denials.forgotten == ["team-a", "never-reviewed"]
    await close(gate)


def renamed(p: PodRecord, **meta: object) -> PodRecord:
    """`p` with its name and generateName replaced (None: left out)."""
    kept = {k: v for k, v in p["metadata"].items() if k not in ("name", "generateName")}
    return as_pod({**p, "metadata": {**kept, **{k: v for k, v in meta.items() if v is not None}}})


UNRECORDED = (
    "namespace team-a: GPU quota cannot be checked right now: the webhook could not record the pod's "
    "reservation with the API server (the API server did not answer); it refuses rather than risk "
    "exceeding the quota; retry in a few seconds"
)
FULL = (
    "namespace team-a: too many GPU pods are being admitted at once (the shared quota reservations are "
    "full); retry in a few seconds"
)
NO_VGPU = "namespace team-a: vgpu-number quota exceeded: requested 1 vGPU, in use 0 vGPUs of 0 vGPUs"


@dataclass
class Refusal:
    """One way a review is refused, and what the counter and the log must say of it."""

    labels: dict[str, str]
    meta: dict[str, object]  # the pod's name and generateName
    reason: str
    shown: str  # the pod as the log names it
    message: str | None = None  # the whole denial, where the test pins it
    gate: Callable[[], NamespaceQuota] = make_gate
    gpu: int | None = 81920


ZERO_VGPUS = {QUOTA_NUMBER_LABEL: "0"}
REFUSALS = [
    Refusal({QUOTA_MEMORY_LABEL: "lots"}, {"name": "p1"}, "invalid-label", "p1"),
    Refusal(MEM_80G, {"name": "p1"}, "unsized", "p1", gpu=None),
    Refusal(
        MEM_80G,
        {"name": "p1"},
        "unrecorded",
        "p1",
        UNRECORDED,
        failing_gate,
    ),
    Refusal(MEM_80G, {"generateName": "job-"}, "unrecorded", "job-*", FULL, full_gate),
    Refusal(ZERO_VGPUS, {"generateName": "job-"}, "vgpu-number", "job-*", NO_VGPU),
    Refusal(ZERO_VGPUS, {}, "vgpu-number", "*", NO_VGPU),
    # Names that are not text are not shown.
    Refusal(ZERO_VGPUS, {"name": 5, "generateName": "job-"}, "vgpu-number", "job-*", NO_VGPU),
    Refusal(ZERO_VGPUS, {"generateName": ["job-"]}, "vgpu-number", "*", NO_VGPU),
]


@pytest.mark.parametrize("case", REFUSALS)
def test_each_denial_is_counted_and_logged_with_its_reason_and_pod(
    case: Refusal, caplog: pytest.LogCaptureFixture
) -> None:
    gate = case.gate()
    denials = Denials()
    gate.denials = denials
    pod = renamed(make_pod(None, percent=50), **case.meta)
    with caplog.at_level(logging.INFO, logger="kube_vgpu.webhook.quota"):
        denial = admit(gate, pod, case.labels, gpu=case.gpu)
    assert denial is not None
    if case.message is not None:
        assert denial == case.message
    assert denials.denied_for == [("team-a", case.reason)]
    # What the quota step logs (the shared book logs a failed write on its own).
    assert [r.getMessage() for r in caplog.records if r.filename == "gate.py"] == [
        f"event=quota_denied namespace=team-a pod={case.shown} reason={case.reason} message={denial!r}"
    ]


def test_each_admission_is_logged_at_debug_with_its_charge(caplog: pytest.LogCaptureFixture) -> None:
    gate = make_gate()
    with caplog.at_level(logging.DEBUG, logger="kube_vgpu.webhook.quota"):
        assert admit(gate, make_pod(1024, cores=30, name="a"), MEM_80G, review="uid-a") is None
        assert (
            admit(gate, make_pod(2048, number=2, generate_name="job-"), MEM_80G, review="uid-b", dry_run=True)
            is None
        )
    assert [r.getMessage() for r in caplog.records] == [
        "event=quota_admitted namespace=team-a pod=a uid=uid-a number=1 memory_mib=1024 cores=30 "
        "dry_run=False",
        "event=quota_admitted namespace=team-a pod=job-* uid=uid-b number=2 memory_mib=4096 cores=200 "
        "dry_run=True",
    ]


def test_a_sidecar_is_charged_with_the_app_containers_at_admission() -> None:
    gate = make_gate()
    p = make_pod(1000, name="with-sidecar")
    p["spec"]["initContainers"] = [
        {"name": "side", "restartPolicy": "Always", "resources": {"limits": {NAMES.memory: "2000"}}}
    ]
    labels = {QUOTA_MEMORY_LABEL: "3000"}
    assert admit(gate, p, labels) is None
    assert gate.usage("team-a") == Charge(2, 3000, 200)
    assert admit(gate, make_pod(1, name="one-more"), labels) is not None


def two_mode_inventory() -> Inventory:
    inventory = Inventory()
    inventory.upsert(gpu_node("small", "hami-core", [(A100, 40960)]))
    inventory.upsert(gpu_node("big", "mig", [(H100, 81920)]))
    return inventory


def test_cache_pods_are_sized_in_the_default_mode_and_with_no_annotations_at_all() -> None:
    inventory = two_mode_inventory()
    bare = in_cache(make_pod(None, percent=50, name="bare"))
    del bare["metadata"]["annotations"]
    assert placement_sizer(lambda: inventory, NAMES, "hami-core")(bare) == 40960
    assert placement_sizer(lambda: inventory, NAMES, "mig")(bare) == 81920


def test_the_mig_slot_of_a_pod_follows_its_mode() -> None:
    inventory = two_mode_inventory()
    size = mig_slot_sizer(lambda: inventory, default_device_config, NAMES, "mig")
    bare = in_cache(make_pod(1, name="bare"))
    del bare["metadata"]["annotations"]
    slot = size(bare)  # the default mode, mig here
    assert slot is not None and slot(1) == 9984  # the H100 80GB's 1g.10gb
    assert size(in_cache(make_pod(1, name="h", annotations={VGPU_MODE: "hami-core"}))) is None
    hami_default = mig_slot_sizer(lambda: inventory, default_device_config, NAMES, "hami-core")
    assert hami_default(bare) is None
    slot = hami_default(in_cache(make_pod(1, name="m", annotations={VGPU_MODE: "mig"})))
    assert slot is not None and slot(1) == 9984


# A geometry where the smaller card has the larger smallest slot (a custom ConfigMap may say so).
BIG_SMALL_SLOTS = parse_device_config(
    """\
nvidia:
  resourceCountName: volcano.sh/vgpu-number
  resourceMemoryName: volcano.sh/vgpu-memory
  resourceMemoryPercentageName: volcano.sh/vgpu-memory-percentage
  resourceCoreName: volcano.sh/vgpu-cores
  knownMigGeometries:
  - models: ["A100-PCIE-40GB"]
    allowedGeometries:
    - group: group1
      geometries: [{name: 1g.12gb, memory: 12000, count: 3}]
  - models: ["H100 80GB HBM3"]
    allowedGeometries:
    - group: group1
      geometries: [{name: 1g.10gb, memory: 9984, count: 7}]
    - group: group2
      geometries: [{name: 7g.80gb, memory: 81152, count: 1}]
"""
)


def test_the_mig_slot_weighs_every_gpu_of_the_mode_even_ones_smaller_than_the_largest_ask() -> None:
    # One node holds both cards: the pod's small container may land on the A100 next to its big
    # one on the H100, so its slot is the A100's 12000 MiB, not the H100's 9984.
    inventory = Inventory()
    inventory.upsert(gpu_node("mixed", "mig", [(A100, 40960), (H100, 81920)]))
    pod = in_cache(make_pod(60000, name="two", annotations={VGPU_MODE: "mig"}))
    pod["spec"]["containers"].append({"name": "small", "resources": {"limits": {NAMES.memory: "1"}}})
    slot = mig_slot_sizer(lambda: inventory, lambda: BIG_SMALL_SLOTS, NAMES, "hami-core")(pod)
    assert slot is not None and slot(1) == 12000 and slot(60000) == 81152


# -- each refusal says why the charge is what it is (issue 34) -------------------------------------------


def test_a_container_with_no_sm_limit_is_told_it_counts_the_whole_gpu() -> None:
    gate = make_gate()
    labels = {QUOTA_CORES_LABEL: "140"}
    assert admit(gate, make_pod(1000, cores=50, name="a"), labels) is None
    assert admit(gate, make_pod(1000, name="whole"), labels) == (
        "namespace team-a: vgpu-cores quota exceeded: requested 100%, in use 50% of 140% "
        "(container 'main' sets no volcano.sh/vgpu-cores limit: no SM limit counts as the whole GPU, "
        "100% per vGPU)"
    )
    assert admit(gate, make_pod(1000, cores=0, name="zero"), labels) == (
        "namespace team-a: vgpu-cores quota exceeded: requested 100%, in use 50% of 140% "
        "(container 'main' sets no volcano.sh/vgpu-cores limit: no SM limit counts as the whole GPU, "
        "100% per vGPU)"
    )
    # One step away: a container that states its limit is told the figure alone.
    assert admit(gate, make_pod(1000, cores=91, name="stated"), labels) == (
        "namespace team-a: vgpu-cores quota exceeded: requested 91%, in use 50% of 140%"
    )


def mig_gate() -> NamespaceQuota:
    """A gate whose cluster has one H100 80GB node in MIG mode and the shipped MIG geometry."""
    inventory = Inventory()
    inventory.upsert(gpu_node("h100", "mig", [(H100, 81920)]))
    return make_gate(
        gpu_size=placement_sizer(lambda: inventory, NAMES, "hami-core"),
        slot_size=mig_slot_sizer(lambda: inventory, default_device_config, NAMES, "hami-core"),
    )


def test_a_mig_refusal_names_the_slot_the_request_rounds_up_to() -> None:
    gate = mig_gate()
    labels = {QUOTA_MEMORY_LABEL: "19960"}
    running = in_cache(make_pod(9000, name="running", annotations={VGPU_MODE: "mig"}))
    gate.ledger.pod_seen(running)
    assert gate.usage("team-a") == Charge(1, 9984, 100)
    assert admit(gate, make_pod(9000, cores=10, name="next", annotations={VGPU_MODE: "mig"}), labels) == (
        "namespace team-a: vgpu-memory quota exceeded: requested 9984 MiB, in use 9984 MiB of 19960 MiB "
        "(container 'main' asks 9000 MiB per vGPU, held as a 1g.10gb slot of 9984 MiB)"
    )
    big = make_pod(19000, cores=10, name="big", annotations={VGPU_MODE: "mig"})
    assert admit(gate, big, labels) == (
        "namespace team-a: vgpu-memory quota exceeded: requested 20096 MiB, in use 9984 MiB of 19960 MiB "
        "(container 'main' asks 19000 MiB per vGPU, held as a 2g.20gb slot of 20096 MiB)"
    )
    # One step away: the same MiB in hami-core mode is charged as asked, and the message says no more.
    plain = make_pod(10977, cores=10, name="plain", annotations={VGPU_MODE: "hami-core"})
    assert admit(gate, plain, labels) == (
        "namespace team-a: vgpu-memory quota exceeded: requested 10977 MiB, in use 9984 MiB of 19960 MiB"
    )
    assert (
        admit(gate, make_pod(9976, cores=10, name="fits", annotations={VGPU_MODE: "hami-core"}), labels)
        is None
    )


def test_a_share_of_a_card_is_told_the_gpu_it_was_sized_against() -> None:
    gate = make_gate()
    labels = {QUOTA_MEMORY_LABEL: "40000"}
    assert admit(gate, make_pod(None, percent=50, cores=10, name="half"), labels, gpu=81920) == (
        "namespace team-a: vgpu-memory quota exceeded: requested 40960 MiB, in use 0 MiB of 40000 MiB "
        "(container 'main' asks 50% of a GPU's memory: 40960 MiB per vGPU on the largest GPU it may land "
        "on (81920 MiB))"
    )
    assert admit(gate, make_pod(None, number=1, cores=10, name="whole"), labels, gpu=81920) == (
        "namespace team-a: vgpu-memory quota exceeded: requested 81920 MiB, in use 0 MiB of 40000 MiB "
        "(container 'main' sets neither volcano.sh/vgpu-memory nor volcano.sh/vgpu-memory-percentage, so "
        "it holds a whole GPU: 81920 MiB per vGPU on the largest GPU it may land on (81920 MiB))"
    )


def test_the_cache_ledger_sizes_pods_against_the_inventory_and_the_mig_geometry() -> None:
    inventory = two_mode_inventory()  # hami-core A100 40960 MiB ("small"), mig H100 80GB ("big")
    inventory.upsert(gpu_node("large", "hami-core", [(H100, 81920)]))
    clocks = Clocks()
    ledger = pod_ledger(
        lambda: inventory,
        default_device_config,
        NAMES,
        "hami-core",
        pending_seconds=PENDING,
        clock=lambda: clocks.mono,
        wall_clock=lambda: clocks.wall,
        stream_current_at=lambda: 7.0,
    )
    ledger.pod_seen(in_cache(make_pod(None, percent=50, name="half")))  # the largest hami-core GPU
    ledger.pod_seen(in_cache(make_pod(9000, name="mig", annotations={VGPU_MODE: "mig"})))  # 1g.10gb
    # Booked on the small A100: believed (its size is known from the inventory), so half of 40960.
    on_small = encode_pod_devices([[DeviceRecord(gpu_uuid("small", 0), 20480, 0)]])
    booked = in_cache(make_pod(None, percent=50, name="booked", annotations={VGPU_IDS_NEW: on_small}))
    ledger.pod_seen(booked)
    assert ledger.usage("team-a") == Charge(3, 40960 + 9984 + 20480, 300)
    assert ledger.pods("team-a") == ["booked", "half", "mig"] and ledger.unsized("team-a") == []
    assert ledger.cache_state("team-a").stream_current_at == 7.0
    # A terminating pod stops counting at its deadline, on the wall clock given.
    gone_at = in_cache(make_pod(1000, name="going", deletion=("2023-11-14T22:13:30+00:00", 0)))
    ledger.pod_seen(gone_at)  # 1_700_000_010: 10 s after the clocks' wall time
    assert ledger.usage("team-a").memory_mib == 40960 + 9984 + 20480 + 1000
    clocks.advance(10)
    assert ledger.usage("team-a").memory_mib == 40960 + 9984 + 20480


def test_a_slot_with_no_name_is_given_by_its_size() -> None:
    gate = make_gate(slot_size=lambda pod: lambda mib: 10240 if mib <= 10240 else 20480)
    assert admit(gate, make_pod(9000, cores=10, name="m"), {QUOTA_MEMORY_LABEL: "10000"}) == (
        "namespace team-a: vgpu-memory quota exceeded: requested 10240 MiB, in use 0 MiB of 10000 MiB "
        "(container 'main' asks 9000 MiB per vGPU, held as a MIG slot of 10240 MiB)"
    )


def test_the_cache_ledger_is_wired_to_the_mode_clocks_and_lifetime_given() -> None:
    inventory = two_mode_inventory()
    clocks = Clocks()
    ledger = pod_ledger(
        lambda: inventory,
        default_device_config,
        NAMES,
        "mig",
        pending_seconds=PENDING,
        clock=lambda: clocks.mono,
        wall_clock=lambda: clocks.wall,
    )
    bare = in_cache(make_pod(9000, name="bare", uid="u-bare"))
    del bare["metadata"]["annotations"]
    ledger.pod_seen(bare)  # the default mode, mig: the H100's 1g.10gb slot
    # Booked on a GPU the inventory does not know: the booking is not believed, the pod is sized
    # (mig too: half the H100, 40960 MiB, in its 7g.80gb slot of 81152 MiB).
    unknown = encode_pod_devices([[DeviceRecord("GPU-00000000-0000-0000-0000-00000000dead", 1, 0)]])
    ledger.pod_seen(in_cache(make_pod(None, percent=50, name="odd", annotations={VGPU_IDS_NEW: unknown})))
    assert ledger.usage("team-a") == Charge(2, 9984 + 81152, 200)
    clocks.advance(5)
    gone = in_cache(make_pod(1, name="gone", uid="u-gone"))
    ledger.pod_seen(gone)
    ledger.pod_gone(gone)
    state = ledger.cache_state("team-a")
    assert state.shown_for("u-bare") == 5.0 and state.released("u-gone")
    clocks.advance(2 * PENDING)  # two lifetimes on: the deletion is forgotten
    assert not ledger.cache_state("team-a").accounts_for("u-gone")
