"""NodePrepareResources' decisions: which results, what share, whether it fits, what limits."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from kube_vgpu.contract.devices import DeviceRecord
from kube_vgpu.node.deviceplugin.hamicore import build_response
from kube_vgpu.node.dra.limits import (
    Card,
    ClaimRef,
    ClaimRefused,
    Share,
    admin_requests,
    allocation_results,
    by_request,
    cache_host_dir,
    check_fit,
    own_results,
    quantity_value,
    request_edits,
    shares,
)
from kube_vgpu.node.nvml.gpus import GpuInfo

DRIVER = "vgpu.kube-vgpu.io"
REF = ClaimRef("team-a", "slice", "uid-1")
CARD = Card("gpu-0", "GPU-aaaa", 0, 81920)
CARDS = {"gpu-0": CARD, "gpu-1": Card("gpu-1", "GPU-bbbb", 1, 81920)}


def result(device: str = "gpu-0", request: str = "gpu", **consumed: str) -> dict[str, Any]:
    out: dict[str, Any] = {"request": request, "driver": DRIVER, "pool": "node-1", "device": device}
    if consumed:
        out["consumedCapacity"] = consumed
    return out


def claim(uid: str = "uid-1", results: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"metadata": {"name": "slice", "namespace": "team-a", "uid": uid}}
    if results is not None:
        out["status"] = {"allocation": {"devices": {"results": results}}}
    return out


@pytest.mark.parametrize(
    ("text", "value"),
    [("30Gi", 30 * 1024**3), ("81920Mi", 81920 * 1024**2), ("1e3", 1000), ("50", 50), ("1k", 1000), (7, 7)],
)
def test_quantities(text: str | int, value: int) -> None:
    assert quantity_value(text) == Decimal(value)


@pytest.mark.parametrize("text", ["", "Gi", "1.2.3", "30 Gi", "1e99", True, None, 1.5, "9" * 65])
def test_what_is_no_quantity(text: object) -> None:
    with pytest.raises(ValueError):
        quantity_value(text)


def test_the_claim_must_be_the_one_the_kubelet_named() -> None:
    with pytest.raises(
        ClaimRefused, match=r"team-a/slice \(uid uid-1\).*uid 'uid-2'.*deleted and created again"
    ):
        allocation_results(claim("uid-2", []), REF)


def test_an_unallocated_claim_is_refused() -> None:
    with pytest.raises(ClaimRefused, match=r"team-a/slice \(uid uid-1\): not allocated"):
        allocation_results(claim(), REF)


def test_malformed_results_are_refused() -> None:
    bad = claim()
    bad["status"] = {"allocation": {"devices": {"results": ["x"]}}}
    with pytest.raises(ClaimRefused, match="malformed"):
        allocation_results(bad, REF)


def test_other_drivers_results_are_left_to_them() -> None:
    theirs = {**result(), "driver": "gpu.nvidia.com", "pool": "elsewhere"}
    assert own_results([theirs, result()], driver=DRIVER, pool="node-1", ref=REF) == [result()]


def test_a_result_of_this_driver_in_another_nodes_pool_is_refused() -> None:
    with pytest.raises(ClaimRefused, match="pool 'node-2', not this node's pool 'node-1'"):
        own_results([{**result(), "pool": "node-2"}], driver=DRIVER, pool="node-1", ref=REF)


def test_consumed_capacity_becomes_the_share() -> None:
    (share,) = shares([result(memory="30Gi", cores="30")], CARDS, REF)
    assert share == Share("gpu", "gpu-0", "GPU-aaaa", 30720, 30)


def test_no_consumed_capacity_is_the_whole_card() -> None:
    (share,) = shares([result()], CARDS, REF)
    assert (share.memory_mib, share.cores) == (81920, 100)


def test_the_share_id_is_kept() -> None:
    (share,) = shares([{**result(memory="1Gi"), "shareID": "s-1"}], CARDS, REF)
    assert share.share_id == "s-1"


@pytest.mark.parametrize(
    ("consumed", "message"),
    [
        ({"memory": "-1Gi"}, "memory '-1Gi', not a positive amount"),
        ({"memory": "0"}, "memory '0', not a positive amount"),
        ({"memory": "1000"}, "not a whole number of MiB"),
        ({"memory": "81921Mi"}, "consumes 81921 MiB of device gpu-0 \\(GPU-aaaa\\), which has 81920 MiB"),
        ({"memory": "1e30"}, "which has 81920 MiB"),
        ({"memory": "lots"}, "consumes memory 'lots' is not a Kubernetes quantity"),
        ({"cores": "0"}, "cores '0'"),
        ({"cores": "101"}, "cores '101'"),
        ({"cores": "-5"}, "cores '-5'"),
        ({"cores": "500m"}, "cores '500m'"),
    ],
)
def test_hostile_consumed_capacity_is_refused(consumed: dict[str, str], message: str) -> None:
    with pytest.raises(ClaimRefused, match=message):
        shares([result(**consumed)], CARDS, REF)


def test_the_limits_themselves_are_accepted() -> None:
    (share,) = shares([result(memory="81920Mi", cores="100")], CARDS, REF)
    assert (share.memory_mib, share.cores) == (81920, 100)
    (share,) = shares([result(memory="1Mi", cores="1")], CARDS, REF)
    assert (share.memory_mib, share.cores) == (1, 1)


def test_unknown_and_unhealthy_devices_are_refused() -> None:
    with pytest.raises(ClaimRefused, match="device 'gpu-9', which this node does not have"):
        shares([result("gpu-9")], CARDS, REF)
    sick = {"gpu-0": Card("gpu-0", "GPU-aaaa", 0, 81920, unhealthy="XID 79")}
    with pytest.raises(ClaimRefused, match=r"gpu-0 \(GPU-aaaa\), which is unhealthy: XID 79"):
        shares([result()], sick, REF)


def test_a_malformed_result_is_refused() -> None:
    with pytest.raises(ClaimRefused, match="device of request 'gpu' is missing"):
        shares([{"request": "gpu"}], CARDS, REF)
    with pytest.raises(ClaimRefused, match="malformed consumedCapacity"):
        shares([{**result(), "consumedCapacity": ["x"]}], CARDS, REF)


def held(uid: str, mib: int, cores: int = 10, device: str = "gpu-0") -> dict[str, list[Share]]:
    return {uid: [Share("gpu", device, CARDS[device].uuid, mib, cores)]}


def test_three_30_gib_claims_on_an_80_gib_gpu_the_third_is_refused_with_figures() -> None:
    prepared = held("a", 30720) | held("b", 30720)
    new = [Share("gpu", "gpu-0", "GPU-aaaa", 30720, 10)]
    with pytest.raises(ClaimRefused) as refused:
        check_fit(REF, new, prepared, CARDS)
    assert str(refused.value) == (
        "claim team-a/slice (uid uid-1): device gpu-0 (GPU-aaaa) would be over-committed: memory 30720 MiB "
        "asked + 61440 MiB held by 2 other prepared claim(s) > 81920 MiB on the card"
    )


def test_exactly_the_rest_of_the_card_fits_one_mib_more_does_not() -> None:
    prepared = held("a", 61440)
    check_fit(REF, [Share("gpu", "gpu-0", "GPU-aaaa", 20480, 10)], prepared, CARDS)
    with pytest.raises(ClaimRefused, match="memory 20481 MiB asked"):
        check_fit(REF, [Share("gpu", "gpu-0", "GPU-aaaa", 20481, 10)], prepared, CARDS)


def test_cores_are_bounded_at_100_percent() -> None:
    prepared = held("a", 1024, cores=70)
    check_fit(REF, [Share("gpu", "gpu-0", "GPU-aaaa", 1024, 30)], prepared, CARDS)
    with pytest.raises(ClaimRefused, match=r"cores 31 % asked \+ 70 % held by 1 other"):
        check_fit(REF, [Share("gpu", "gpu-0", "GPU-aaaa", 1024, 31)], prepared, CARDS)


def test_two_results_of_one_claim_on_one_gpu_add_up() -> None:
    new = [Share("a", "gpu-0", "GPU-aaaa", 40960, 50), Share("b", "gpu-0", "GPU-aaaa", 40961, 50)]
    with pytest.raises(ClaimRefused, match="memory 81921 MiB asked"):
        check_fit(REF, new, {}, CARDS)


def test_a_claim_is_not_counted_against_itself_and_other_gpus_do_not_count() -> None:
    prepared = held("uid-1", 81920) | held("b", 81920, device="gpu-1")
    check_fit(REF, [Share("gpu", "gpu-0", "GPU-aaaa", 81920, 100)], prepared, CARDS)


def test_edits_match_the_device_plugins_hami_core_answer() -> None:
    shares_ = [Share("gpu", "gpu-0", "GPU-aaaa", 2048, 30), Share("gpu", "gpu-1", "GPU-bbbb", 4096, 30)]
    edits = request_edits(shares_, hook_path="/usr/local/vgpu", lock_dir="/tmp/vgpulock", cache_dir="/c")
    gpus = {
        "GPU-aaaa": GpuInfo(0, "GPU-aaaa", "A100", 0, 81920),
        "GPU-bbbb": GpuInfo(1, "GPU-bbbb", "A100", 1, 81920),
    }
    records = (DeviceRecord("GPU-aaaa", 2048, 30), DeviceRecord("GPU-bbbb", 4096, 30))
    plugin = build_response(
        records, gpus, {"name": "c"}, pod_uid="u", hook_path="/usr/local/vgpu", cache_file="vgpu.cache"
    )
    env = dict(e.split("=", 1) for e in edits.env)
    # The GPU itself comes from its own CDI device, not from NVIDIA_VISIBLE_DEVICES.
    assert env == {k: v for k, v in plugin.envs.items() if k != "NVIDIA_VISIBLE_DEVICES"}
    assert [(m.container_path, m.read_only) for m in edits.mounts] == [
        (m.container_path, m.read_only) for m in plugin.mounts
    ]
    by_path = {m.container_path: m.host_path for m in edits.mounts}
    assert by_path["/tmp/vgpu"] == "/c"
    assert by_path["/usr/local/vgpu/libvgpu.so"] == "/usr/local/vgpu/libvgpu.so"
    assert by_path["/etc/ld.so.preload"] == "/usr/local/vgpu/ld.so.preload"
    assert by_path["/tmp/vgpulock"] == "/tmp/vgpulock"


def test_the_sm_limit_is_the_smallest_share_of_the_request() -> None:
    shares_ = [Share("gpu", "gpu-0", "A", 1, 60), Share("gpu", "gpu-1", "B", 1, 20)]
    edits = request_edits(shares_, hook_path="/h", lock_dir="/l", cache_dir="/c")
    assert "CUDA_DEVICE_SM_LIMIT=20" in edits.env


def test_requests_are_grouped_in_order_and_cache_folders_are_per_request() -> None:
    a, b, c = (
        Share("x", "gpu-0", "A", 1, 1),
        Share("y/alt", "gpu-1", "B", 1, 1),
        Share("x", "gpu-1", "B", 1, 1),
    )
    assert by_request([a, b, c]) == {"x": [a, c], "y/alt": [b]}
    assert cache_host_dir("/h", "u", "y/alt") == "/h/vgpu/claims/u_y_alt"


def test_an_admin_access_result_consumes_nothing_and_gets_no_limits() -> None:
    (admin,) = shares([{**result(memory="80Gi"), "adminAccess": True}], CARDS, REF, {"gpu"})
    assert admin == Share("gpu", "gpu-0", "GPU-aaaa", 0, 0, admin=True)
    check_fit(REF, [admin], held("a", 81920, cores=100), CARDS)  # beside a full card
    assert by_request([admin]) == {}
    (user,) = shares([{**result(), "adminAccess": False}], CARDS, REF)
    assert not user.admin and user.memory_mib == 81920


def test_an_admin_access_result_needs_a_request_that_asks_it() -> None:
    """A result marked adminAccess whose request does not ask it (exactly.adminAccess) is refused,
    naming claim, request and device; the claim's admin requests are read from its spec, where a
    firstAvailable alternative or a non-boolean value asks nothing."""
    marked = {**result(memory="1Gi"), "adminAccess": True}
    admins: tuple[frozenset[str], ...] = (frozenset(), frozenset({"other"}), frozenset({"gpu/sub"}))
    for admin in admins:
        with pytest.raises(ClaimRefused) as refused:
            shares([marked], CARDS, REF, admin)
        assert str(refused.value) == (
            "claim team-a/slice (uid uid-1): the result for request 'gpu' on device gpu-0 (GPU-aaaa) is "
            "marked adminAccess, but the claim's request 'gpu' does not ask it "
            "(spec.devices.requests[].exactly.adminAccess is not true); refused rather than give the GPU "
            "without limits"
        )
    (share,) = shares([marked], CARDS, REF, {"gpu"})
    assert share.admin
    spec = {
        "spec": {
            "devices": {
                "requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": DRIVER, "adminAccess": True}},
                    {"name": "work", "exactly": {"deviceClassName": DRIVER, "adminAccess": False}},
                    {"name": "text", "exactly": {"deviceClassName": DRIVER, "adminAccess": "true"}},
                    {"name": "alt", "firstAvailable": [{"name": "a", "adminAccess": True}]},
                    "junk",
                    {"exactly": {"adminAccess": True}},
                ]
            }
        }
    }
    assert admin_requests(spec) == {"gpu"}
    assert admin_requests({}) == admin_requests({"spec": {"devices": {"requests": "x"}}}) == frozenset()
