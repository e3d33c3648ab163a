"""Namespace GPU quotas at admission (SPEC §2.2 step 1): limits, charges, messages, relabels, dryRun."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from kube_vgpu.contract.names import (
    QUOTA_CORES_LABEL,
    QUOTA_MEMORY_LABEL,
    QUOTA_NUMBER_LABEL,
    USE_GPUTYPE,
    VGPU_MODE,
)
from kube_vgpu.contract.resources import parse_pod
from kube_vgpu.webhook.admission import gates
from kube_vgpu.webhook.placement.inventory import Inventory
from kube_vgpu.webhook.quota.charge import Charge
from kube_vgpu.webhook.quota.gate import NamespaceQuota, placement_sizer
from kube_vgpu.webhook.quota.shared import Answer, Ask, CacheState, Entry, Unrecorded, decide
from tests.support.webhook import A100, H100, gpu_node
from tests.support.webhook_quota import MEM_80G, NAMES, admit, in_cache, make_gate, make_pod


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
    assert gate.ledger.usage("team-a") == Charge(2, 81920, 200)
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
    plain = {"metadata": {"namespace": "team-a", "name": "web"}, "spec": {"containers": [{"name": "c"}]}}
    assert admit(gate, plain, labels) is None
    assert gate.ledger.usage("team-a") == Charge()


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
    assert gate.ledger.usage("team-a").memory_mib == 61440
    message = admit(gate, make_pod(None, percent=10, name="more"), labels, gpu=24576)
    assert message is not None and "requested 2457 MiB, in use 61440 MiB of 61440 MiB" in message


def test_a_share_of_a_card_with_no_gpu_to_size_it_is_denied_only_under_a_memory_quota() -> None:
    gate = make_gate()
    message = admit(gate, make_pod(None, percent=50, name="a"), MEM_80G, gpu=None)
    assert message is not None and "vgpu-memory" in message and "team-a" in message
    assert admit(gate, make_pod(None, percent=50, name="a"), {QUOTA_NUMBER_LABEL: "1"}, gpu=None) is None
    assert gate.ledger.usage("team-a") == Charge(1, 0, 100)


def test_dry_run_is_decided_the_same_way_and_reserves_nothing() -> None:
    gate = make_gate()
    gate.ledger.pod_seen(in_cache(make_pod(65536, name="old")))
    assert admit(gate, make_pod(16384, name="a"), MEM_80G, dry_run=True) is None
    assert admit(gate, make_pod(16385, name="a"), MEM_80G, dry_run=True) == (
        "namespace team-a: vgpu-memory quota exceeded: requested 16385 MiB, in use 65536 MiB of 81920 MiB"
    )
    assert gate.ledger.usage("team-a") == Charge(1, 65536, 100)
    assert gate.ledger.reserved("team-a") == Charge()


def test_namespaces_are_counted_apart() -> None:
    gate = make_gate()
    assert admit(gate, make_pod(81920, name="a", namespace="team-a"), MEM_80G) is None
    assert admit(gate, make_pod(81920, name="a", namespace="team-b"), MEM_80G) is None
    assert admit(gate, make_pod(1, name="b", namespace="team-b"), MEM_80G) is not None


def test_init_containers_are_charged_as_kubernetes_counts_them() -> None:
    gate = make_gate()
    p = make_pod(1000, name="with-init")
    p["spec"]["initContainers"] = [
        {"name": "warm", "resources": {"limits": {NAMES.count: "2", NAMES.memory: "8000"}}}
    ]
    labels = {QUOTA_MEMORY_LABEL: "16000", QUOTA_NUMBER_LABEL: "2"}
    assert admit(gate, p, labels) is None
    assert gate.ledger.usage("team-a") == Charge(2, 16000, 200)
    gate.ledger.pod_seen(in_cache(p))
    assert gate.ledger.usage("team-a") == Charge(2, 16000, 200)


def test_the_gate_is_the_quota_step_the_admission_pipeline_calls() -> None:
    step: gates.QuotaGate = make_gate()  # mypy checks the Protocol; the call checks the keywords
    p = make_pod(1024, name="a")
    assert asyncio.run(
        step.admit(
            namespace="team-a",
            namespace_labels={QUOTA_NUMBER_LABEL: "0"},
            pod=p,
            request=parse_pod(p, NAMES),
            largest_gpu_mib=None,
            pod_uid="r",
            dry_run=False,
        )
    )


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
    assert gate.ledger.usage("team-a").memory_mib == 40960 + 20480
    broken = in_cache(make_pod(None, percent=50, name="x", annotations={VGPU_MODE: "fast"}))
    assert size(broken) is None


# -- the quota step with reservations shared between replicas (the SharedBook protocol) -------------------


class Book:
    """A SharedBook holding the entries in memory: the pure decision, without the API round trip."""

    def __init__(self, fail: Exception | None = None, max_entries: int = 100) -> None:
        self.entries: dict[str, Entry] = {}
        self.asks: list[tuple[str, Ask]] = []
        self.fail = fail
        self.max_entries = max_entries
        self.pods = Charge()

    async def decide(self, namespace: str, ask: Ask) -> Answer:
        self.asks.append((namespace, ask))
        if self.fail is not None:
            raise self.fail
        state = CacheState(self.pods, lambda uid: False, lambda uid: False, lambda uid: None)
        self.entries, (answer,) = decide(
            self.entries, [ask], state, now=0.0, lifetime=120.0, max_entries=self.max_entries
        )
        return answer

    def in_flight(self, namespace: str) -> Charge:
        return sum((e.charge for e in self.entries.values()), Charge())

    def namespaces(self) -> list[str]:
        return ["team-a"] if self.entries else []

    def forget(self, namespace: str) -> None:
        self.entries.clear()

    def namespaces_listed(self, exists: Callable[[str], bool]) -> None:
        pass


def shared_gate(book: Book) -> NamespaceQuota:
    gate = make_gate()
    gate.shared = book
    return gate


def test_with_a_shared_book_each_pod_is_asked_for_by_its_uid_charge_and_limits() -> None:
    book = Book()
    gate = shared_gate(book)
    assert admit(gate, make_pod(40960, name="a"), MEM_80G, review="uid-a") is None
    assert admit(gate, make_pod(40960, name="b"), MEM_80G, review="uid-b", dry_run=True) is None
    (_, first), (_, second) = book.asks
    assert (first.uid, first.charge, first.limits.memory_mib, first.reserve) == (
        "uid-a",
        Charge(1, 40960, 100),
        81920,
        True,
    )
    assert (second.uid, second.reserve) == ("uid-b", False)  # a dry run books nothing
    assert set(book.entries) == {"uid-a"} and gate.reserved("team-a") == Charge(1, 40960, 100)
    assert gate.usage("team-a") == Charge(1, 40960, 100)
    # Over quota: the denial names the usage the book saw.
    message = admit(gate, make_pod(40961, name="c"), MEM_80G, review="uid-c")
    assert message == (
        "namespace team-a: vgpu-memory quota exceeded: requested 40961 MiB, in use 40960 MiB of 81920 MiB"
    )
    # A namespace with no quota costs the book nothing.
    asks = len(book.asks)
    assert admit(gate, make_pod(10**6, name="d"), {}, review="uid-d") is None
    assert len(book.asks) == asks
    gate.forget_namespace("team-a")
    assert book.entries == {} and "team-a" not in gate.last_limits


def test_with_a_shared_book_a_review_that_cannot_be_recorded_is_refused() -> None:
    message = admit(shared_gate(Book(fail=Unrecorded("the API server did not answer"))), make_pod(1), MEM_80G)
    assert message is not None and "quota cannot be checked right now" in message
    assert "the API server did not answer" in message and "retry in a few seconds" in message
    full = Book(max_entries=0)
    message = admit(shared_gate(full), make_pod(1), MEM_80G)
    assert message is not None and "too many GPU pods are being admitted at once" in message
