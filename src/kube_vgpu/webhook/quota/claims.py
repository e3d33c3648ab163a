"""What a ResourceClaim of kube-vgpu's DRA classes costs against its namespace's GPU quota.

One parser (`parse_claim`) reads the fields of a `resource.k8s.io/v1` ResourceClaim the charge
depends on; the charge follows the request policy the driver publishes on every device
(`kube_vgpu.contract.dra`), so a claim is charged what the scheduler will make it consume:

- per device: `capacity.requests.memory` rounded up to whole MiB and to at least `MEMORY_MIN_MIB`;
  a request naming no memory gets the whole card (the policy's default), so it is charged the
  largest GPU it could get; `cores` rounded up to a whole percent, at least 1; none is 100;
- per request: `count` devices (`allocationMode: ExactCount`, count 1 when unset); `All` takes
  every matching device, which no quota can bound: the quota gate refuses it in a namespace with a
  GPU quota;
- `firstAvailable`: the scheduler picks one alternative, so the request is charged, per resource,
  the most any alternative of kube-vgpu's classes could cost;
- requests of other device classes cost nothing;
- a request with `adminAccess: true` costs nothing where the caller says its namespace is labelled
  `resource.kubernetes.io/admin-access: "true"` (`admin_free`): the scheduler gives it a device
  beside its users without counting it as allocated or consuming its capacity for anyone else
  (kube-scheduler's dynamicresources plugin, allocateddevices.go, skips such results), and the API
  server stores one only in a namespace so labelled, a label only a cluster admin can set
  (pkg/registry/resource/utils.go, AuthorizedForAdmin). Elsewhere it is charged like any request,
  so the quota does not rest on the API server's check alone.

Pure: no I/O; the work is bounded by Kubernetes' own limits on a claim, checked first.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from decimal import Context, Decimal, InvalidOperation
from typing import Any, Final, NotRequired, TypedDict

from kube_vgpu.contract.dra import CORES, CORES_CAPACITY, CORES_MIN, MEMORY_CAPACITY, MEMORY_MIN_MIB
from kube_vgpu.contract.quantity import BINARY_SUFFIXES, DECIMAL_SUFFIXES, MAX_TEXT
from kube_vgpu.webhook.quota.charge import ZERO, Charge, Resource

# k8s.io/api/resource/v1/types.go: DeviceRequestsMaxSize, FirstAvailableDeviceRequestMaxSize and
# AllocationResultsMaxSize (no claim is ever allocated more devices than this).
MAX_REQUESTS: Final = 32
MAX_SUBREQUESTS: Final = 8
MAX_COUNT: Final = 32
# No GPU has 2 PiB of memory: a larger amount is a typo or hostile, refused rather than charged.
MAX_MEMORY_MIB: Final = 2**31
# The namespace label without which the API server refuses a request with `adminAccess: true`
# (k8s.io/api/resource/v1/types.go, DRAAdminNamespaceLabelKey; checked in
# pkg/registry/resource/utils.go, AuthorizedForAdmin).
ADMIN_ACCESS_LABEL: Final = "resource.kubernetes.io/admin-access"
ADMIN_ACCESS_VALUE: Final = "true"
_MIB: Final = Decimal(1024 * 1024)
_EXACT = Context(prec=4 * MAX_TEXT)
_QUANTITY = re.compile(
    r"^(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<binary>Ki|Mi|Gi|Ti|Pi|Ei)|[eE](?P<exponent>[+-]?[0-9]+)|(?P<decimal>[numkMGTPE]))?$"
)


class ClaimError(ValueError):
    """A ResourceClaim the quota cannot charge; `str()` names the field and what is wrong."""


# -- the fields read (k8s.io/api/resource/v1/types.go) ---------------------------------------------


class CapacityRequirements(TypedDict, total=False):
    """`capacity` of a device request: amounts per capacity name."""

    requests: dict[str, str]


class ExactDeviceRequest(TypedDict, total=False):
    """`exactly` of a DeviceRequest (and the body of a `firstAvailable` sub-request)."""

    deviceClassName: str
    allocationMode: str
    count: int
    capacity: CapacityRequirements


class ExactRequest(ExactDeviceRequest, total=False):
    """`exactly` of a DeviceRequest: a sub-request has no `adminAccess`."""

    adminAccess: bool


class DeviceSubRequest(ExactDeviceRequest):
    """One alternative of `firstAvailable`."""

    name: NotRequired[str]


class DeviceRequest(TypedDict, total=False):
    """One `spec.devices.requests[]` entry."""

    name: str
    exactly: ExactRequest
    firstAvailable: list[DeviceSubRequest]


# -- what the charge is computed from --------------------------------------------------------------


@dataclass(frozen=True)
class DeviceAsk:
    """One way a request can be met: `count` devices of one class, each with these amounts."""

    request: str  # `req`, or `req/sub` for an alternative of firstAvailable (as allocation names it)
    device_class: str
    count: int
    all_devices: bool  # allocationMode All: every matching device
    memory_mib: int | None  # per device, rounded by the policy; None: names none (the whole card)
    cores: int | None  # per device, rounded; None: names none (100)


@dataclass(frozen=True)
class ClaimRequestAsk:
    """One request of the claim that may be met with kube-vgpu's devices."""

    name: str
    alternatives: tuple[DeviceAsk, ...]  # one for `exactly`; those of our classes for firstAvailable
    first_available: bool


@dataclass(frozen=True)
class ClaimRequest:
    """The requests of a claim that kube-vgpu's classes serve (others are not charged)."""

    requests: tuple[ClaimRequestAsk, ...] = ()
    # The names of the requests of kube-vgpu's classes with `adminAccess: true` (charged, and then
    # also in `requests`, only where `parse_claim` was not told they are free).
    admin: tuple[str, ...] = ()

    @property
    def asks_vgpu(self) -> bool:
        """Whether any request may be met with kube-vgpu's devices."""
        return bool(self.requests)

    @property
    def needs_gpu_size(self) -> bool:
        """Whether some alternative names no memory (charged the largest GPU it could get)."""
        return any(a.memory_mib is None for r in self.requests for a in r.alternatives)

    @property
    def all_devices(self) -> tuple[str, ...]:
        """The requests (or alternatives) asking `allocationMode: All`."""
        return tuple(a.request for r in self.requests for a in r.alternatives if a.all_devices)


# -- the parser -------------------------------------------------------------------------------------


def quantity(raw: object, where: str) -> Decimal:
    """The exact value of a Kubernetes quantity (`30Gi`, `1.5`, `2e3`); ClaimError naming `where`."""
    if isinstance(raw, bool) or not isinstance(raw, str | int):
        raise ClaimError(f'{where} must be a quantity such as "20Gi", got a {type(raw).__name__}')
    text = str(raw)
    match = _QUANTITY.match(text) if len(text) <= MAX_TEXT else None
    if match is None:
        raise ClaimError(f"{where} {text[:MAX_TEXT]!r} is not a Kubernetes quantity")
    try:
        number = Decimal(match["number"])
        if match["binary"]:
            return _EXACT.multiply(number, 1024 ** BINARY_SUFFIXES[match["binary"]])
        exponent = DECIMAL_SUFFIXES[match["decimal"]] if match["decimal"] else int(match["exponent"] or 0)
        if number and abs(exponent) > 2 * MAX_TEXT:
            raise ClaimError(f"{where} {text!r} is out of any GPU's range")
        return _EXACT.scaleb(number, exponent)
    except InvalidOperation:  # pragma: no cover - the grammar admits only what Decimal reads
        raise ClaimError(f"{where} {text!r} is not a Kubernetes quantity") from None


def memory_mib(raw: object, where: str) -> int:
    """A memory request in bytes, rounded up as the driver's policy does: whole MiB, at least 256."""
    value = quantity(raw, where)
    if value < 0:
        raise ClaimError(f"{where} {raw!r} is negative")
    mib = math.ceil(value / _MIB)
    if mib > MAX_MEMORY_MIB:
        raise ClaimError(f"{where} {raw!r} is more memory than any GPU has ({MAX_MEMORY_MIB} MiB at most)")
    return max(MEMORY_MIN_MIB, mib)


def cores_percent(raw: object, where: str) -> int:
    """A cores request, rounded up as the driver's policy does: a whole percent from 1 to 100."""
    value = quantity(raw, where)
    if value < 0:
        raise ClaimError(f"{where} {raw!r} is negative")
    cores = max(CORES_MIN, math.ceil(value))
    if cores > CORES:
        raise ClaimError(
            f"{where} {raw!r} is more than a GPU has: cores is a percent of a GPU's SMs, "
            f"{CORES_MIN} to {CORES}"
        )
    return cores


def _device_ask(spec: Mapping[str, Any], request: str, where: str) -> DeviceAsk:
    device_class = spec.get("deviceClassName")
    if not isinstance(device_class, str) or not device_class:
        raise ClaimError(f"{where}.deviceClassName must be a non-empty string")
    mode = spec.get("allocationMode", "ExactCount")
    if mode not in ("ExactCount", "All"):
        raise ClaimError(f"{where}.allocationMode must be ExactCount or All, got {str(mode)[:64]!r}")
    count = spec.get("count", 1) if mode == "ExactCount" else 0
    if isinstance(count, bool) or not isinstance(count, int) or (mode == "ExactCount" and count < 1):
        raise ClaimError(f"{where}.count must be a positive integer, got {str(count)[:64]!r}")
    if count > MAX_COUNT:
        raise ClaimError(
            f"{where}.count {count} is more than the {MAX_COUNT} devices a claim can be allocated"
        )
    capacity = spec.get("capacity")
    amounts = capacity.get("requests") if isinstance(capacity, Mapping) else None
    if capacity is not None and not isinstance(capacity, Mapping):
        raise ClaimError(f"{where}.capacity must be an object")
    if amounts is not None and not isinstance(amounts, Mapping):
        raise ClaimError(f"{where}.capacity.requests must be an object")
    amounts = amounts or {}
    memory = amounts.get(MEMORY_CAPACITY)
    cores = amounts.get(CORES_CAPACITY)
    return DeviceAsk(
        request=request,
        device_class=device_class,
        count=count,
        all_devices=mode == "All",
        memory_mib=None if memory is None else memory_mib(memory, f"{where}.capacity.requests.memory"),
        cores=None if cores is None else cores_percent(cores, f"{where}.capacity.requests.cores"),
    )


def _request(
    raw: object, index: int, classes: Collection[str], admin_free: bool
) -> tuple[ClaimRequestAsk | None, bool]:
    """The request's ask of `classes` (None: none, or an admin request that is free), and whether
    it is an admin request of `classes`."""
    where = f"spec.devices.requests[{index}]"
    if not isinstance(raw, Mapping):
        raise ClaimError(f"{where} must be an object")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise ClaimError(f"{where}.name must be a non-empty string")
    where = f"{where} ({name[:64]!r})"
    exactly, first = raw.get("exactly"), raw.get("firstAvailable")
    if (exactly is None) == (first is None):
        raise ClaimError(f"{where} must set exactly one of exactly and firstAvailable")
    if exactly is not None:
        if not isinstance(exactly, Mapping):
            raise ClaimError(f"{where}.exactly must be an object")
        ask = _device_ask(exactly, name, f"{where}.exactly")
        admin = exactly.get("adminAccess")
        if admin is not None and not isinstance(admin, bool):
            raise ClaimError(f"{where}.exactly.adminAccess must be true or false, got {str(admin)[:64]!r}")
        if ask.device_class not in classes:
            return None, False
        admin = admin is True
        if admin and admin_free:
            return None, True  # consumes no capacity: see the module's docstring
        return ClaimRequestAsk(name, (ask,), False), admin
    if not isinstance(first, list) or not first:
        raise ClaimError(f"{where}.firstAvailable must be a non-empty list")
    if len(first) > MAX_SUBREQUESTS:
        raise ClaimError(
            f"{where}.firstAvailable has {len(first)} alternatives; Kubernetes allows {MAX_SUBREQUESTS}"
        )
    ours = []
    for sub_index, sub in enumerate(first):
        sub_where = f"{where}.firstAvailable[{sub_index}]"
        if not isinstance(sub, Mapping):
            raise ClaimError(f"{sub_where} must be an object")
        sub_name = sub.get("name")
        if not isinstance(sub_name, str) or not sub_name:
            raise ClaimError(f"{sub_where}.name must be a non-empty string")
        ask = _device_ask(sub, f"{name}/{sub_name}", sub_where)
        if ask.device_class in classes:
            ours.append(ask)
    return (ClaimRequestAsk(name, tuple(ours), True) if ours else None), False


def parse_claim(
    claim: Mapping[str, Any], classes: Collection[str], *, admin_free: bool = False
) -> ClaimRequest:
    """The requests of `claim` that name one of `classes` (directly or as a firstAvailable
    alternative); ClaimError naming the field when the claim cannot be read. Every request is read,
    whatever its class, so a malformed claim is refused the same whichever request is bad.

    `admin_free`: whether requests with `adminAccess: true` cost nothing (their namespace carries
    `ADMIN_ACCESS_LABEL`); otherwise they are charged like any request."""
    spec = claim.get("spec")
    if not isinstance(spec, Mapping):
        raise ClaimError("spec must be an object")
    devices = spec.get("devices", {})
    if not isinstance(devices, Mapping):
        raise ClaimError("spec.devices must be an object")
    requests = devices.get("requests", [])
    if not isinstance(requests, list):
        raise ClaimError("spec.devices.requests must be a list")
    if len(requests) > MAX_REQUESTS:
        raise ClaimError(
            f"spec.devices.requests has {len(requests)} requests; Kubernetes allows {MAX_REQUESTS}"
        )
    found = [_request(raw, i, classes, admin_free) for i, raw in enumerate(requests)]
    return ClaimRequest(
        tuple(r for r, _ in found if r is not None),
        tuple(str(raw["name"]) for raw, (_, admin) in zip(requests, found, strict=True) if admin),
    )


def admin_free(namespace_labels: Mapping[str, str] | None) -> bool:
    """Whether the namespace's labels (as the webhook's cache holds them) let admin requests go
    uncharged: the label the API server demands of them is there."""
    return (namespace_labels or {}).get(ADMIN_ACCESS_LABEL) == ADMIN_ACCESS_VALUE


def names_class(claim: Mapping[str, Any], classes: Collection[str]) -> bool:
    """Whether any request of a (well-formed or not) claim names one of `classes`; never raises."""
    spec = claim.get("spec")
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    if not isinstance(requests, list):
        return False
    for raw in requests[:MAX_REQUESTS]:
        if not isinstance(raw, Mapping):
            continue
        exactly = raw.get("exactly")
        if isinstance(exactly, Mapping) and exactly.get("deviceClassName") in classes:
            return True
        first = raw.get("firstAvailable")
        if isinstance(first, list) and any(
            isinstance(s, Mapping) and s.get("deviceClassName") in classes for s in first[:MAX_SUBREQUESTS]
        ):
            return True
    return False


# -- the charge -------------------------------------------------------------------------------------


def device_charge(ask: DeviceAsk, gpu_mib: int | None) -> Charge:
    """What one alternative costs: count devices, each its memory (the whole largest GPU when it
    names none; 0 when no GPU size is known) and its cores (100 when it names none)."""
    memory = ask.memory_mib if ask.memory_mib is not None else (gpu_mib or 0)
    cores = ask.cores if ask.cores is not None else CORES
    return Charge(ask.count, ask.count * memory, ask.count * cores)


def request_charge(request: ClaimRequestAsk, gpu_mib: int | None) -> Charge:
    """One request's charge: its alternative, or per resource the most any alternative costs."""
    total = ZERO
    for ask in request.alternatives:
        total = total.max(device_charge(ask, gpu_mib))
    return total


def claim_charge(claim: ClaimRequest, gpu_mib: int | None) -> Charge:
    """The claim's charge: the sum over its requests of kube-vgpu's classes."""
    total = ZERO
    for request in claim.requests:
        total += request_charge(request, gpu_mib)
    return total


def claim_reasons(claim: ClaimRequest, gpu_mib: int | None) -> dict[Resource, list[str]]:
    """Per resource, why requests are charged more than the figures they state (for denials)."""
    memory: list[str] = []
    cores: list[str] = []
    number: list[str] = []
    for request in claim.requests:
        if request.first_available and len(request.alternatives) > 1:
            charge = request_charge(request, gpu_mib)
            text = (
                f"request {request.name!r} lists {len(request.alternatives)} alternatives of kube-vgpu's "
                f"classes in firstAvailable and is charged the most any could cost "
                f"({charge.number} GPU(s), {charge.memory_mib} MiB, {charge.cores}% cores)"
            )
            memory.append(text)
            cores.append(text)
            number.append(text)
        for ask in request.alternatives:
            if ask.memory_mib is None and gpu_mib:
                memory.append(
                    f"request {ask.request!r} names no memory, so it gets a whole GPU: {gpu_mib} MiB per "
                    "device on the largest GPU it could get"
                )
            if ask.cores is None:
                cores.append(
                    f"request {ask.request!r} names no cores, so it may use every SM: {CORES}% per device"
                )
    out: dict[Resource, list[str]] = {}
    if number:
        out["vgpu-number"] = number
    if memory:
        out["vgpu-memory"] = memory
    if cores:
        out["vgpu-cores"] = cores
    return out


def all_devices_message(namespace: str, requests: Sequence[str]) -> str:
    """The denial of `allocationMode: All` in a namespace with a GPU quota."""
    names = ", ".join(repr(r) for r in requests)
    return (
        f"namespace {namespace}: request {names} asks allocationMode All (every matching GPU), which "
        "a GPU quota cannot bound; ask allocationMode ExactCount with a count"
    )
