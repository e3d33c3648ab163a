"""Quota arithmetic: a pod's charge, the namespace labels, the denial wording."""

from __future__ import annotations

from typing import Any

import pytest

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.contract.devices import DeviceRecord, encode_pod_devices
from kube_vgpu.contract.names import QUOTA_CORES_LABEL, QUOTA_MEMORY_LABEL, QUOTA_NUMBER_LABEL, VGPU_IDS_NEW
from kube_vgpu.contract.resources import parse_pod
from kube_vgpu.webhook.quota.charge import (
    Charge,
    GpuSizeUnknown,
    QuotaLimits,
    Resource,
    booked_memory,
    charge_reasons,
    container_charge,
    exceeded,
    exceeded_message,
    invalid_label_message,
    parse_limits,
    pod_charge,
    pod_needs_gpu_size,
    restartable_init_flags,
    states_no_cores,
    unsized_message,
)
from kube_vgpu.webhook.records import PodRecord
from tests.support.records import as_pod

NAMES = ResourceNames()
KEYS = {
    "number": NAMES.count,
    "memory": NAMES.memory,
    "percent": NAMES.memory_percentage,
    "cores": NAMES.cores,
}


def ctr(name: str, restart: str | None = None, **amounts: int) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": name,
        "resources": {"limits": {KEYS[k]: str(v) for k, v in amounts.items()}},
    }
    if restart:
        container["restartPolicy"] = restart
    return container


def pod(
    *containers: dict[str, Any],
    init: tuple[dict[str, Any], ...] = (),
    annotations: dict[str, str] | None = None,
) -> PodRecord:
    return as_pod(
        {
            "metadata": {"name": "p", "namespace": "team-a", "annotations": annotations or {}},
            "spec": {"containers": list(containers), "initContainers": list(init)},
        }
    )


def charge_of(p: PodRecord, gpu_mib: int | None = 81920) -> Charge:
    request = parse_pod(p, NAMES)
    return pod_charge(
        request, gpu_mib=gpu_mib, sidecars=restartable_init_flags(p), booked_mib=booked_memory(p, request)
    )


def test_charge_is_number_times_memory_and_number_times_cores_per_container() -> None:
    p = pod(ctr("a", number=2, memory=3000, cores=30), ctr("b", number=1, memory=1024), ctr("plain"))
    # "b" states no cores: it runs with no SM limit, so it is charged the whole GPU's 100.
    assert charge_of(p) == Charge(number=3, memory_mib=2 * 3000 + 1024, cores=60 + 100)


def test_memory_only_counts_as_one_vgpu() -> None:
    assert charge_of(pod(ctr("a", memory=4096))) == Charge(1, 4096, 100)


def test_cores_only_or_number_only_holds_a_whole_card_per_vgpu() -> None:
    # Volcano books MemPercentagereq 100 when neither memory nor percentage is given.
    assert charge_of(pod(ctr("a", number=2)), gpu_mib=40960) == Charge(2, 81920, 200)
    assert charge_of(pod(ctr("a", cores=50)), gpu_mib=40960) == Charge(1, 40960, 50)


@pytest.mark.parametrize(("gpu_mib", "expected"), [(40960, 2 * 10240), (81920, 2 * 20480), (24576, 2 * 6144)])
def test_percentage_counts_against_the_gpu_size_given(gpu_mib: int, expected: int) -> None:
    assert charge_of(pod(ctr("a", number=2, percent=25)), gpu_mib=gpu_mib).memory_mib == expected


def test_percentage_rounds_down_per_card_like_volcano() -> None:
    # floor(32510 * 33 / 100) = 10728 per card, not 10728.3.
    assert charge_of(pod(ctr("a", number=3, percent=33)), gpu_mib=32510).memory_mib == 3 * 10728


def test_percentage_without_a_gpu_size_is_refused_to_size() -> None:
    p = pod(ctr("a", percent=50))
    assert pod_needs_gpu_size(parse_pod(p, NAMES))
    with pytest.raises(GpuSizeUnknown) as info:
        charge_of(p, gpu_mib=None)
    assert (
        str(info.value) == "container 'a' asks for a share of a GPU's memory and no GPU it could use is known"
    )
    assert not pod_needs_gpu_size(parse_pod(pod(ctr("a", memory=10)), NAMES))


def test_init_containers_count_as_kubernetes_does_per_resource() -> None:
    # init: 4 vGPUs x 1000 MiB, no SM limit (400); app: 2 x (1 vGPU, 3000 MiB, 40 cores).
    # number: max(4, 2) = 4; memory: max(4000, 6000) = 6000; cores: max(400, 80) = 400.
    p = pod(
        ctr("app1", number=1, memory=3000, cores=40),
        ctr("app2", number=1, memory=3000, cores=40),
        init=(ctr("setup", number=4, memory=1000), ctr("small", memory=500)),
    )
    assert charge_of(p) == Charge(number=4, memory_mib=6000, cores=400)


def test_a_larger_init_container_than_all_apps_sets_the_charge() -> None:
    p = pod(ctr("app", number=1, memory=1000), init=(ctr("warm", number=1, memory=30000, cores=100),))
    assert charge_of(p) == Charge(1, 30000, 100)


def test_sidecar_init_containers_add_to_the_app_containers() -> None:
    # A sidecar (restartPolicy Always) keeps running: it adds to the apps and to later inits.
    p = pod(
        ctr("app", number=1, memory=1000),
        init=(ctr("side", "Always", number=1, memory=2000), ctr("setup", number=1, memory=5000)),
    )
    assert restartable_init_flags(p) == (True, False)
    # apps + sidecar = 2 x, 3000 MiB; setup runs beside the sidecar: 2 x, 7000 MiB.
    assert charge_of(p) == Charge(2, 7000, 200)


def test_scheduler_booking_replaces_the_percentage_arithmetic() -> None:
    booking = encode_pod_devices(
        [
            [DeviceRecord("GPU-aaaaaaaa-0000-0000-0000-000000000001", 20480, 0)],
            [
                DeviceRecord("GPU-aaaaaaaa-0000-0000-0000-000000000001", 1000, 10),
                DeviceRecord("GPU-aaaaaaaa-0000-0000-0000-000000000002", 1000, 10),
            ],
        ]
    )
    p = pod(
        ctr("pct", percent=50),
        ctr("cpu-only"),
        ctr("fixed", number=2, memory=1000, cores=10),
        annotations={VGPU_IDS_NEW: booking},
    )
    request = parse_pod(p, NAMES)
    sizes = {"GPU-aaaaaaaa-0000-0000-0000-000000000001": 40960}
    assert booked_memory(p, request, sizes.get) == {"pct": 20480, "fixed": 2000}
    assert not pod_needs_gpu_size(request, booked_memory(p, request, sizes.get))
    # Booked on a 40 GiB card: 20480 MiB, whatever the largest GPU in the cluster is.
    booked = booked_memory(p, request, sizes.get)
    assert pod_charge(request, gpu_mib=None, booked_mib=booked) == Charge(3, 22480, 100 + 20)
    # A percentage booked on a GPU the cluster does not know cannot be checked: not believed.
    assert booked_memory(p, request) == {}


@pytest.mark.parametrize("booking", ["garbage", "GPU-x,NVIDIA,1,0:", ""])
def test_a_booking_that_does_not_fit_the_spec_is_ignored(booking: str) -> None:
    p = pod(ctr("a", percent=50), ctr("b", memory=10), annotations={VGPU_IDS_NEW: booking})
    assert booked_memory(p, parse_pod(p, NAMES)) == {}


def test_limits_parse_absent_zero_and_values() -> None:
    assert parse_limits({}) == QuotaLimits()
    assert not parse_limits({"other": "x"}).any
    limits = parse_limits({QUOTA_NUMBER_LABEL: "0", QUOTA_MEMORY_LABEL: "81920", QUOTA_CORES_LABEL: "400"})
    assert (limits.number, limits.memory_mib, limits.cores, limits.invalid) == (0, 81920, 400, ())


@pytest.mark.parametrize("value", ["10Gi", "-1", "", "1.5", " 4", "four"])
def test_a_label_that_is_not_a_non_negative_integer_is_reported(value: str) -> None:
    limits = parse_limits({QUOTA_MEMORY_LABEL: value, QUOTA_NUMBER_LABEL: "2"})
    # The label that does not parse sets no limit; the one that does keeps its own.
    assert limits == QuotaLimits(
        number=2, memory_mib=None, cores=None, invalid=((QUOTA_MEMORY_LABEL, value),)
    )
    assert invalid_label_message("team-a", limits.invalid) == (
        f"namespace team-a: GPU quota label {QUOTA_MEMORY_LABEL}={value!r} is not a non-negative integer; "
        "vGPU pods in this namespace are refused until the label is fixed or removed"
    )


def test_every_label_that_does_not_parse_is_named_in_one_message() -> None:
    limits = parse_limits({QUOTA_NUMBER_LABEL: "two", QUOTA_MEMORY_LABEL: "1024", QUOTA_CORES_LABEL: "50%"})
    assert limits == QuotaLimits(
        number=None,
        memory_mib=1024,
        cores=None,
        invalid=((QUOTA_NUMBER_LABEL, "two"), (QUOTA_CORES_LABEL, "50%")),
    )
    assert invalid_label_message("team-a", limits.invalid) == (
        f"namespace team-a: GPU quota label {QUOTA_NUMBER_LABEL}='two', {QUOTA_CORES_LABEL}='50%' is not a "
        "non-negative integer; vGPU pods in this namespace are refused until the label is fixed or removed"
    )


def test_a_share_of_a_card_that_cannot_be_sized_is_refused_saying_how_to_fix_it() -> None:
    assert unsized_message("team-a") == (
        "namespace team-a: vgpu-memory quota: the pod asks for a share of a GPU's memory (a percentage, "
        "or no vgpu-memory) and no GPU it could land on is known, so its charge cannot be computed; "
        "write vgpu-memory in MiB or wait for a matching GPU node"
    )


@pytest.mark.parametrize(
    ("amounts", "no_limit"),
    [
        ({"number": 1}, True),  # one vGPU, no vgpu-cores: no SM limit
        ({"number": 1, "cores": 0}, True),  # 0 is no limit too
        ({"number": 1, "cores": 1}, False),  # the smallest limit
        ({"number": 2, "cores": 100}, False),
        ({"memory": 1024}, True),  # one vGPU implied by the memory, no cores stated
    ],
)
def test_a_vgpu_container_without_an_sm_limit_is_told_apart(amounts: dict[str, int], no_limit: bool) -> None:
    (container,) = parse_pod(pod(ctr("c", None, **amounts)), NAMES).containers
    assert states_no_cores(container) is no_limit


def test_a_container_without_a_vgpu_states_no_sm_limit_to_charge() -> None:
    (container,) = parse_pod(pod(ctr("cpu-only")), NAMES).containers
    assert container.vgpus == 0 and states_no_cores(container) is False


def test_exceeded_names_only_limited_resources_the_request_uses() -> None:
    limits = QuotaLimits(number=4, memory_mib=1000, cores=None)
    assert exceeded(Charge(1, 500, 900), Charge(3, 500, 0), limits) == []  # exactly at the limits
    assert exceeded(Charge(2, 501, 900), Charge(3, 500, 0), limits) == ["vgpu-number", "vgpu-memory"]
    # A request that adds nothing to a resource never trips it, even when usage is over.
    assert exceeded(Charge(0, 0, 0), Charge(9, 9000, 0), limits) == []


def test_denial_message_is_worded_as_the_issue_says() -> None:
    usage, request = Charge(4, 65536, 0), Charge(1, 24576, 0)
    limits = QuotaLimits(memory_mib=81920)
    assert exceeded_message("team-a", ["vgpu-memory"], request, usage, limits) == (
        "namespace team-a: vgpu-memory quota exceeded: requested 24576 MiB, in use 65536 MiB of 81920 MiB"
    )
    both = exceeded_message(
        "team-a",
        ["vgpu-number", "vgpu-cores"],
        Charge(1, 0, 50),
        Charge(4, 0, 380),
        QuotaLimits(4, None, 400),
    )
    assert both == (
        "namespace team-a: vgpu-number quota exceeded: requested 1 vGPU, in use 4 vGPUs of 4 vGPUs; "
        "namespace team-a: vgpu-cores quota exceeded: requested 50%, in use 380% of 400%"
    )


def test_each_resource_is_checked_by_what_the_request_asks_of_it_alone() -> None:
    limits = QuotaLimits(number=4, memory_mib=1000, cores=None)
    # Asks cores only: the namespace being over its vGPU count does not refuse it.
    assert exceeded(Charge(0, 0, 10), Charge(9, 9000, 0), limits) == []
    # Asks one vGPU and nothing else, with the count at its limit: refused on the count alone.
    assert exceeded(Charge(1, 0, 0), Charge(4, 0, 0), limits) == ["vgpu-number"]


GPU_1 = "GPU-aaaaaaaa-0000-0000-0000-000000000001"


@pytest.mark.parametrize(
    ("container", "gpu_mib", "booked", "believed"),
    [
        (ctr("c", percent=50), 1000, 500, True),  # exactly the percentage of the booked card
        (ctr("c", percent=50), 1000, 499, False),  # one MiB short: the limits are charged instead
        (ctr("c", percent=33), 1001, 330, True),  # 33% of 1001 MiB rounds down to 330, as Volcano
        (ctr("c", number=1), 1000, 1000, True),  # no memory asked: the whole card
        (ctr("c", number=1), 1000, 999, False),
        (ctr("c", memory=100), 1000, 100, True),
        (ctr("c", memory=100), 1000, 99, False),
        (ctr("c", percent=50), None, 500, False),  # a card the cluster does not know: unverifiable
    ],
)
def test_a_booking_is_believed_only_when_it_charges_at_least_the_containers_own_limits(
    container: dict[str, Any], gpu_mib: int | None, booked: int, believed: bool
) -> None:
    p = pod(container, annotations={VGPU_IDS_NEW: encode_pod_devices([[DeviceRecord(GPU_1, booked, 0)]])})
    sizes = {GPU_1: gpu_mib} if gpu_mib is not None else {}
    assert booked_memory(p, parse_pod(p, NAMES), sizes.get) == ({"c": booked} if believed else {})


def test_a_booking_with_more_devices_than_the_container_asks_is_not_believed() -> None:
    two = encode_pod_devices([[DeviceRecord(GPU_1, 100, 0), DeviceRecord(GPU_1.replace("1", "2"), 100, 0)]])
    p = pod(ctr("c", number=1, memory=100), annotations={VGPU_IDS_NEW: two})
    assert booked_memory(p, parse_pod(p, NAMES)) == {}


@pytest.mark.parametrize("value", [5, ["x"], {"a": 1}, None])
def test_a_booking_annotation_that_is_not_text_is_ignored(value: object) -> None:
    p = pod(ctr("c", memory=100), annotations={VGPU_IDS_NEW: value})  # type: ignore[dict-item]
    assert booked_memory(p, parse_pod(p, NAMES)) == {}


def slot_of(mib: int) -> int:
    """A MIG geometry whose slots are 10 GiB or 20 GiB: the smallest that holds `mib`."""
    return 10240 if mib <= 10240 else 20480


@pytest.mark.parametrize(
    ("amounts", "gpu_mib", "booked", "expected"),
    [
        # A mig booking records the MiB asked; the card gives the whole slot: at least the slot.
        ({"number": 2, "memory": 1, "cores": 30}, 40960, 2, Charge(2, 2 * 10240, 60)),
        ({"number": 1, "memory": 1}, 40960, 30000, Charge(1, 30000, 100)),  # booked more: that
        # A share of a card no GPU known can size: the booking alone.
        ({"number": 1, "percent": 50}, None, 5000, Charge(1, 5000, 100)),
        ({"number": 1, "percent": 50}, None, 0, Charge(1, 0, 100)),  # nothing added when nothing is known
        # A share of a card booked below its slot: the card's size gives the slot (50% -> 20 GiB).
        ({"number": 1, "percent": 50}, 40960, 5000, Charge(1, 20480, 100)),
        ({"number": 1, "percent": 50}, 40960, None, Charge(1, 20480, 100)),  # 50% -> the 20 GiB slot
        ({"number": 1, "percent": 10}, 40960, None, Charge(1, 10240, 100)),  # 4096 MiB -> 10 GiB
        ({"number": 1, "memory": 10241}, None, None, Charge(1, 20480, 100)),
    ],
)
def test_a_mig_container_is_charged_the_slot_it_holds_booked_or_not(
    amounts: dict[str, int], gpu_mib: int | None, booked: int | None, expected: Charge
) -> None:
    (request,) = parse_pod(pod(ctr("m", None, **amounts)), NAMES).containers
    assert container_charge(request, gpu_mib=gpu_mib, booked_mib=booked, slot=slot_of) == expected
    # Without a slot (hami-core) a booking is charged as booked.
    if booked is not None:
        assert container_charge(request, gpu_mib=gpu_mib, booked_mib=booked) == Charge(
            expected.number, booked, expected.cores
        )


def test_every_sidecar_adds_up_and_init_containers_are_sized_and_slotted_like_apps() -> None:
    # Two sidecars: both keep running, so both add to the apps (and to each other).
    p = pod(
        ctr("app", number=1, memory=1000),
        init=(ctr("s1", "Always", number=1, memory=2000), ctr("s2", "Always", number=1, memory=3000)),
    )
    assert charge_of(p) == Charge(3, 6000, 300)
    # A plain init container asking a share of a card is sized on the GPU, and a mig slot applies.
    q = pod(ctr("app", number=1, memory=1), init=(ctr("warm", number=1, percent=50),))
    request = parse_pod(q, NAMES)
    assert pod_charge(request, gpu_mib=40960) == Charge(1, 20480, 100)
    assert pod_charge(request, gpu_mib=4096, slot=slot_of) == Charge(1, 10240, 100)
    # 50 % of 24 GiB is 12288 MiB, held as a 20 GiB slot: more than the app's 10 GiB slot.
    assert pod_charge(request, gpu_mib=24576, slot=slot_of) == Charge(1, 20480, 100)
    # A plain init container after two sidecars runs beside both of them.
    s = pod(
        ctr("app", number=1, memory=1000),
        init=(
            ctr("s1", "Always", number=1, memory=2000),
            ctr("s2", "Always", number=1, memory=3000),
            ctr("setup", number=1, memory=10000),
        ),
    )
    assert charge_of(s) == Charge(3, 10000 + 2000 + 3000, 300)
    # More init containers than flags given: the rest are plain init containers.
    r = pod(
        ctr("app", number=1, memory=1000),
        init=(ctr("a", number=1, memory=500), ctr("b", number=1, memory=700)),
    )
    assert pod_charge(parse_pod(r, NAMES), gpu_mib=None, sidecars=(False,)) == Charge(1, 1000, 100)


def test_labels_left_out_are_unlimited_next_to_one_that_is_set() -> None:
    assert parse_limits({QUOTA_NUMBER_LABEL: "2"}) == QuotaLimits(number=2, memory_mib=None, cores=None)


# -- why a charge is what it is (issue 34) ----------------------------------------------------------------


def reasons_of(p: PodRecord, gpu_mib: int | None = 81920, **slots: Any) -> dict[Resource, list[str]]:
    return dict(charge_reasons(parse_pod(p, NAMES), names=NAMES, gpu_mib=gpu_mib, **slots))


def test_a_refusal_gives_its_reasons_per_resource_after_the_figures() -> None:
    reasons: dict[Resource, list[str]] = {"vgpu-cores": ["why one", "why two"], "vgpu-number": []}
    both = exceeded_message(
        "team-a",
        ["vgpu-number", "vgpu-cores"],
        Charge(1, 0, 50),
        Charge(4, 0, 380),
        QuotaLimits(4, None, 400),
        reasons=reasons,
    )
    assert both == (
        "namespace team-a: vgpu-number quota exceeded: requested 1 vGPU, in use 4 vGPUs of 4 vGPUs; "
        "namespace team-a: vgpu-cores quota exceeded: requested 50%, in use 380% of 400% (why one; why two)"
    )


def test_only_containers_charged_more_than_they_state_get_a_reason() -> None:
    stated = pod(ctr("a", number=2, memory=1000, cores=30), ctr("cpu"))
    assert reasons_of(stated) == {}
    assert reasons_of(pod(ctr("a", number=2, memory=1000), ctr("b", number=1, memory=5, cores=0))) == {
        "vgpu-cores": [
            f"container {name!r} sets no volcano.sh/vgpu-cores limit: no SM limit counts as the whole GPU, "
            "100% per vGPU"
            for name in ("a", "b")
        ]
    }


def test_a_share_of_a_card_names_the_gpu_it_counts_against_and_nothing_without_one() -> None:
    shares = pod(ctr("pct", percent=25, cores=10), ctr("whole", number=2, cores=10))
    assert reasons_of(shares, gpu_mib=40960) == {
        "vgpu-memory": [
            "container 'pct' asks 25% of a GPU's memory: 10240 MiB per vGPU on the largest GPU it may "
            "land on (40960 MiB)",
            "container 'whole' sets neither volcano.sh/vgpu-memory nor volcano.sh/vgpu-memory-percentage, "
            "so it holds a whole GPU: 40960 MiB per vGPU on the largest GPU it may land on (40960 MiB)",
        ]
    }
    assert reasons_of(shares, gpu_mib=None) == {} and reasons_of(shares, gpu_mib=0) == {}


def test_a_mig_slot_is_named_where_it_rounds_the_request_up() -> None:
    def slot(mib: int) -> int:
        return 10240 if mib <= 10240 else 20480

    def describe(mib: int) -> str | None:
        return "1g.10gb slot of 10240 MiB" if mib < 10240 else None

    p = pod(ctr("small", memory=9000, cores=10), ctr("exact", memory=10240, cores=10))
    assert reasons_of(p, slot=slot, describe_slot=describe) == {
        "vgpu-memory": ["container 'small' asks 9000 MiB per vGPU, held as a 1g.10gb slot of 10240 MiB"]
    }
    # Without a name for the slot: its size alone.
    assert reasons_of(p, slot=slot) == {
        "vgpu-memory": ["container 'small' asks 9000 MiB per vGPU, held as a MIG slot of 10240 MiB"]
    }
    tenth = pod(ctr("pct", percent=10, cores=10))
    assert reasons_of(tenth, gpu_mib=81920, slot=slot) == {
        "vgpu-memory": [
            "container 'pct' asks 10% of a GPU's memory: 8192 MiB per vGPU on the largest GPU it may land "
            "on (81920 MiB), held as a MIG slot of 10240 MiB"
        ]
    }


def test_every_container_is_looked_at_whatever_comes_before_it() -> None:
    def slot(mib: int) -> int:
        return 10240

    # A container with no vGPU, then one whose share no GPU sizes, then one the slot rounds up.
    p = pod(ctr("cpu"), ctr("pct", percent=25, cores=10), ctr("small", memory=9000))
    assert reasons_of(p, gpu_mib=None, slot=slot) == {
        "vgpu-cores": [
            "container 'small' sets no volcano.sh/vgpu-cores limit: no SM limit counts as the whole GPU, "
            "100% per vGPU"
        ],
        "vgpu-memory": ["container 'small' asks 9000 MiB per vGPU, held as a MIG slot of 10240 MiB"],
    }
