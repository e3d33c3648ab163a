"""What NodePrepareResources decides, as pure functions: which allocation results of a ResourceClaim
are this node's, what share of which GPU each one holds, whether the GPU can take it beside the claims
already prepared here, and the HAMi-core limits and mounts its containers get.

The ResourceClaim is the `resource.k8s.io/v1` object as the API server sends it (plain JSON); the
shapes read here follow `k8s.io/api/resource/v1/types.go` (AllocationResult, DeviceRequestAllocationResult).
Every refusal is a `ClaimRefused` whose message names the claim, the device and the figures.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Final

from kube_vgpu.contract.container_paths import (
    CACHE_IN_CONTAINER,
    LIBRARY_IN_CONTAINER,
    LOCK_IN_CONTAINER,
    PRELOAD_IN_CONTAINER,
)

MIB: Final = 1024 * 1024
# Capacity names of a GPU device in the driver's ResourceSlice (consumable capacity).
MEMORY: Final = "memory"
CORES: Final = "cores"
WHOLE_CARD_CORES: Final = 100
# A quantity longer than this is no GPU's capacity (apimachinery's own bound on its text is similar).
MAX_QUANTITY_TEXT: Final = 64

# apimachinery's quantity grammar (k8s.io/apimachinery/pkg/api/resource/quantity.go): a signed decimal
# number, then a binary suffix, a decimal SI suffix or a decimal exponent.
_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<binary>Ki|Mi|Gi|Ti|Pi|Ei)|(?P<decimal>[numkMGTPE])|[eE](?P<exponent>[+-]?[0-9]+))?"
)
_BINARY: Final = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL: Final = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


# A Kubernetes UID is a UUID; the uid names files (the claim's CDI spec), so nothing else is accepted.
_UID = re.compile(r"[0-9A-Za-z][0-9A-Za-z-]{0,62}")


class ClaimRefused(Exception):
    """A claim (or one of its results) that this node must not prepare; the message says why."""


@dataclass(frozen=True)
class Card:
    """One GPU of the node as a device of the driver's pool."""

    device: str  # the device name in the ResourceSlice
    uuid: str
    index: int
    memory_mib: int
    # Why the GPU cannot be used now (an XID, HAMi-core missing), or None when healthy.
    unhealthy: str | None = None


@dataclass(frozen=True)
class Share:
    """What one allocation result holds of one GPU."""

    request: str  # the result's request name (`req` or `req/sub`)
    device: str
    gpu_uuid: str
    memory_mib: int
    cores: int
    share_id: str | None = None
    # An admin-access result (DRAAdminAccess: only in namespaces labelled for it) reaches the device
    # beside its users, for monitoring or maintenance: it consumes nothing and gets no limits.
    admin: bool = False


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it in NodePrepareResources."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} (uid {self.uid})"


def check_uid(ref: ClaimRef) -> None:
    """Refuse a claim whose uid is no Kubernetes UID (it would name a file)."""
    if not _UID.fullmatch(ref.uid):
        raise ClaimRefused(f"claim {ref.namespace}/{ref.name}: uid {ref.uid[:80]!r} is not a Kubernetes UID")


def quantity_value(raw: object) -> Decimal:
    """The exact value of a Kubernetes quantity (`30Gi`, `81920Mi`, `1e3`, `50`); ValueError when it is
    none."""
    if isinstance(raw, bool) or not isinstance(raw, str | int):
        raise ValueError(f"is not a quantity (a {type(raw).__name__})")
    text = str(raw)
    match = _QUANTITY.fullmatch(text) if len(text) <= MAX_QUANTITY_TEXT else None
    if match is None:
        raise ValueError(f"{text[:MAX_QUANTITY_TEXT]!r} is not a Kubernetes quantity")
    try:
        number = Decimal(match["number"])
        if match["binary"]:
            return number * Decimal(1024 ** _BINARY[match["binary"]])
        exponent = _DECIMAL[match["decimal"]] if match["decimal"] else int(match["exponent"] or 0)
        if abs(exponent) > 30:
            raise ValueError(f"{text!r} is out of any GPU's range")
        scaled: Decimal = number.scaleb(exponent)
        return scaled
    except InvalidOperation:  # pragma: no cover - the grammar admits only what Decimal reads
        raise ValueError(f"{text!r} is not a Kubernetes quantity") from None


def _str(value: object, what: str, claim: ClaimRef) -> str:
    if not isinstance(value, str) or not value:
        raise ClaimRefused(f"claim {claim}: {what} is missing or not a string")
    return value


def allocation_results(claim_object: Mapping[str, Any], ref: ClaimRef) -> list[Mapping[str, Any]]:
    """The allocation results of the ResourceClaim read from the API, after checking that it is the
    claim the kubelet named (same uid) and that it is allocated."""
    metadata = claim_object.get("metadata")
    uid = metadata.get("uid") if isinstance(metadata, Mapping) else None
    if uid != ref.uid:
        raise ClaimRefused(
            f"claim {ref}: the API server holds a claim of that name with uid {uid!r}, not the one the "
            "kubelet asked for (deleted and created again?)"
        )
    status = claim_object.get("status")
    allocation = status.get("allocation") if isinstance(status, Mapping) else None
    devices = allocation.get("devices") if isinstance(allocation, Mapping) else None
    results = devices.get("results") if isinstance(devices, Mapping) else None
    if not isinstance(allocation, Mapping):
        raise ClaimRefused(f"claim {ref}: not allocated (status.allocation is empty)")
    if not isinstance(results, list) or not all(isinstance(r, Mapping) for r in results):
        raise ClaimRefused(f"claim {ref}: status.allocation.devices.results is missing or malformed")
    return results


def admin_requests(claim_object: Mapping[str, Any]) -> frozenset[str]:
    """The names of the claim's requests that ask admin access (`exactly.adminAccess: true`; a
    `firstAvailable` alternative cannot). A result marked adminAccess must belong to one of them."""
    spec = claim_object.get("spec")
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    if not isinstance(requests, list):
        return frozenset()
    names = []
    for request in requests:
        exactly = request.get("exactly") if isinstance(request, Mapping) else None
        if isinstance(exactly, Mapping) and exactly.get("adminAccess") is True:
            names.append(request.get("name"))
    return frozenset(n for n in names if isinstance(n, str))


def own_results(
    results: Iterable[Mapping[str, Any]], *, driver: str, pool: str, ref: ClaimRef
) -> list[Mapping[str, Any]]:
    """The results this plugin serves: its driver's, in this node's pool. Other drivers' results are
    theirs to prepare; one of this driver in another node's pool cannot be served here."""
    mine = []
    for result in results:
        if result.get("driver") != driver:
            continue
        if result.get("pool") != pool:
            raise ClaimRefused(
                f"claim {ref}: result for request {result.get('request')!r} is in pool "
                f"{result.get('pool')!r}, not this node's pool {pool!r}"
            )
        mine.append(result)
    return mine


def _memory_mib(raw: object, card: Card, ref: ClaimRef, request: str) -> int:
    try:
        value = quantity_value(raw)
    except ValueError as exc:
        raise ClaimRefused(f"claim {ref}: request {request!r} consumes memory {exc}") from None
    if value <= 0:
        raise ClaimRefused(f"claim {ref}: request {request!r} consumes memory {raw!r}, not a positive amount")
    if value % MIB:
        raise ClaimRefused(
            f"claim {ref}: request {request!r} consumes memory {raw!r}, not a whole number of MiB"
        )
    mib = int(value // MIB)
    if mib > card.memory_mib:
        raise ClaimRefused(
            f"claim {ref}: request {request!r} consumes {mib} MiB of device {card.device} ({card.uuid}), "
            f"which has {card.memory_mib} MiB"
        )
    return mib


def _cores(raw: object, ref: ClaimRef, request: str) -> int:
    try:
        value = quantity_value(raw)
    except ValueError as exc:
        raise ClaimRefused(f"claim {ref}: request {request!r} consumes cores {exc}") from None
    if value != value.to_integral_value() or not 1 <= value <= WHOLE_CARD_CORES:
        raise ClaimRefused(
            f"claim {ref}: request {request!r} consumes cores {raw!r}; a share is a whole percent of the "
            f"GPU's SMs from 1 to {WHOLE_CARD_CORES}"
        )
    return int(value)


def shares(
    results: Iterable[Mapping[str, Any]],
    cards: Mapping[str, Card],
    ref: ClaimRef,
    admin: Collection[str] = frozenset(),
) -> list[Share]:
    """The share of a GPU each result holds: its consumedCapacity (memory in bytes, cores in percent),
    or the whole card for a result that consumed none (a device allocated to this claim alone).

    `admin`: the claim's requests that ask admin access (`admin_requests`). A result marked
    adminAccess gets its GPU without limits, so one whose request does not ask it is refused rather
    than trusted: only the request, which the API server checked against its namespace's label,
    says that it may."""
    out = []
    for result in results:
        request = _str(result.get("request"), "an allocation result's request", ref)
        device = _str(result.get("device"), f"the device of request {request!r}", ref)
        card = cards.get(device)
        if card is None:
            raise ClaimRefused(
                f"claim {ref}: request {request!r} got device {device!r}, which this node does not have"
            )
        if card.unhealthy is not None:
            raise ClaimRefused(
                f"claim {ref}: request {request!r} got device {device} ({card.uuid}), which is unhealthy: "
                f"{card.unhealthy}"
            )
        share_id = result.get("shareID")
        share_id = share_id if isinstance(share_id, str) else None
        if result.get("adminAccess") is True:
            if request not in admin:
                raise ClaimRefused(
                    f"claim {ref}: the result for request {request!r} on device {device} ({card.uuid}) "
                    f"is marked adminAccess, but the claim's request {request!r} does not ask it "
                    "(spec.devices.requests[].exactly.adminAccess is not true); refused rather than "
                    "give the GPU without limits"
                )
            out.append(Share(request, device, card.uuid, 0, 0, share_id, admin=True))
            continue
        consumed = result.get("consumedCapacity")
        if consumed is None:
            consumed = {}
        if not isinstance(consumed, Mapping):
            raise ClaimRefused(f"claim {ref}: request {request!r} has a malformed consumedCapacity")
        memory = _memory_mib(consumed[MEMORY], card, ref, request) if MEMORY in consumed else card.memory_mib
        cores = _cores(consumed[CORES], ref, request) if CORES in consumed else WHOLE_CARD_CORES
        out.append(Share(request, device, card.uuid, memory, cores, share_id))
    return out


def check_fit(
    ref: ClaimRef,
    new: Sequence[Share],
    prepared: Mapping[str, Sequence[Share]],
    cards: Mapping[str, Card],
) -> None:
    """Refuse `new` (the shares of claim `ref`) when, with the shares of the other claims prepared on
    this node, a GPU would hold more memory or cores than it has. Admin-access shares hold nothing
    and are not counted among the claims holding the GPU."""
    for device in dict.fromkeys(s.device for s in new):
        card = cards[device]
        others = [
            s
            for uid, held in prepared.items()
            if uid != ref.uid
            for s in held
            if s.device == device and not s.admin
        ]
        claims = len(
            {
                uid
                for uid, held in prepared.items()
                if uid != ref.uid and any(s.device == device and not s.admin for s in held)
            }
        )
        mine = [s for s in new if s.device == device]
        for what, unit, asked, used, total in (
            (
                "memory",
                "MiB",
                sum(s.memory_mib for s in mine),
                sum(s.memory_mib for s in others),
                card.memory_mib,
            ),
            ("cores", "%", sum(s.cores for s in mine), sum(s.cores for s in others), WHOLE_CARD_CORES),
        ):
            if asked + used > total:
                raise ClaimRefused(
                    f"claim {ref}: device {device} ({card.uuid}) would be over-committed: {what} {asked} "
                    f"{unit} asked + {used} {unit} held by {claims} other prepared claim(s) > {total} {unit} "
                    "on the card"
                )


@dataclass(frozen=True)
class Mount:
    """A host path bind-mounted into the container."""

    host_path: str
    container_path: str
    read_only: bool


@dataclass(frozen=True)
class Edits:
    """What kube-vgpu's CDI device of one request gives a container."""

    env: tuple[str, ...]
    mounts: tuple[Mount, ...]


def cache_host_dir(hook_path: str, claim_uid: str, request: str) -> str:
    """The host folder of one request's HAMi-core shared cache: `<hookPath>/vgpu/claims/<uid>_<request>`
    (every container using the request shares its limit, so they share the cache)."""
    return posixpath.join(hook_path, "vgpu", "claims", f"{claim_uid}_{request.replace('/', '_')}")


def request_edits(held: Sequence[Share], *, hook_path: str, lock_dir: str, cache_dir: str) -> Edits:
    """The HAMi-core environment and mounts for the GPUs of one request (in result order), as the
    device plugin's hami-core Allocate answer gives them (`node.deviceplugin.hamicore`).

    One SM limit covers every GPU of the container, so it is the smallest share's: each GPU stays
    within what its claim holds. The GPUs themselves come from their own CDI devices.
    """
    env = [f"CUDA_DEVICE_MEMORY_LIMIT_{i}={share.memory_mib}m" for i, share in enumerate(held)]
    env.append(f"CUDA_DEVICE_SM_LIMIT={min((s.cores for s in held), default=0)}")
    env.append(f"CUDA_DEVICE_MEMORY_SHARED_CACHE={posixpath.join(CACHE_IN_CONTAINER, 'vgpu.cache')}")
    mounts = (
        Mount(posixpath.join(hook_path, "libvgpu.so"), LIBRARY_IN_CONTAINER, True),
        Mount(cache_dir, CACHE_IN_CONTAINER, False),
        Mount(lock_dir, LOCK_IN_CONTAINER, False),
        Mount(posixpath.join(hook_path, "ld.so.preload"), PRELOAD_IN_CONTAINER, True),
    )
    return Edits(tuple(env), mounts)


def base_request(request: str) -> str:
    """The request a container names for a result: `req` of a `firstAvailable` sub-request `req/sub`.
    The kubelet matches a container's `resources.claims[].request` against a device's request names
    exactly (pkg/kubelet/cm/dra/claiminfo.go, cdiDevicesAsList), and a container can only name the
    request, so the plugin reports that (as the kubeletplugin helper strips sub-request names)."""
    return request.partition("/")[0]


def by_request(held: Iterable[Share]) -> dict[str, list[Share]]:
    """Shares that get limits (not admin access), grouped by request name, in result order."""
    groups: dict[str, list[Share]] = {}
    for share in held:
        if not share.admin:
            groups.setdefault(share.request, []).append(share)
    return groups
