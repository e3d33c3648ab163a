"""Quota-side ways around the rules (issue 11), through the real HTTPS webhook and both phases:
uncapped cores, MIG slots, edited bookings, reinvoked mutation of `generateName` pods, dry runs,
names that exist, a missing uid and a stale cache; and a forged review's reservation (issue 22).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import pytest

from kube_vgpu.contract.config import Config, WebhookConfig
from kube_vgpu.contract.names import VGPU_IDS_NEW
from kube_vgpu.standins.apiserver.admission_chain import admission_review, with_system_metadata
from kube_vgpu.standins.apiserver.defaults import decoded
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.webhook.quota.shared import NEVER_CREATED_AFTER
from tests.support.webhook import CORES, container, gpu_uuid, pod
from tests.support.webhook_bypass import (
    AUTHOR,
    Cluster,
    _sleep,
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


def test_quota_ignores_a_booking_that_disagrees_with_the_pods_limits(cluster: Cluster) -> None:
    # A running pod holds 10000 MiB; its booking says 1 MiB (written while admission was bypassed).
    # One entry for its one container, so the check that matters is the MiB, not the entry count.
    running = running_pod(cluster, {VGPU_IDS_NEW: f"{gpu_uuid('a100', 0)},NVIDIA,1,0:"})
    cluster.store({"pod": running})
    cluster.wait_cached("mem-15000", "train")
    answer = cluster.create(gpu_pod("mem-15000", "second", memory=10000))
    assert refused(answer, "vgpu-memory quota exceeded", "in use 10000 MiB of 15000 MiB")


# --- 4. honest charges --------------------------------------------------------------------------


def test_a_container_without_cores_is_charged_a_whole_gpu_with_a_warning(cluster: Cluster) -> None:
    first = cluster.create(gpu_pod("cores-150", "a", memory=1000))
    assert first["allowed"]
    assert any("states no volcano.sh/vgpu-cores" in w and "100" in w for w in first["warnings"])
    # 100 charged, 50 left: a second uncapped container does not fit, a capped one does.
    assert refused(
        cluster.create(gpu_pod("cores-150", "b", memory=1000)), "vgpu-cores quota exceeded", "in use 100%"
    )
    assert cluster.create(gpu_pod("cores-150", "c", memory=1000, cores=50))["allowed"]


def test_default_cores_gives_the_container_a_real_limit_and_the_charge(
    apiserver: ApiServerStandin, tmp_path: Path
) -> None:
    config = Config(webhook=WebhookConfig(default_cores=30))
    made = start(apiserver, tmp_path, config)
    with made.webhook:
        answers = [made.create(gpu_pod("cores-150", f"p{i}", memory=1000)) for i in range(6)]
    assert [a["allowed"] for a in answers] == [True] * 5 + [False]
    limits = answers[0]["pod"]["spec"]["containers"][0]["resources"]
    assert limits["limits"][CORES] == limits["requests"][CORES] == "30"
    assert not answers[0]["warnings"]
    assert refused(answers[5], "requested 30%", "in use 150% of 150%")


def test_a_mig_pod_is_charged_the_slot_it_will_hold(cluster: Cluster) -> None:
    # H100 80GB's smallest slot (1g.10gb) is 9984 MiB in the shipped geometry: asking 1 MiB holds it.
    tiny = gpu_pod("mem-15000", "a", memory=1)
    tiny["metadata"]["annotations"] = {"volcano.sh/vgpu-mode": "mig"}
    assert cluster.create(tiny)["allowed"]
    second = copy.deepcopy(tiny)
    second["metadata"]["name"] = "b"
    assert refused(cluster.create(second), "requested 9984 MiB", "in use 9984 MiB of 15000 MiB")


def test_a_booked_mig_pod_still_costs_its_slot(cluster: Cluster) -> None:
    # Volcano records the MiB asked in a mig booking (protocol §4.2), not the slot's size: once the
    # first pod is booked it must still cost 9984 MiB, or every 1 MiB pod would fit after booking.
    tiny = gpu_pod("mem-15000", "a", memory=1)
    tiny["metadata"]["annotations"] = {"volcano.sh/vgpu-mode": "mig"}
    admitted = cluster.create(tiny)
    assert admitted["allowed"]
    booked = copy.deepcopy(admitted["pod"])
    booked["metadata"]["annotations"][VGPU_IDS_NEW] = f"{gpu_uuid('h100', 0)}[group1-0],NVIDIA,1,0:"
    cluster.store({"pod": booked})
    cluster.wait_cached("mem-15000", "a")
    second = copy.deepcopy(tiny)
    second["metadata"]["name"] = "b"
    assert refused(cluster.create(second), "requested 9984 MiB", "in use 9984 MiB of 15000 MiB")


# --- 5. two phases: reinvocation, dry runs, existing names, a stale cache -----------------------


def test_a_reinvoked_generate_name_pod_is_booked_once(cluster: Cluster) -> None:
    job = pod(container(number=1), namespace="one-gpu", name="")
    del job["metadata"]["name"]
    job["metadata"]["generateName"] = "job-"
    first = cluster.create(job, reinvoke=2)
    assert first["allowed"] and first["pod"]["metadata"]["name"].startswith("job-")
    assert refused(cluster.create(job), "vgpu-number quota exceeded", "in use 1 vGPU of 1 vGPU")


def test_a_dry_run_reserves_nothing(cluster: Cluster) -> None:
    for _ in range(3):
        assert cluster.create(gpu_pod("one-gpu", "a"), dry_run=True)["allowed"]
    assert cluster.create(gpu_pod("one-gpu", "a"))["allowed"]


def finished(cluster: Cluster, namespace: str, name: str) -> None:
    """A pod of that name that ran and finished, as the webhook's cache shows it (issue 33)."""
    stored = cluster.store(cluster.create(gpu_pod(namespace, name)))
    cluster.apiserver.put({**stored, "status": {"phase": "Succeeded"}})
    cluster.wait_cached(namespace, name)
    for _ in range(500):  # until the quota has seen it finish: it no longer counts
        if not refused(cluster.create(gpu_pod(namespace, "probe"), dry_run=True), "quota exceeded"):
            return
        cluster.webhook.call(_sleep(0.01))
    raise AssertionError(f"the webhook never saw {namespace}/{name} finish")


@pytest.mark.parametrize(("namespace", "other_admitted"), [("one-gpu", False), ("two-gpus", True)])
def test_a_pod_created_again_under_a_finished_pods_name_is_booked(
    cluster: Cluster, namespace: str, other_admitted: bool
) -> None:
    # A Job's pod, or `kubectl delete` + `kubectl apply`, while the pod watch is reconnecting: the
    # cache still holds the finished `job` when the new one is admitted, and the API server stores it.
    finished(cluster, namespace, "job")
    assert cluster.create(gpu_pod(namespace, "job"))["allowed"]
    other = cluster.create(gpu_pod(namespace, "other"))
    if other_admitted:  # one vGPU left: the other pod fits, and nothing more does
        assert other["allowed"]
        assert refused(cluster.create(gpu_pod(namespace, "third")), "in use 2 vGPUs of 2 vGPUs")
    else:
        assert refused(other, f"namespace {namespace}: vgpu-number quota exceeded", "in use 1 vGPU of 1 vGPU")


def test_a_create_of_a_live_pods_name_is_booked_until_the_pod_watch_is_past_it(cluster: Cluster) -> None:
    cluster.store(cluster.create(gpu_pod("two-gpus", "a")))
    cluster.wait_cached("two-gpus", "a")
    # The API server will refuse this create (AlreadyExists); its booking holds the second vGPU
    # until the webhook can tell the pod was never created, as a forged review's does.
    assert cluster.create(gpu_pod("two-gpus", "a"))["allowed"]
    assert refused(cluster.create(gpu_pod("two-gpus", "b")), "vgpu-number quota exceeded", "in use 2 vGPUs")
    # Checked all the same: a delete-and-recreate the cache has not caught up with cannot trade
    # a small pod for one over quota.
    assert refused(cluster.create(gpu_pod("two-gpus", "a", number=2)), "vgpu-number quota exceeded")
    cluster.clock.now += NEVER_CREATED_AFTER - 1  # within the bound: the pod could still be stored
    watch_moves_on(cluster, "tick-1")
    assert refused(cluster.create(gpu_pod("two-gpus", "b")), "vgpu-number quota exceeded")
    cluster.clock.now += 1  # past the API server's request timeout and the delivery slack
    watch_moves_on(cluster, "tick-2")
    assert cluster.create(gpu_pod("two-gpus", "b"))["allowed"]


def watch_moves_on(cluster: Cluster, name: str) -> None:
    """Any pod event: the webhook's pod watch confirms it is current at the clock's time."""
    cluster.apiserver.put(gpu_pod("free", name))
    cluster.wait_cached("free", name)


def test_validation_without_a_uid_cannot_book_quota(cluster: Cluster) -> None:
    answer = cluster.call("/validate", admission_review(gpu_pod("one-gpu"), username=AUTHOR))
    assert refused(answer, "metadata.uid is missing", "ValidatingWebhookConfiguration")


def test_a_stale_cache_refuses_quota_decisions(cluster: Cluster) -> None:
    cluster.clock.now += 121  # nothing heard from the API server for longer than the bound
    answer = cluster.create(gpu_pod("one-gpu", "a"))
    assert refused(answer, "namespace one-gpu", "120 s", "quota cannot be checked")
    # A namespace with no quota has nothing to check.
    assert cluster.create(gpu_pod("free", "a"))["allowed"]


# --- 6. forged reviews: a reservation for a pod that is never created --------------------------------


def test_a_forged_review_books_quota_only_until_the_pod_watch_is_past_it(cluster: Cluster) -> None:
    # Sent straight to the webhook's port, as any pod that reaches it could: a CREATE for another
    # namespace with a made-up uid. No pod follows.
    ghost = with_system_metadata(decoded(gpu_pod("one-gpu", "ghost", number=1)))
    assert cluster.call("/validate", admission_review(ghost, username=AUTHOR))["allowed"]
    assert refused(cluster.create(gpu_pod("one-gpu", "real")), "vgpu-number quota exceeded", "in use 1")

    cluster.clock.now += NEVER_CREATED_AFTER - 1  # within the bound: the pod could still be stored
    watch_moves_on(cluster, "tick-1")
    assert refused(cluster.create(gpu_pod("one-gpu", "real")), "vgpu-number quota exceeded")
    cluster.clock.now += 1  # 65 s: past the API server's request timeout and the delivery slack
    watch_moves_on(cluster, "tick-2")
    assert cluster.create(gpu_pod("one-gpu", "real"))["allowed"]  # long before the 120 s bound
