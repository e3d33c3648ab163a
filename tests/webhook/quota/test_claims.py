"""ResourceClaims of kube-vgpu's DRA classes against namespace GPU quotas: the charge, the ledger,
and the gate with two replicas sharing one reservation store."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import pytest

from kube_vgpu.contract.dra import DEVICE_CLASS, MEMORY_MIN_MIB
from kube_vgpu.contract.mig.shipped import default_device_config
from kube_vgpu.contract.names import QUOTA_CORES_LABEL, QUOTA_MEMORY_LABEL, QUOTA_NUMBER_LABEL
from kube_vgpu.kubeapi.client import ApiUnavailable
from kube_vgpu.node.dra import slices
from kube_vgpu.webhook.admission.gates import ClaimQuotaRequest
from kube_vgpu.webhook.placement.inventory import Inventory
from kube_vgpu.webhook.quota.charge import Charge, parse_limits
from kube_vgpu.webhook.quota.claims import (
    ADMIN_ACCESS_LABEL,
    MAX_REQUESTS,
    ClaimError,
    ClaimRequest,
    admin_free,
    all_devices_message,
    claim_charge,
    claim_reasons,
    cores_percent,
    memory_mib,
    names_class,
    parse_claim,
    quantity,
)
from kube_vgpu.webhook.quota.gate import NamespaceQuota
from kube_vgpu.webhook.quota.ledger import QuotaLedger
from kube_vgpu.webhook.quota.shared import MAX_ENTRIES
from kube_vgpu.webhook.quota.sizing import pod_ledger
from kube_vgpu.webhook.records import ClaimRecord
from kube_vgpu.webhook.reduced import claim_reducer
from tests.support.memory_store import MemoryStore
from tests.support.records import as_claim
from tests.support.webhook import A100, H100, gpu_node
from tests.support.webhook_quota import NAMES, Clocks, close, make_gate

CLASSES = frozenset({DEVICE_CLASS})
GIB = 1024
_uids = itertools.count()


def exact(
    name: str = "gpu",
    *,
    memory: str | None = None,
    cores: str | None = None,
    count: int | None = None,
    device_class: str = DEVICE_CLASS,
    mode: str | None = None,
) -> dict[str, Any]:
    """One device request body (`exactly`, or a firstAvailable alternative with its name)."""
    body: dict[str, Any] = {"deviceClassName": device_class}
    amounts = {k: v for k, v in (("memory", memory), ("cores", cores)) if v is not None}
    if amounts:
        body["capacity"] = {"requests": amounts}
    if count is not None:
        body["count"] = count
    if mode is not None:
        body["allocationMode"] = mode
    return {"name": name, **body}


def claim(
    *requests: Mapping[str, Any],
    namespace: str = "team-a",
    name: str | None = None,
    uid: str | None = None,
    first_available: bool = False,
) -> ClaimRecord:
    """A ResourceClaim whose requests are `exactly` bodies (or one firstAvailable list of them)."""
    if first_available:
        devices: list[dict[str, Any]] = [{"name": "gpu", "firstAvailable": [dict(r) for r in requests]}]
    else:
        devices = [
            {"name": r["name"], "exactly": {k: v for k, v in r.items() if k != "name"}} for r in requests
        ]
    n = next(_uids)
    return as_claim(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {
                "name": name or f"claim-{n}",
                "namespace": namespace,
                "uid": uid or f"claim-uid-{n}",
            },
            "spec": {"devices": {"requests": devices}},
        }
    )


def charge_of(obj: Mapping[str, Any], gpu_mib: int | None = 81920, *, admin_free: bool = False) -> Charge:
    return claim_charge(parse_claim(obj, CLASSES, admin_free=admin_free), gpu_mib)


# -- the charge -------------------------------------------------------------------------------------


def test_the_policy_constant_is_the_drivers() -> None:
    assert slices.MEMORY_MIN_MIB == MEMORY_MIN_MIB
    assert slices.DRIVER == DEVICE_CLASS


def test_memory_and_cores_rounded_up_as_the_request_policy_does() -> None:
    assert charge_of(claim(exact(memory="20Gi", cores="30"))) == Charge(1, 20 * GIB, 30)
    # Below the minimum: the minimum; a fraction of a MiB: the next MiB; fractional cores: up.
    assert charge_of(claim(exact(memory="100Mi", cores="0.5"))) == Charge(1, MEMORY_MIN_MIB, 1)
    assert charge_of(claim(exact(memory="256Mi", cores="1"))) == Charge(1, 256, 1)
    assert charge_of(claim(exact(memory="257Mi", cores="1"))) == Charge(1, 257, 1)
    assert charge_of(claim(exact(memory=str(300 * 1024 * 1024 + 1), cores="29.01"))) == Charge(1, 301, 30)
    assert charge_of(claim(exact(memory="0", cores="0"))) == Charge(1, MEMORY_MIN_MIB, 1)
    # Decimal suffixes are bytes too: 1G = 10^9 bytes = 953.67 MiB, charged 954.
    assert charge_of(claim(exact(memory="1G", cores="100"))) == Charge(1, 954, 100)


def test_count_multiplies_every_resource() -> None:
    assert charge_of(claim(exact(memory="10Gi", cores="20", count=3))) == Charge(3, 30 * GIB, 60)


def test_a_request_naming_no_memory_is_charged_the_largest_gpu_and_no_cores_100() -> None:
    assert charge_of(claim(exact()), gpu_mib=81920) == Charge(1, 81920, 100)
    assert charge_of(claim(exact(count=2)), gpu_mib=40960) == Charge(2, 2 * 40960, 200)
    assert parse_claim(claim(exact()), CLASSES).needs_gpu_size
    assert not parse_claim(claim(exact(memory="1Gi")), CLASSES).needs_gpu_size


def test_first_available_is_charged_its_most_expensive_alternative() -> None:
    obj = claim(
        exact("small", memory="10Gi", cores="50", count=2),
        exact("big", memory="40Gi", cores="20"),
        exact("other", device_class="gpu.nvidia.com", count=8),
        first_available=True,
    )
    # Per resource: 2 devices from `small`, 40 GiB from `big`, 100 cores from `small`; the other
    # driver's alternative costs nothing.
    assert charge_of(obj) == Charge(2, 40 * GIB, 100)
    # An alternative naming no memory is the whole largest GPU.
    assert charge_of(claim(exact("a", memory="1Gi"), exact("b"), first_available=True)) == Charge(
        1, 81920, 100
    )


def test_requests_of_other_classes_cost_nothing() -> None:
    mixed = claim(exact("ours", memory="8Gi", cores="10"), exact("nic", device_class="nic.example.com"))
    assert charge_of(mixed) == Charge(1, 8 * GIB, 10)
    assert not parse_claim(claim(exact(device_class="gpu.nvidia.com")), CLASSES).asks_vgpu


def test_an_admin_access_request_costs_nothing_and_its_neighbours_are_still_charged() -> None:
    """adminAccess gets no capacity (the scheduler counts such results as allocated to nobody), and
    the API server stores it only in a namespace an admin labelled: where the caller says the
    namespace is so labelled it is not charged, whatever its shape, allocationMode All included.
    adminAccess false, or a request without it, is charged."""
    whole = claim({**exact(), "adminAccess": True})
    assert not parse_claim(whole, CLASSES, admin_free=True).asks_vgpu
    assert parse_claim(whole, CLASSES, admin_free=True).admin == ("gpu",)
    assert charge_of(whole, admin_free=True) == Charge(0, 0, 0)
    every = parse_claim(claim({**exact(mode="All"), "adminAccess": True}), CLASSES, admin_free=True)
    assert every.all_devices == () and not every.asks_vgpu
    beside = claim({**exact("monitor"), "adminAccess": True}, exact("work", memory="8Gi", cores="10"))
    assert charge_of(beside, admin_free=True) == Charge(1, 8 * GIB, 10)
    assert charge_of(claim({**exact(memory="8Gi", cores="10"), "adminAccess": False}), admin_free=True) == (
        Charge(1, 8 * GIB, 10)
    )
    assert parse_claim(
        claim({**exact(mode="All"), "adminAccess": False}), CLASSES, admin_free=True
    ).all_devices == ("gpu",)


def test_an_admin_access_request_is_charged_unless_its_namespace_is_labelled_for_it() -> None:
    """Defence in depth: without the namespace label the API server demands of admin requests
    (as the webhook's cache holds the namespace), an admin request is charged like any other,
    allocationMode All included, rather than trusting that the API server refused it."""
    beside = claim({**exact("monitor"), "adminAccess": True}, exact("work", memory="8Gi", cores="10"))
    assert charge_of(beside) == Charge(2, 81920 + 8 * GIB, 110)
    parsed = parse_claim(beside, CLASSES)
    assert [r.name for r in parsed.requests] == ["monitor", "work"] and parsed.admin == ("monitor",)
    every = parse_claim(claim({**exact(mode="All"), "adminAccess": True}), CLASSES)
    assert every.all_devices == ("gpu",)
    # Another class's admin request is neither ours nor charged, labelled or not.
    theirs = claim({**exact(device_class=OTHER_CLASS), "adminAccess": True})
    assert parse_claim(theirs, CLASSES) == ClaimRequest() == parse_claim(theirs, CLASSES, admin_free=True)
    # The label, exactly as the API server reads it.
    assert admin_free({ADMIN_ACCESS_LABEL: "true"})
    for labels in ({ADMIN_ACCESS_LABEL: "True"}, {ADMIN_ACCESS_LABEL: ""}, {"other": "true"}, {}, None):
        assert not admin_free(labels)


@pytest.mark.parametrize("value", ["true", 1, "yes", [True], {"on": True}])
def test_an_admin_access_that_is_no_boolean_is_refused_naming_the_field(value: object) -> None:
    with pytest.raises(ClaimError) as caught:
        parse_claim(claim({**exact(memory="1Gi"), "adminAccess": value}), CLASSES)
    assert "spec.devices.requests[0] ('gpu').exactly.adminAccess must be true or false" in str(caught.value)


def test_a_non_boolean_admin_access_is_shown_cut_to_64_characters() -> None:
    with pytest.raises(ClaimError) as caught:
        parse_claim(claim({**exact(memory="1Gi"), "adminAccess": "y" * 80}), CLASSES)
    assert str(caught.value).endswith(f"adminAccess must be true or false, got {'y' * 64!r}")


def test_an_admin_access_request_is_still_read_whole() -> None:
    """A malformed admin request is refused like any other: the charge never depends on which
    field a bad claim gets wrong first."""
    with pytest.raises(ClaimError, match=r"capacity\.requests\.memory 'lots' is not a Kubernetes quantity"):
        parse_claim(claim({**exact(memory="lots"), "adminAccess": True}), CLASSES)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (exact(memory="-1Gi"), "capacity.requests.memory '-1Gi' is negative"),
        (exact(cores="-5"), "capacity.requests.cores '-5' is negative"),
        (exact(cores="101"), "cores is a percent of a GPU's SMs, 1 to 100"),
        (exact(memory="1e30"), "more memory than any GPU has"),
        (exact(memory="1e999999999"), "is out of any GPU's range"),
        (exact(cores="1e-999999999"), "is out of any GPU's range"),
        (exact(memory="9Ei"), "more memory than any GPU has"),
        (exact(memory="lots"), "'lots' is not a Kubernetes quantity"),
        (exact(memory="1" * 100), "is not a Kubernetes quantity"),
        (exact(count=0), "count must be a positive integer"),
        (exact(count=33), "more than the 32 devices a claim can be allocated"),
        (exact(mode="Some"), "allocationMode must be ExactCount or All"),
        ({"name": "gpu", "deviceClassName": ""}, "deviceClassName must be a non-empty string"),
    ],
)
def test_hostile_requests_are_refused_naming_the_field(body: dict[str, Any], says: str) -> None:
    with pytest.raises(ClaimError) as caught:
        parse_claim(claim(body), CLASSES)
    assert says in str(caught.value)
    assert "spec.devices.requests[0] ('gpu').exactly" in str(caught.value)


def test_memory_at_the_bound_passes_and_one_past_it_is_refused() -> None:
    assert charge_of(claim(exact(memory=f"{2**31}Mi"))).memory_mib == 2**31
    with pytest.raises(ClaimError, match="more memory than any GPU has"):
        parse_claim(claim(exact(memory=f"{2**31 + 1}Mi")), CLASSES)
    assert charge_of(claim(exact(cores="100"))).cores == 100
    assert charge_of(claim(exact(count=32, memory="1Gi"))).number == 32


def test_unknown_fields_are_ignored_and_shapes_refused() -> None:
    obj = claim(exact(memory="1Gi", cores="10"))
    obj["spec"]["devices"]["requests"][0]["exactly"]["flavour"] = {"deep": [1]}  # type: ignore[typeddict-unknown-key]
    obj["spec"]["surprise"] = True  # type: ignore[typeddict-unknown-key]
    assert charge_of(obj) == Charge(1, 1024, 10)
    for bad, says in (
        ({"spec": []}, "spec must be an object"),
        ({"spec": {"devices": {"requests": {}}}}, "requests must be a list"),
        ({"spec": {"devices": {"requests": ["x"]}}}, "requests[0] must be an object"),
        ({"spec": {"devices": {"requests": [{"name": "a"}]}}}, "exactly one of exactly and firstAvailable"),
        (
            {"spec": {"devices": {"requests": [{"name": "a", "exactly": {}, "firstAvailable": []}]}}},
            "exactly one of exactly and firstAvailable",
        ),
        ({"spec": {"devices": {"requests": [{"name": "a", "firstAvailable": []}]}}}, "non-empty list"),
    ):
        with pytest.raises(ClaimError) as caught:
            parse_claim(bad, CLASSES)
        assert says in str(caught.value)


def test_a_thousand_requests_are_refused_by_their_count_alone() -> None:
    """Bounded work: Kubernetes allows 32 requests; 1000 are refused before any is read."""
    body = exact(memory="1Gi")
    at_limit = claim(*[{**body, "name": f"r{i}"} for i in range(MAX_REQUESTS)])
    assert charge_of(at_limit).number == MAX_REQUESTS
    many = claim(*[{**body, "name": f"r{i}"} for i in range(1000)])
    started = time.perf_counter()
    with pytest.raises(ClaimError, match="has 1000 requests; Kubernetes allows 32"):
        parse_claim(many, CLASSES)
    assert time.perf_counter() - started < 5.0  # generous: only a walk of every request could come near
    nine = claim(*[exact(f"s{i}", memory="1Gi") for i in range(9)], first_available=True)
    with pytest.raises(ClaimError, match="has 9 alternatives; Kubernetes allows 8"):
        parse_claim(nine, CLASSES)


# -- the ledger: claims the cache shows count until deleted -----------------------------------------


def claim_gate(clocks: Clocks, store: MemoryStore, largest: int | None = 81920) -> NamespaceQuota:
    return make_gate(clocks, store=store, claim_classes=CLASSES, largest_gpu=lambda: largest)


def ask(
    obj: Mapping[str, Any], labels: Mapping[str, str] | None, *, dry_run: bool = False
) -> ClaimQuotaRequest:
    return ClaimQuotaRequest(
        namespace=obj["metadata"]["namespace"],
        namespace_labels=labels,
        claim_name=obj["metadata"]["name"],
        request=parse_claim(obj, CLASSES),
        largest_gpu_mib=81920,
        claim_uid=obj["metadata"]["uid"],
        dry_run=dry_run,
    )


def test_the_ledger_counts_a_claim_until_it_is_deleted() -> None:
    gate = claim_gate(Clocks(), MemoryStore())
    ledger = gate.ledger
    a = claim(exact(memory="20Gi", cores="30"))
    whole = claim(exact())
    other = claim(exact(device_class="gpu.nvidia.com"))
    for obj in (a, whole, other):
        ledger.claim_seen(obj)
    assert ledger.usage("team-a") == Charge(2, 20 * GIB + 81920, 130)
    assert ledger.pods("team-a") == sorted(
        [f"resourceclaim/{a['metadata']['name']}", f"resourceclaim/{whole['metadata']['name']}"]
    )
    ledger.claim_seen(a)  # modified (allocated): charged once
    assert ledger.usage("team-a") == Charge(2, 20 * GIB + 81920, 130)
    ledger.claim_gone(a)
    assert ledger.usage("team-a") == Charge(1, 81920, 100)
    # A re-list without `whole` drops it; pods are untouched by a claim re-list and vice versa.
    ledger.resync([])  # pods re-listed: claims stay
    assert ledger.usage("team-a") == Charge(1, 81920, 100)
    ledger.resync_claims([])
    assert ledger.usage("team-a") == Charge()


def test_the_ledger_counts_no_admin_access_claim_read_back_from_the_cache() -> None:
    """After a restart the webhook charges the claims its cache lists, reduced as the cache keeps
    them: the adminAccess flag must survive the reduction, or a monitoring claim would be charged
    a whole GPU per device."""
    reduce = claim_reducer(CLASSES)
    ledger = claim_gate(Clocks(), MemoryStore()).ledger
    monitor = claim({**exact(), "adminAccess": True})
    work = claim(exact(memory="20Gi", cores="30"))
    for obj in (monitor, work):
        slim = reduce(dict(obj))
        assert slim is not None
        ledger.claim_seen(slim)
    assert ledger.usage("team-a") == Charge(1, 20 * GIB, 30)
    assert ledger.pods("team-a") == [f"resourceclaim/{work['metadata']['name']}"]


# -- the gate: two replicas sharing one store -------------------------------------------------------


MEMORY_60G = {QUOTA_MEMORY_LABEL: str(60 * GIB)}


def test_two_replicas_refuse_the_claim_that_would_pass_the_memory_label() -> None:
    """Replica A admits 40 GiB; replica B, whose cache has not seen that claim yet, must refuse the
    next 30 GiB (70 > 60) from the shared reservation, with a message naming the figures."""
    clocks, store = Clocks(), MemoryStore()
    a, b = claim_gate(clocks, store), claim_gate(clocks, store)
    first = claim(exact(memory="40Gi", cores="10"))
    second = claim(exact(memory="30Gi", cores="10"))
    third = claim(exact(memory="20Gi", cores="10"))

    async def run() -> tuple[str | None, str | None, str | None]:
        try:
            one = await a.admit_claim(ask(first, MEMORY_60G))
            two = await b.admit_claim(ask(second, MEMORY_60G))
            three = await b.admit_claim(ask(third, MEMORY_60G))
            return one, two, three
        finally:
            await close(a)
            await close(b)

    one, two, three = asyncio.run(run())
    assert one is None
    assert two is not None
    assert two.startswith(
        f"ResourceClaim {second['metadata']['name']}: namespace team-a: vgpu-memory quota exceeded"
    )
    assert "requested 30720 MiB, in use 40960 MiB of 61440 MiB" in two
    assert three is None  # 40 + 20 = 60: exactly the label


def test_a_deleted_claim_releases_its_charge() -> None:
    clocks, store = Clocks(), MemoryStore()
    gate = claim_gate(clocks, store)
    first = claim(exact(memory="40Gi"))
    second = claim(exact(memory="30Gi"))

    async def run() -> tuple[str | None, str | None]:
        try:
            assert await gate.admit_claim(ask(first, MEMORY_60G)) is None
            gate.ledger.claim_seen(first)  # the cache shows it
            refused = await gate.admit_claim(ask(second, MEMORY_60G))
            gate.ledger.claim_gone(first)  # deleted
            return refused, await gate.admit_claim(ask(second, MEMORY_60G))
        finally:
            await close(gate)

    refused, admitted = asyncio.run(run())
    assert refused is not None and "in use 40960 MiB of 61440 MiB" in refused
    assert admitted is None


def test_dry_run_reserves_nothing() -> None:
    clocks, store = Clocks(), MemoryStore()
    gate = claim_gate(clocks, store)
    big = claim(exact(memory="40Gi"))

    async def run() -> list[str | None]:
        try:
            out = [await gate.admit_claim(ask(big, MEMORY_60G, dry_run=True)) for _ in range(3)]
            out.append(await gate.admit_claim(ask(claim(exact(memory="60Gi")), MEMORY_60G)))
            return out
        finally:
            await close(gate)

    assert asyncio.run(run()) == [None, None, None, None]


def test_no_memory_and_no_cores_explained_in_the_denial() -> None:
    gate = claim_gate(Clocks(), MemoryStore())
    labels = {QUOTA_MEMORY_LABEL: "40960", QUOTA_CORES_LABEL: "50"}
    obj = claim(exact())

    async def run() -> str | None:
        try:
            return await gate.admit_claim(ask(obj, labels))
        finally:
            await close(gate)

    message = asyncio.run(run())
    assert message is not None
    assert "vgpu-memory quota exceeded: requested 81920 MiB, in use 0 MiB of 40960 MiB" in message
    assert "names no memory, so it gets a whole GPU: 81920 MiB per device" in message


def test_first_available_explained_and_all_refused_in_a_quota_namespace() -> None:
    gate = claim_gate(Clocks(), MemoryStore())
    alternatives = claim(
        exact("a", memory="10Gi", cores="10"), exact("b", memory="50Gi", cores="10"), first_available=True
    )
    every = claim(exact(mode="All"))

    async def run() -> tuple[str | None, str | None, str | None]:
        try:
            one = await gate.admit_claim(ask(alternatives, {QUOTA_MEMORY_LABEL: "40960"}))
            two = await gate.admit_claim(ask(every, {QUOTA_NUMBER_LABEL: "8"}))
            three = await gate.admit_claim(ask(every, {}))  # no quota: nothing to bound
            return one, two, three
        finally:
            await close(gate)

    one, two, three = asyncio.run(run())
    assert one is not None and "requested 51200 MiB" in one and "charged the most any could cost" in one
    assert two is not None and "allocationMode All" in two and "ask allocationMode ExactCount" in two
    assert three is None


def test_a_claim_charged_a_whole_card_grows_with_the_largest_gpu_and_never_shrinks() -> None:
    """The slices and the claims are listed in any order: a claim first counted before any GPU was
    known (or a smaller one) is re-sized when a larger GPU appears, never down."""
    largest: list[int | None] = [None]
    gate = make_gate(Clocks(), store=MemoryStore(), claim_classes=CLASSES, largest_gpu=lambda: largest[0])
    ledger = gate.ledger
    whole, sized = claim(exact()), claim(exact(memory="1Gi", cores="5"))
    ledger.claim_seen(whole)
    ledger.claim_seen(sized)
    assert ledger.usage("team-a") == Charge(2, 1024, 105)
    assert ledger.unsized("team-a") == [f"resourceclaim/{whole['metadata']['name']}"]
    for known, expected in ((40960, 40960), (81920, 81920), (40960, 81920)):
        largest[0] = known
        ledger.resize_claims()
        assert ledger.usage("team-a") == Charge(2, expected + 1024, 105), known
    assert ledger.unsized("team-a") == []
    ledger.claim_gone(whole)
    assert ledger.usage("team-a") == Charge(1, 1024, 5)


# -- every field the parser reads, exactly (mutation testing: scripts/mutation.py quota) -------------


def test_names_class_finds_the_class_anywhere_and_never_raises() -> None:
    ours, theirs = exact("a"), exact("b", device_class=OTHER_CLASS)
    assert names_class(claim(ours), CLASSES)
    assert names_class(claim(theirs, ours), CLASSES)  # not only the first request
    assert not names_class(claim(theirs), CLASSES)
    assert names_class(claim(theirs, ours, first_available=True), CLASSES)
    assert not names_class(claim(theirs, first_available=True), CLASSES)
    odd: list[Any] = [
        {},
        {"spec": []},
        {"spec": {"devices": []}},
        {"spec": {"devices": {"requests": {}}}},
        {"spec": {"devices": {"requests": ["x", {"exactly": None, "firstAvailable": ["y", None]}]}}},
        {"spec": {"devices": {"requests": [{"firstAvailable": {"deviceClassName": DEVICE_CLASS}}]}}},
    ]
    assert [names_class(o, CLASSES) for o in odd] == [False] * len(odd)
    late = {"spec": {"devices": {"requests": ["x", {"exactly": {"deviceClassName": DEVICE_CLASS}}]}}}
    assert names_class(late, CLASSES)


OTHER_CLASS = "gpu.nvidia.com"


def test_the_parsed_requests_keep_their_names_and_kind() -> None:
    parsed = parse_claim(claim(exact("solo", memory="1Gi"), exact("nic", device_class=OTHER_CLASS)), CLASSES)
    (solo,) = parsed.requests
    assert (solo.name, solo.first_available, [a.request for a in solo.alternatives]) == (
        "solo",
        False,
        ["solo"],
    )
    first = parse_claim(
        claim(exact("a", device_class=OTHER_CLASS), exact("b"), first_available=True), CLASSES
    )
    (gpu,) = first.requests
    assert (gpu.name, gpu.first_available, [a.request for a in gpu.alternatives]) == ("gpu", True, ["gpu/b"])
    assert parse_claim({"spec": {}}, CLASSES) == ClaimRequest()  # no devices at all: nothing asked
    assert parse_claim({"spec": {"devices": {}}}, CLASSES) == ClaimRequest()
    eight = claim(*[exact(f"s{i}", memory="1Gi") for i in range(8)], first_available=True)
    assert len(parse_claim(eight, CLASSES).requests[0].alternatives) == 8
    every = parse_claim(claim(exact("all", mode="All", count=3)), CLASSES)
    assert every.all_devices == ("all",) and every.requests[0].alternatives[0].count == 0
    assert parse_claim(claim(exact(mode="ExactCount")), CLASSES).all_devices == ()


def test_each_malformed_field_gets_its_own_message() -> None:
    def refusal(obj: Any) -> str:
        with pytest.raises(ClaimError) as caught:
            parse_claim(obj, CLASSES)
        return str(caught.value)

    def requests(*r: object) -> dict[str, Any]:
        return {"spec": {"devices": {"requests": list(r)}}}

    assert refusal({"spec": "x"}) == "spec must be an object"
    assert refusal({"spec": {"devices": "x"}}) == "spec.devices must be an object"
    assert refusal(requests(5)) == "spec.devices.requests[0] must be an object"
    assert refusal(requests({"name": ""})) == "spec.devices.requests[0].name must be a non-empty string"
    assert (
        refusal(requests({"name": 7, "exactly": {}}))
        == "spec.devices.requests[0].name must be a non-empty string"
    )
    assert (
        refusal(requests({"name": "g", "exactly": "x"}))
        == "spec.devices.requests[0] ('g').exactly must be an object"
    )
    sub = requests({"name": "g", "firstAvailable": ["x"]})
    assert refusal(sub) == "spec.devices.requests[0] ('g').firstAvailable[0] must be an object"
    unnamed = requests({"name": "g", "firstAvailable": [{"deviceClassName": DEVICE_CLASS}]})
    assert (
        refusal(unnamed) == "spec.devices.requests[0] ('g').firstAvailable[0].name must be a non-empty string"
    )
    bad_sub = requests(
        {"name": "g", "firstAvailable": [{"name": "s", "deviceClassName": DEVICE_CLASS, "count": 0}]}
    )
    assert refusal(bad_sub) == (
        "spec.devices.requests[0] ('g').firstAvailable[0].count must be a positive integer, got '0'"
    )
    long_name = "n" * 100
    assert refusal(requests({"name": long_name})) == (
        f"spec.devices.requests[0] ({'n' * 64!r}) must set exactly one of exactly and firstAvailable"
    )
    assert refusal(claim(exact(mode="M" * 100))).endswith(
        f"allocationMode must be ExactCount or All, got {'M' * 64!r}"
    )
    assert refusal(claim(exact(count="2"))).endswith("count must be a positive integer, got '2'")  # type: ignore[arg-type]
    assert refusal(claim({**exact(), "capacity": "x"})).endswith("('gpu').exactly.capacity must be an object")
    assert refusal(claim({**exact(), "capacity": {"requests": []}})).endswith(
        "('gpu').exactly.capacity.requests must be an object"
    )
    assert refusal(claim(exact(memory=True))).endswith(  # type: ignore[arg-type]
        'capacity.requests.memory must be a quantity such as "20Gi", got a bool'
    )


def test_the_reasons_name_each_rule_exactly() -> None:
    parsed = parse_claim(
        claim(exact("a", memory="10Gi", cores="10"), exact("b"), first_available=True), CLASSES
    )
    reasons = claim_reasons(parsed, 81920)
    alternatives = (
        "request 'gpu' lists 2 alternatives of kube-vgpu's classes in firstAvailable and is charged the "
        "most any could cost (1 GPU(s), 81920 MiB, 100% cores)"
    )
    assert reasons == {
        "vgpu-number": [alternatives],
        "vgpu-memory": [
            alternatives,
            "request 'gpu/b' names no memory, so it gets a whole GPU: 81920 MiB per device on the "
            "largest GPU it could get",
        ],
        "vgpu-cores": [
            alternatives,
            "request 'gpu/b' names no cores, so it may use every SM: 100% per device",
        ],
    }
    # No GPU size known: nothing said about memory; a fully stated request: nothing at all.
    assert "vgpu-memory" not in claim_reasons(parse_claim(claim(exact(cores="5")), CLASSES), None)
    assert claim_reasons(parse_claim(claim(exact(memory="1Gi", cores="5")), CLASSES), 81920) == {}
    assert all_devices_message("team-a", ("a", "b/c")) == (
        "namespace team-a: request 'a', 'b/c' asks allocationMode All (every matching GPU), which a GPU "
        "quota cannot bound; ask allocationMode ExactCount with a count"
    )


def test_quantities_are_read_exactly() -> None:
    for text, mib in (
        ("1Ki", 256),
        ("1048576", 256),
        ("300Mi", 300),
        ("0.5Gi", 512),
        ("2e9", 1908),
        ("+1Gi", 1024),
    ):
        assert memory_mib(text, "m") == mib, text
    assert memory_mib(2**30, "m") == 1024  # an integer, as JSON may carry it
    assert cores_percent("99.5", "c") == 100 and cores_percent("1m", "c") == 1
    for bad in ("", "1 Gi", "Gi", "1.2.3", "1e", "--1"):
        with pytest.raises(ClaimError, match="is not a Kubernetes quantity"):
            quantity(bad, "x")
    with pytest.raises(ClaimError, match="out of any GPU's range"):
        quantity("1e-129", "x")
    assert 0 < quantity("1e-128", "x") < 1
    assert quantity("0e999999", "x") == 0  # zero at any exponent is zero, not out of range


def test_the_edges_the_first_mutation_runs_found() -> None:
    assert quantity("0" * 63 + "1", "x") == 1  # MAX_TEXT characters: still read
    with pytest.raises(ClaimError, match="is not a Kubernetes quantity"):
        quantity("0" * 64 + "1", "x")
    with pytest.raises(ClaimError) as caught:
        parse_claim(claim(exact(count="c" * 100)), CLASSES)  # type: ignore[arg-type]
    assert str(caught.value).endswith(f"count must be a positive integer, got {'c' * 64!r}")
    with pytest.raises(ClaimError) as caught:
        parse_claim(claim({**exact(), "name": ""}, first_available=True), CLASSES)
    assert str(caught.value) == (
        "spec.devices.requests[0] ('gpu').firstAvailable[0].name must be a non-empty string"
    )
    with pytest.raises(ClaimError) as caught:
        parse_claim({"spec": {"devices": {"requests": "x"}}}, CLASSES)
    assert str(caught.value) == "spec.devices.requests must be a list"
    # firstAvailable of other classes only: not a request of ours.
    assert (
        parse_claim(claim(exact(device_class=OTHER_CLASS), first_available=True), CLASSES) == ClaimRequest()
    )
    # One alternative of ours beside another class's: charged as that one, nothing to explain.
    one = claim(
        exact("a", memory="1Gi", cores="1"), exact("b", device_class=OTHER_CLASS), first_available=True
    )
    assert claim_reasons(parse_claim(one, CLASSES), 81920) == {}


# -- every refusal of a claim: its message, its counted reason, its log line -------------------------
# (mutation testing: scripts/mutation.py quota-ledger)


class Denials:
    """A DenialCounter that records what it is told."""

    def __init__(self) -> None:
        self.denied_for: list[tuple[str, str]] = []

    def denied(self, namespace: str, reason: str) -> None:
        self.denied_for.append((namespace, reason))

    def forget(self, namespace: str) -> None:
        pass


def failing_store() -> MemoryStore:
    """A store whose API server does not answer."""
    store = MemoryStore()

    def fail(call: str) -> None:
        raise ApiUnavailable("the API server did not answer")

    store.before = fail
    return store


def gate_for(*, store: MemoryStore | None = None, max_entries: int = MAX_ENTRIES) -> NamespaceQuota:
    return make_gate(
        Clocks(),
        store=store or MemoryStore(),
        max_entries=max_entries,
        claim_classes=CLASSES,
        largest_gpu=lambda: 81920,
    )


@dataclass
class ClaimRefusal:
    """One way a claim's review is refused, and what the counter and the log must say of it."""

    labels: dict[str, str]
    body: dict[str, Any]
    reason: str
    message: str
    gate: Callable[[], NamespaceQuota] = gate_for
    gpu: int | None = 81920


CLAIM_REFUSALS = [
    ClaimRefusal(
        {QUOTA_MEMORY_LABEL: "lots"},
        exact(memory="1Gi"),
        "invalid-label",
        "namespace team-a: GPU quota label quota.kube-vgpu.io/vgpu-memory='lots' is not a non-negative "
        "integer; vGPU pods in this namespace are refused until the label is fixed or removed",
    ),
    ClaimRefusal(
        {QUOTA_NUMBER_LABEL: "8"},
        exact("every", mode="All"),
        "all-devices",
        "namespace team-a: request 'every' asks allocationMode All (every matching GPU), which a GPU "
        "quota cannot bound; ask allocationMode ExactCount with a count",
    ),
    ClaimRefusal(
        MEMORY_60G,
        exact(),
        "unsized",
        "namespace team-a: vgpu-memory quota: a request of the ResourceClaim names no memory (it gets a "
        "whole GPU) and no GPU is known to size it, so its charge cannot be computed; write "
        "capacity.requests.memory or wait for a GPU node",
        gpu=None,
    ),
    ClaimRefusal(
        MEMORY_60G,
        exact(memory="1Gi"),
        "unrecorded",
        "namespace team-a: GPU quota cannot be checked right now: the webhook could not record the pod's "
        "reservation with the API server (the API server did not answer); it refuses rather than risk "
        "exceeding the quota; retry in a few seconds",
        lambda: gate_for(store=failing_store()),
    ),
    ClaimRefusal(
        MEMORY_60G,
        exact(memory="1Gi"),
        "unrecorded",
        "namespace team-a: too many GPU pods are being admitted at once (the shared quota reservations "
        "are full); retry in a few seconds",
        lambda: gate_for(max_entries=0),
    ),
    ClaimRefusal(
        {QUOTA_CORES_LABEL: "20"},
        exact(memory="1Gi", cores="30"),
        "vgpu-cores",
        "ResourceClaim big: namespace team-a: vgpu-cores quota exceeded: requested 30%, in use 0% of 20%",
    ),
]


@pytest.mark.parametrize("case", CLAIM_REFUSALS, ids=lambda c: f"{c.reason}-{c.message[:30]}")
def test_each_claim_denial_is_worded_counted_and_logged_with_its_reason(
    case: ClaimRefusal, caplog: pytest.LogCaptureFixture
) -> None:
    gate = case.gate()
    denials = Denials()
    gate.denials = denials
    obj = claim(case.body, name="big")

    async def run() -> str | None:
        try:
            return await gate.admit_claim(replace(ask(obj, case.labels), largest_gpu_mib=case.gpu))
        finally:
            await close(gate)

    with caplog.at_level(logging.INFO, logger="kube_vgpu.webhook.quota"):
        denial = asyncio.run(run())
    assert denial == case.message
    assert denials.denied_for == [("team-a", case.reason)]
    assert [r.getMessage() for r in caplog.records if r.filename == "gate.py"] == [
        f"event=quota_denied namespace=team-a pod=resourceclaim/big reason={case.reason} message={denial!r}"
    ]
    # The limits the metrics report for the namespace are the labels this review carried.
    assert gate.last_limits == {"team-a": parse_limits(case.labels)}
    assert gate.reserved("team-a") == Charge()


def test_a_claim_of_a_namespace_the_cache_does_not_know_is_refused_and_nothing_is_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryStore()
    gate = claim_gate(Clocks(), store)
    denials = Denials()
    gate.denials = denials
    obj = claim(exact(memory="1Gi"), namespace="ghost", uid="uid-g")

    async def run() -> tuple[str | None, str | None]:
        try:
            return await gate.admit_claim(ask(obj, None)), await gate.admit_claim(ask(obj, {}))
        finally:
            await close(gate)

    with caplog.at_level(logging.INFO, logger="kube_vgpu.webhook.quota"):
        unknown, known = asyncio.run(run())
    assert unknown == (
        "namespace 'ghost' is unknown to the webhook: it does not exist, or it was created in the last "
        "few seconds and the webhook has not seen it yet (then retry)"
    )
    assert [r.getMessage() for r in caplog.records] == [
        "event=quota_unknown_namespace namespace='ghost' claim_uid=uid-g"
    ]
    assert store.calls == [] and denials.denied_for == []
    # One step away: a known namespace without quota labels admits it, and only remembers the labels.
    assert known is None and gate.last_limits == {"ghost": parse_limits({})}


def test_a_claim_naming_no_memory_with_no_gpu_known_passes_where_memory_is_not_limited() -> None:
    """Only a memory quota needs the size of the card; the others charge the claim as asked."""
    gate = claim_gate(Clocks(), MemoryStore())
    whole = claim(exact(), name="whole")

    async def run() -> str | None:
        try:
            labels = {QUOTA_NUMBER_LABEL: "1", QUOTA_CORES_LABEL: "100"}
            return await gate.admit_claim(replace(ask(whole, labels), largest_gpu_mib=None))
        finally:
            await close(gate)

    assert asyncio.run(run()) is None
    assert gate.reserved("team-a") == Charge(1, 0, 100)


def test_each_claim_admission_is_logged_at_debug_with_its_charge(caplog: pytest.LogCaptureFixture) -> None:
    gate = claim_gate(Clocks(), MemoryStore())
    first = claim(exact(memory="1Gi", cores="30", count=2), name="a", uid="uid-a")
    second = claim(exact(memory="2Gi"), name="b", uid="uid-b")

    async def run() -> list[str | None]:
        try:
            return [
                await gate.admit_claim(ask(first, MEMORY_60G)),
                await gate.admit_claim(ask(second, MEMORY_60G, dry_run=True)),
            ]
        finally:
            await close(gate)

    with caplog.at_level(logging.DEBUG, logger="kube_vgpu.webhook.quota"):
        assert asyncio.run(run()) == [None, None]
    assert [r.getMessage() for r in caplog.records if r.filename == "gate.py"] == [
        "event=quota_admitted namespace=team-a claim=resourceclaim/a uid=uid-a number=2 memory_mib=2048 "
        "cores=60 dry_run=False",
        "event=quota_admitted namespace=team-a claim=resourceclaim/b uid=uid-b number=1 memory_mib=2048 "
        "cores=100 dry_run=True",
    ]


# -- what the ledger counts for the claims the cache shows, edge by edge ------------------------------


def bare(obj: ClaimRecord, *drop: str) -> ClaimRecord:
    """`obj` without the metadata fields `drop`."""
    meta = {k: v for k, v in obj["metadata"].items() if k not in drop}
    return as_claim({**obj, "metadata": meta})


def test_the_ledger_counts_no_claim_it_cannot_key_and_never_raises_on_its_metadata() -> None:
    ledger = claim_gate(Clocks(), MemoryStore()).ledger
    obj = claim(exact(memory="1Gi"))
    for odd in (
        bare(obj, "uid"),
        bare(obj, "namespace"),
        as_claim({**obj, "metadata": {**obj["metadata"], "uid": 7}}),
        as_claim({**obj, "metadata": "team-a"}),
        as_claim({**obj, "metadata": ["team-a"]}),
        as_claim({k: v for k, v in obj.items() if k != "metadata"}),
    ):
        ledger.claim_seen(odd)
        ledger.claim_gone(odd)
    assert ledger.namespaces() == [] and ledger.usage("team-a") == Charge()
    ledger.claim_seen(obj)  # the same claim, whole: counted
    assert ledger.usage("team-a") == Charge(1, 1024, 100)


def test_a_claim_with_no_name_is_listed_by_its_kind_alone() -> None:
    ledger = claim_gate(Clocks(), MemoryStore()).ledger
    ledger.claim_seen(bare(claim(exact(memory="1Gi")), "name"))
    assert ledger.pods("team-a") == ["resourceclaim/"]


def test_a_malformed_claim_in_the_cache_is_logged_and_not_counted(caplog: pytest.LogCaptureFixture) -> None:
    ledger = claim_gate(Clocks(), MemoryStore()).ledger
    obj = claim(exact(memory="lots"), name="odd")
    with caplog.at_level(logging.WARNING, logger="kube_vgpu.webhook.quota"):
        ledger.claim_seen(obj)
    assert ledger.usage("team-a") == Charge() and ledger.pods("team-a") == []
    reason = refusal_of(obj)
    assert [r.getMessage() for r in caplog.records] == [
        f"event=quota_claim_unreadable namespace=team-a claim=odd reason={reason!r}"
    ]


def refusal_of(obj: ClaimRecord) -> str:
    with pytest.raises(ClaimError) as raised:
        parse_claim(obj, CLASSES, admin_free=True)
    return str(raised.value)


def test_a_claim_reseen_with_other_requests_keeps_its_first_charge() -> None:
    """A claim's spec is immutable (the API server refuses a change), so an update is its status."""
    ledger = claim_gate(Clocks(), MemoryStore()).ledger
    obj = claim(exact(memory="1Gi"), uid="same")
    ledger.claim_seen(obj)
    ledger.claim_seen(claim(exact(memory="9Gi", cores="50"), uid="same", name=obj["metadata"]["name"]))
    assert ledger.usage("team-a") == Charge(1, 1024, 100)
    ledger.claim_gone(obj)
    assert ledger.usage("team-a") == Charge() and ledger.namespaces() == []


def test_the_cache_shows_a_claim_from_the_moment_it_is_seen() -> None:
    clocks = Clocks()
    ledger = claim_gate(clocks, MemoryStore()).ledger
    ledger.claim_seen(claim(exact(memory="1Gi"), uid="uid-c"))
    clocks.advance(3)
    state = ledger.cache_state("team-a")
    assert state.shown_for("uid-c") == 3.0 and state.accounts_for("uid-c")


def test_a_whole_card_claim_sized_when_first_seen_never_shrinks() -> None:
    largest: list[int | None] = [81920]
    ledger = make_gate(claim_classes=CLASSES, largest_gpu=lambda: largest[0]).ledger
    ledger.claim_seen(claim(exact()))
    largest[0] = 40960  # the largest GPU left the cluster: the claim may hold that card still
    ledger.resize_claims()
    assert ledger.usage("team-a") == Charge(1, 81920, 100)


def test_every_whole_card_claim_is_resized_whatever_precedes_it() -> None:
    largest: list[int | None] = [None]
    ledger = make_gate(claim_classes=CLASSES, largest_gpu=lambda: largest[0]).ledger
    ledger.claim_seen(claim(exact(memory="1Gi", cores="5")))  # sized: never resized
    ledger.claim_seen(claim(exact(), namespace="team-b"))
    ledger.claim_seen(claim(exact()))
    largest[0] = 40960
    ledger.resize_claims()
    assert ledger.usage("team-a") == Charge(2, 1024 + 40960, 105)
    assert ledger.usage("team-b") == Charge(1, 40960, 100)


def test_a_claim_relist_counts_the_claims_it_brings() -> None:
    ledger = claim_gate(Clocks(), MemoryStore()).ledger
    kept, new = claim(exact(memory="1Gi")), claim(exact(memory="2Gi"))
    ledger.claim_seen(kept)
    ledger.resync_claims([kept, new])
    assert ledger.usage("team-a") == Charge(2, 3072, 200)


# -- the cache's ledger counts claims, sized against the inventory's largest GPU --------------------


def test_the_cache_ledger_counts_claims_of_its_classes_against_the_largest_gpu() -> None:
    inventory = Inventory()
    inventory.upsert(gpu_node("small", "hami-core", [(A100, 40960)]))
    inventory.upsert(gpu_node("large", "mig", [(H100, 81920)]))

    def ledger(**kwargs: Any) -> QuotaLedger:
        return pod_ledger(
            lambda: inventory, default_device_config, NAMES, "hami-core", pending_seconds=60.0, **kwargs
        )

    whole = claim(exact())
    fallback = ledger(claim_classes=CLASSES)  # the largest GPU of any mode, from the inventory
    fallback.claim_seen(whole)
    assert fallback.usage("team-a") == Charge(1, 81920, 100)
    given = ledger(claim_classes=CLASSES, largest_claim_gpu=lambda: 12345)
    given.claim_seen(whole)
    assert given.usage("team-a") == Charge(1, 12345, 100)
    other = ledger()  # no classes: no claim is the quota's
    other.claim_seen(whole)
    assert other.usage("team-a") == Charge()
