"""The webhook charges a ResourceClaim from its spec before the scheduler allocates it; the charge
must never be less than what the allocation then consumes, or a namespace could hold more GPU than
its quota says. Property-style over many request shapes (memory below the driver's minimum, amounts
off the 1 MiB step, decimal and exponent quantities, no memory, no cores, counts, firstAvailable
alternatives), on Kubernetes 1.36's gates (shared GPUs, consumable capacity) and 1.35's (whole GPUs,
the API server dropping the capacity requests):

* the claim is stored as the API server stores it (the stand-in's strategy: defaults, canonical
  quantities, fields of gates that are off dropped), which is what the validating webhook sees;
* the charge is the webhook's (`parse_claim`, `claim_charge`, with the largest GPU of the cluster);
* the allocation is the scheduler stand-in's on an empty node of kube-vgpu's own slices; a result
  with `consumedCapacity` consumes that, one without it (a whole device) the device's capacity.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kube_vgpu.contract.dra import DEVICE_CLASS
from kube_vgpu.demo.dra import device_class
from kube_vgpu.node.dra.attributes import GpuFacts
from kube_vgpu.node.dra.slices import PoolSpec, SliceOptions, build_devices, build_slices
from kube_vgpu.standins.apiserver import dra, quantity
from kube_vgpu.standins.apiserver.resources import lookup
from kube_vgpu.standins.dra.allocator import ClaimAllocator, Unschedulable, cel_selector
from kube_vgpu.webhook.quota.charge import Charge
from kube_vgpu.webhook.quota.claims import ClaimError, claim_charge, parse_claim

NODE = "node-a"
MIB = Decimal(1024 * 1024)
# Two cards of different sizes: a request naming no memory may land on either, and is charged the
# larger (the webhook charges the largest GPU of the cluster).
GPUS = [
    GpuFacts(0, 0, "GPU-00000000-0000-0000-0000-000000000000", "NVIDIA A100-SXM4-40GB", 40960),
    GpuFacts(1, 1, "GPU-00000001-0000-0000-0000-000000000000", "NVIDIA A100-SXM4-80GB", 81920),
    GpuFacts(2, 2, "GPU-00000002-0000-0000-0000-000000000000", "NVIDIA A100-SXM4-80GB", 81920),
]
LARGEST_MIB = 81920
CLASSES = frozenset({DEVICE_CLASS})
CLAIMS = lookup("resourceclaims")
SELECTOR = cel_selector()

MEMORY = st.sampled_from(
    [
        None,
        "0",
        "1",  # one byte
        "1Mi",
        "255Mi",  # below the policy's 256Mi minimum
        "256Mi",
        "257Mi",
        "300.5Mi",  # off the 1Mi step
        "1000001",  # bytes, off the step
        "1G",  # decimal: 953.67 MiB
        "1.5Gi",
        "2e9",
        "20Gi",
        "40Gi",
        "40961Mi",  # one MiB more than the small card
        "80Gi",
        "81920Mi",
        "100Gi",  # more than any card: never allocated
    ]
)
CORES = st.sampled_from([None, "0", "250m", "1", "1.5", "30", "50", "99.9", "100", "101"])


@st.composite
def bodies(draw: st.DrawFn) -> dict[str, Any]:
    """One `exactly` body, or a firstAvailable alternative without its name."""
    body: dict[str, Any] = {"deviceClassName": DEVICE_CLASS}
    amounts = {k: v for k, v in (("memory", draw(MEMORY)), ("cores", draw(CORES))) if v is not None}
    if amounts:
        body["capacity"] = {"requests": amounts}
    count = draw(st.sampled_from([None, 1, 2]))
    if count is not None:
        body["count"] = count
    return body


@st.composite
def claims(draw: st.DrawFn) -> dict[str, Any]:
    requests: list[dict[str, Any]] = []
    for i in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            requests.append({"name": f"r{i}", "exactly": draw(bodies())})
        else:
            alternatives = draw(st.lists(bodies(), min_size=1, max_size=3))
            requests.append(
                {
                    "name": f"r{i}",
                    "firstAvailable": [{"name": f"s{j}", **a} for j, a in enumerate(alternatives)],
                }
            )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "team-a", "uid": "claim-uid"},
        "spec": {"devices": {"requests": requests}},
    }


def stored(claim: dict[str, Any], gates: dra.FeatureGates) -> dict[str, Any]:
    """The claim as the API server stores it and hands it to validating webhooks."""
    dra.prepare(CLAIMS, claim, None, gates, scope="main")
    return claim


def consumption(claim: dict[str, Any], options: SliceOptions) -> Charge | None:
    """What the scheduler stand-in's allocation of `claim` consumes on an empty node (None: it cannot
    be allocated there)."""
    slices = build_slices(PoolSpec(NODE, "uid", 1, build_devices(GPUS, {}, options)))
    devices = {d["name"]: d for s in slices for d in s["spec"]["devices"]}
    allocator = ClaimAllocator(slices, {DEVICE_CLASS: device_class()}, selector=SELECTOR)
    try:
        results = allocator.allocate(claim, NODE)["devices"]["results"]
    except Unschedulable:
        return None
    memory = Decimal(0)
    cores = Decimal(0)
    for result in results:
        capacity = devices[result["device"]]["capacity"]
        consumed = result.get("consumedCapacity") or {}
        memory += quantity.parse(str(consumed.get("memory", capacity["memory"]["value"]))).amount
        cores += quantity.parse(str(consumed.get("cores", capacity["cores"]["value"]))).amount
    return Charge(len(results), int(-(-memory // MIB)), int(-(-cores // 1)))


def covers(
    claim: dict[str, Any], gates: dra.FeatureGates, options: SliceOptions
) -> tuple[Charge, Charge] | None:
    body = stored(claim, gates)
    try:
        charge = claim_charge(parse_claim(body, CLASSES), LARGEST_MIB)
    except ClaimError:
        return None  # the webhook refuses the claim: nothing is allocated
    used = consumption(body, options)
    if used is None:
        return None
    assert charge.number >= used.number, (charge, used, body["spec"])
    assert charge.memory_mib >= used.memory_mib, (charge, used, body["spec"])
    assert charge.cores >= used.cores, (charge, used, body["spec"])
    return charge, used


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(claims())
def test_the_charge_covers_the_allocation_with_consumable_capacity(claim: dict[str, Any]) -> None:
    covers(claim, dra.FeatureGates.of_release(36), SliceOptions())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(claims())
def test_the_charge_covers_the_allocation_on_whole_gpus(claim: dict[str, Any]) -> None:
    """1.35's defaults: the API server drops the capacity requests and every result is a whole
    device; the webhook sees a claim naming no memory and charges the largest GPU."""
    covers(
        claim, dra.FeatureGates.of_release(35), SliceOptions(consumable_capacity=False, device_taints=False)
    )


def test_the_edges_are_exact_where_the_policy_rounds() -> None:
    """Examples pinned: the charge equals the allocation where the amounts are stated (rounded the
    same way on both sides), and exceeds it only by the whole-card rule."""

    def one(memory: str | None, cores: str | None) -> tuple[Charge, Charge] | None:
        amounts = {k: v for k, v in (("memory", memory), ("cores", cores)) if v is not None}
        body: dict[str, Any] = {"deviceClassName": DEVICE_CLASS}
        if amounts:
            body["capacity"] = {"requests": amounts}
        claim = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "team-a", "uid": "u"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": body}]}},
        }
        return covers(claim, dra.FeatureGates.of_release(36), SliceOptions())

    assert one("1", "0") == (Charge(1, 256, 1), Charge(1, 256, 1))
    assert one("300.5Mi", "1.5") == (Charge(1, 301, 2), Charge(1, 301, 2))
    assert one("1G", "250m") == (Charge(1, 954, 1), Charge(1, 954, 1))
    # No memory: the first fitting card is the 40 GiB one; the charge is the largest card.
    assert one(None, "30") == (Charge(1, 81920, 30), Charge(1, 40960, 30))
    assert one("100Gi", "1") is None  # fits no card: never allocated
