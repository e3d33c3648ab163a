"""The scheduler stand-in's structured allocation, on slices kube-vgpu's own builder makes, each
behaviour as `k8s.io/dynamic-resource-allocation/structured` behaves (see the allocator's docstring)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from kube_vgpu.node.dra.attributes import GpuFacts
from kube_vgpu.node.dra.slices import DRIVER, PoolSpec, SliceOptions, Unhealthy, build_devices, build_slices
from kube_vgpu.standins.apiserver.dra import FeatureGates
from kube_vgpu.standins.apiserver.errors import StatusError
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.standins.dra.allocator import consumed
from kube_vgpu.standins.dra.scheduler import DraScheduler, Unschedulable

NODE = "node-a"
SHARED = SliceOptions()
GPUS = [GpuFacts(i, i, f"GPU-{i}", "NVIDIA A100-SXM4-80GB", 81920) for i in range(2)]


@pytest.fixture
def api(apiserver: ApiServerStandin) -> ApiServerStandin:
    apiserver.feature_gates = FeatureGates.of_release(36)
    apiserver.put(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": DRIVER},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        }
    )
    return apiserver


@pytest.fixture
def scheduler(api: ApiServerStandin) -> DraScheduler:
    return DraScheduler(api)


def publish(
    api: ApiServerStandin,
    gpus: list[GpuFacts],
    generation: int = 1,
    *,
    unhealthy: dict[str, Unhealthy] | None = None,
    options: SliceOptions = SHARED,
) -> None:
    for s in api.list("ResourceSlice"):
        api.delete("ResourceSlice", s["metadata"]["name"])
    for s in build_slices(PoolSpec(NODE, "uid", generation, build_devices(gpus, unhealthy or {}, options))):
        api.put(s)


def claim(api: ApiServerStandin, name: str, *requests: dict[str, Any], **devices: Any) -> None:
    api.put(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": list(requests), **devices}},
        }
    )


def exactly(name: str = "gpu", **fields: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": DRIVER, **fields}}


def memory(amount: str, **more: str) -> dict[str, Any]:
    # A request naming no cores consumes the policy's default, all 100 (KEP-5075): name some.
    return {"requests": {"memory": amount, "cores": "10", **more}}


def results(stored: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = stored["status"]["allocation"]["devices"]["results"]
    return found


def test_three_30gib_claims_on_one_80gib_gpu_two_fit(api: ApiServerStandin, scheduler: DraScheduler) -> None:
    publish(api, GPUS[:1])
    for name in ("c1", "c2", "c3"):
        claim(api, name, exactly(capacity=memory("30Gi")))
    first, second = (results(scheduler.allocate("default", n, NODE))[0] for n in ("c1", "c2"))
    assert first["device"] == second["device"] == "gpu-0"
    assert first["consumedCapacity"] == {"memory": "30Gi", "cores": "10"}
    assert first["shareID"] != second["shareID"]
    with pytest.raises(Unschedulable, match="request gpu: devices in use"):
        scheduler.allocate("default", "c3", NODE)
    assert "allocation" not in (api.get("ResourceClaim", "c3", "default") or {}).get("status", {})


def test_cores_are_consumed_too(api: ApiServerStandin, scheduler: DraScheduler) -> None:
    publish(api, GPUS[:1])
    claim(api, "c1", exactly(capacity=memory("10Gi", cores="60")))
    claim(api, "c2", exactly(capacity=memory("10Gi", cores="40")))
    claim(api, "c3", exactly(capacity=memory("10Gi", cores="1")))
    scheduler.allocate("default", "c1", NODE)
    scheduler.allocate("default", "c2", NODE)
    with pytest.raises(Unschedulable):
        scheduler.allocate("default", "c3", NODE)


def test_a_claim_naming_memory_only_takes_every_core(api: ApiServerStandin, scheduler: DraScheduler) -> None:
    publish(api, GPUS[:1])
    claim(
        api,
        "c1",
        {"name": "gpu", "exactly": {"deviceClassName": DRIVER, "capacity": {"requests": {"memory": "1Gi"}}}},
    )
    claim(api, "c2", exactly(capacity=memory("1Gi", cores="1")))
    assert results(scheduler.allocate("default", "c1", NODE))[0]["consumedCapacity"]["cores"] == "100"
    with pytest.raises(Unschedulable):
        scheduler.allocate("default", "c2", NODE)


def test_a_claim_naming_no_capacity_gets_the_whole_card(
    api: ApiServerStandin, scheduler: DraScheduler
) -> None:
    publish(api, GPUS[:1])
    claim(api, "whole", exactly())
    claim(api, "small", exactly(capacity=memory("256Mi", cores="1")))
    (result,) = results(scheduler.allocate("default", "whole", NODE))
    assert result["consumedCapacity"] == {"memory": "80Gi", "cores": "100"}
    with pytest.raises(Unschedulable):
        scheduler.allocate("default", "small", NODE)
    scheduler.deallocate("default", "whole")
    assert results(scheduler.allocate("default", "small", NODE))[0]["consumedCapacity"]["memory"] == "256Mi"


def test_allocation_names_the_node_and_reserves_for_the_pod(
    api: ApiServerStandin, scheduler: DraScheduler
) -> None:
    publish(api, GPUS[:1])
    claim(api, "c1", exactly(capacity=memory("1Gi")))
    pod = {"metadata": {"name": "p1", "uid": "0f0e0d0c-0000-4000-8000-000000000001"}}
    stored = scheduler.allocate("default", "c1", NODE, pod)
    assert stored["status"]["allocation"]["nodeSelector"] == {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}]
    }
    assert stored["status"]["reservedFor"] == [
        {"resource": "pods", "name": "p1", "uid": pod["metadata"]["uid"]}
    ]
    (result,) = results(stored)
    assert (result["driver"], result["pool"], result["request"]) == (DRIVER, NODE, "gpu")
    claim(api, "elsewhere", exactly())
    with pytest.raises(Unschedulable):
        scheduler.allocate("default", "elsewhere", "node-b")


@pytest.mark.parametrize(
    ("asked", "gets"),
    [
        ({"memory": "100Mi"}, {"memory": "256Mi"}),  # below min: the minimum
        ({"memory": "1000.5Ki"}, {"memory": "256Mi"}),
        ({"memory": "300.5Mi"}, {"memory": "301Mi"}),  # up to the next 1Mi step
        ({"cores": "0.5"}, {"cores": "1"}),
        ({"cores": "30"}, {"cores": "30"}),
    ],
)
def test_requests_are_rounded_by_the_request_policy(
    api: ApiServerStandin, scheduler: DraScheduler, asked: dict[str, str], gets: dict[str, str]
) -> None:
    publish(api, GPUS[:1])
    claim(api, "c1", exactly(capacity={"requests": asked}))
    (result,) = results(scheduler.allocate("default", "c1", NODE))
    for name, amount in gets.items():
        assert result["consumedCapacity"][name] == amount


def test_the_range_max_holds_on_both_sides() -> None:
    policy = {"default": "100", "validRange": {"min": "1", "max": "100", "step": "1"}}
    capacity = {"value": "100", "requestPolicy": policy}
    assert consumed(None, capacity, "cores") == 100
    assert consumed(Decimal(100), capacity, "cores") == 100
    assert consumed(Decimal(101), capacity, "cores") is None
    valid_values = {"value": "4", "requestPolicy": {"default": "4", "validValues": ["1", "2", "4"]}}
    assert consumed(Decimal(3), valid_values, "slots") == 4
    assert consumed(Decimal(5), valid_values, "slots") is None


def test_a_tainted_gpu_is_skipped_and_used_again_once_recovered(
    api: ApiServerStandin, scheduler: DraScheduler
) -> None:
    sick = {"GPU-0": Unhealthy("XID 79", "2026-01-02T03:04:05Z")}
    publish(api, GPUS, unhealthy=sick)
    claim(api, "c1", exactly(capacity=memory("1Gi")))
    assert results(scheduler.allocate("default", "c1", NODE))[0]["device"] == "gpu-1"
    publish(api, GPUS[:1], 2, unhealthy=sick)
    claim(api, "c2", exactly(capacity=memory("1Gi")))
    with pytest.raises(Unschedulable, match="every matching device is tainted"):
        scheduler.allocate("default", "c2", NODE)
    tolerating = exactly(
        capacity=memory("1Gi"), tolerations=[{"key": f"{DRIVER}/unhealthy", "operator": "Exists"}]
    )
    claim(api, "c3", tolerating)
    assert results(scheduler.allocate("default", "c3", NODE))[0]["device"] == "gpu-0"
    publish(api, GPUS[:1], 3)
    assert results(scheduler.allocate("default", "c2", NODE))[0]["device"] == "gpu-0"


def test_only_the_newest_complete_generation_counts(api: ApiServerStandin, scheduler: DraScheduler) -> None:
    publish(api, GPUS[:1], 1)
    old = api.list("ResourceSlice")[0]
    newer = build_slices(PoolSpec(NODE, "uid", 2, build_devices(GPUS[1:], {}, SliceOptions())))[0]
    newer["metadata"]["name"] = "node-a-vgpu-new"
    api.put(newer)
    claim(api, "c1", exactly(capacity=memory("1Gi")))
    assert results(scheduler.allocate("default", "c1", NODE))[0]["device"] == "gpu-1"
    assert old["spec"]["pool"]["generation"] == 1


def test_first_available_falls_through_to_the_next_sub_request(
    api: ApiServerStandin, scheduler: DraScheduler
) -> None:
    publish(api, GPUS[:1])
    request = {
        "name": "gpus",
        "firstAvailable": [
            {"name": "big", "deviceClassName": DRIVER, "capacity": memory("100Gi")},
            {"name": "fits", "deviceClassName": DRIVER, "capacity": memory("40Gi")},
        ],
    }
    claim(api, "c1", request)
    (result,) = results(scheduler.allocate("default", "c1", NODE))
    assert result["request"] == "gpus/fits"
    assert result["consumedCapacity"]["memory"] == "40Gi"


def test_distinct_attribute_puts_two_slices_on_two_gpus(
    api: ApiServerStandin, scheduler: DraScheduler
) -> None:
    distinct = [{"distinctAttribute": f"{DRIVER}/uuid"}]
    publish(api, GPUS)
    claim(
        api,
        "two",
        exactly("a", capacity=memory("1Gi")),
        exactly("b", capacity=memory("1Gi")),
        constraints=distinct,
    )
    assert sorted(r["device"] for r in results(scheduler.allocate("default", "two", NODE))) == [
        "gpu-0",
        "gpu-1",
    ]
    claim(api, "same", exactly("a", capacity=memory("1Gi")), exactly("b", capacity=memory("1Gi")))
    assert {r["device"] for r in results(scheduler.allocate("default", "same", NODE))} == {"gpu-0"}
    publish(api, GPUS[:1], 2)
    claim(
        api,
        "three",
        exactly("a", capacity=memory("1Gi")),
        exactly("b", capacity=memory("1Gi")),
        constraints=distinct,
    )
    with pytest.raises(Unschedulable):
        scheduler.allocate("default", "three", NODE)


def test_class_and_request_selectors_are_cel(api: ApiServerStandin, scheduler: DraScheduler) -> None:
    h100 = GpuFacts(1, 1, "GPU-1", "NVIDIA H100 80GB HBM3", 81559)
    publish(api, [GPUS[0], h100])
    wants_h100 = [{"cel": {"expression": f'device.attributes["{DRIVER}"].model.matches("(^|-)h100(-|$)")'}}]
    claim(api, "c1", exactly(selectors=wants_h100, capacity=memory("1Gi")))
    assert results(scheduler.allocate("default", "c1", NODE))[0]["device"] == "gpu-1"
    big = [{"cel": {"expression": f'device.attributes["{DRIVER}"].memoryMiB > 100000'}}]
    claim(api, "c2", exactly(selectors=big))
    with pytest.raises(Unschedulable, match="no device matches its class and selectors"):
        scheduler.allocate("default", "c2", NODE)


def test_whole_gpus_go_to_one_claim_each(api: ApiServerStandin, scheduler: DraScheduler) -> None:
    publish(api, GPUS[:1], options=SliceOptions(consumable_capacity=False, device_taints=False))
    claim(api, "c1", exactly(capacity=memory("30Gi")))
    claim(api, "c2", exactly())
    (result,) = results(scheduler.allocate("default", "c1", NODE))
    assert "shareID" not in result and "consumedCapacity" not in result
    with pytest.raises(Unschedulable):
        scheduler.allocate("default", "c2", NODE)


def test_shares_left_from_a_shared_pool_keep_a_whole_gpu_busy(
    api: ApiServerStandin, scheduler: DraScheduler
) -> None:
    publish(api, GPUS[:1])
    claim(api, "shared", exactly(capacity=memory("1Gi")))
    scheduler.allocate("default", "shared", NODE)
    publish(api, GPUS[:1], 2, options=SliceOptions(consumable_capacity=False, device_taints=False))
    claim(api, "whole", exactly())
    with pytest.raises(Unschedulable):
        scheduler.allocate("default", "whole", NODE)
    scheduler.deallocate("default", "shared")
    assert results(scheduler.allocate("default", "whole", NODE))[0]["device"] == "gpu-0"


def test_all_mode_takes_every_matching_device(api: ApiServerStandin, scheduler: DraScheduler) -> None:
    publish(api, GPUS)
    claim(api, "c1", exactly(allocationMode="All", capacity=memory("1Gi")))
    assert [r["device"] for r in results(scheduler.allocate("default", "c1", NODE))] == ["gpu-0", "gpu-1"]


@pytest.mark.parametrize(
    ("capacity", "reason"),
    [
        (memory("1e30"), "no matching device has the capacity asked"),
        ({"requests": {"bandwidth": "1"}}, "no matching device has the capacity asked"),
    ],
)
def test_hostile_capacity_requests_are_refused_clearly(
    api: ApiServerStandin, scheduler: DraScheduler, capacity: dict[str, Any], reason: str
) -> None:
    publish(api, GPUS[:1])
    claim(api, "c1", exactly(capacity=capacity))
    with pytest.raises(Unschedulable, match=reason):
        scheduler.allocate("default", "c1", NODE)


@pytest.mark.parametrize("amount", ["-1Gi", "0", "-0.5"])
def test_zero_and_negative_requests_consume_the_minimum(
    api: ApiServerStandin, scheduler: DraScheduler, amount: str
) -> None:
    # Neither the API server nor the allocator refuses them: roundUpRange lifts any amount below the
    # range's min to the min (consumablecapacity.go), so a claim can never consume less than 256Mi.
    publish(api, GPUS[:1])
    claim(api, "c1", exactly(capacity=memory(amount, cores=amount)))
    (result,) = results(scheduler.allocate("default", "c1", NODE))
    assert result["consumedCapacity"] == {"memory": "256Mi", "cores": "1"}


def test_an_unknown_class_is_named(api: ApiServerStandin, scheduler: DraScheduler) -> None:
    publish(api, GPUS[:1])
    claim(api, "c1", {"name": "gpu", "exactly": {"deviceClassName": "nope.example.com"}})
    with pytest.raises(Unschedulable, match=r"device class nope\.example\.com does not exist"):
        scheduler.allocate("default", "c1", NODE)


# -- admin access ------------------------------------------------------------------------------------

WHOLE = SliceOptions(consumable_capacity=False, device_taints=False)


def admin_namespace(api: ApiServerStandin) -> None:
    """The API server stores adminAccess claims and allocations only in a namespace so labelled."""
    api.put(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": "default", "labels": {"resource.kubernetes.io/admin-access": "true"}},
        }
    )


def test_admin_access_gets_a_whole_gpu_already_allocated_and_takes_it_from_nobody(
    api: ApiServerStandin, scheduler: DraScheduler
) -> None:
    admin_namespace(api)
    publish(api, GPUS[:1], options=WHOLE)
    claim(api, "user", exactly())
    claim(api, "monitor", exactly(adminAccess=True))
    claim(api, "next", exactly())
    assert "adminAccess" not in results(scheduler.allocate("default", "user", NODE))[0]
    (result,) = results(scheduler.allocate("default", "monitor", NODE))
    assert result["device"] == "gpu-0" and result["adminAccess"] is True
    assert "shareID" not in result and "consumedCapacity" not in result
    with pytest.raises(Unschedulable):  # the user's GPU stays the user's
        scheduler.allocate("default", "next", NODE)
    scheduler.deallocate("default", "user")
    # The monitor's result holds nothing: the next user gets the GPU while the monitor keeps it.
    assert results(scheduler.allocate("default", "next", NODE))[0]["device"] == "gpu-0"


def test_admin_access_takes_a_device_only_once_per_claim(
    api: ApiServerStandin, scheduler: DraScheduler
) -> None:
    admin_namespace(api)
    publish(api, GPUS[:1], options=WHOLE)
    claim(api, "two", exactly(adminAccess=True, count=2))
    claim(api, "one", exactly(adminAccess=True, count=1))
    with pytest.raises(Unschedulable):
        scheduler.allocate("default", "two", NODE)
    assert len(results(scheduler.allocate("default", "one", NODE))) == 1


def test_admin_access_on_a_shared_gpu_must_fit_beside_the_shares_and_then_consumes_nothing(
    api: ApiServerStandin, scheduler: DraScheduler
) -> None:
    """As Kubernetes 1.36's allocator does: the capacity check runs for an admin request too (it
    asks the policy's defaults, the whole card, unless it names less), but once allocated its
    result counts for no one: a user claim filling the card exactly still fits after it."""
    admin_namespace(api)
    publish(api, GPUS[:1])
    claim(api, "user", exactly(capacity=memory("30Gi", cores="30")))
    claim(api, "whole-monitor", exactly(adminAccess=True))
    claim(api, "monitor", exactly(adminAccess=True, capacity=memory("256Mi", cores="1")))
    claim(api, "rest", exactly(capacity=memory("50Gi", cores="70")))
    claim(api, "over", exactly(capacity=memory("256Mi", cores="1")))
    scheduler.allocate("default", "user", NODE)
    with pytest.raises(Unschedulable, match="devices in use"):
        scheduler.allocate("default", "whole-monitor", NODE)
    (result,) = results(scheduler.allocate("default", "monitor", NODE))
    assert result["adminAccess"] is True and result["shareID"]
    assert result["consumedCapacity"] == {"memory": "256Mi", "cores": "1"}
    assert results(scheduler.allocate("default", "rest", NODE))[0]["device"] == "gpu-0"
    with pytest.raises(Unschedulable):  # the card is full now: 80Gi and 100 cores held by users
        scheduler.allocate("default", "over", NODE)


def test_admin_access_allocation_is_refused_in_an_unlabelled_namespace(
    api: ApiServerStandin, scheduler: DraScheduler
) -> None:
    """The scheduler's status write goes through the API server's check too."""
    publish(api, GPUS[:1], options=WHOLE)
    admin_namespace(api)
    claim(api, "monitor", exactly(adminAccess=True))
    api.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}})
    with pytest.raises(StatusError, match=r"results\[0\]\.adminAccess: Forbidden"):
        scheduler.allocate("default", "monitor", NODE)
