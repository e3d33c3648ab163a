"""LOCAL STAND-IN for the structured allocator of `k8s.io/dynamic-resource-allocation/structured`
(`allocator.go`, and the consumable-capacity rules of KEP-5075), reduced to what kube-vgpu uses.

What it does as the real one does:

* only the newest generation of each pool counts, and only once all its slices are there;
* a device matches a request when the DeviceClass's and the request's CEL selectors all say true;
* a device tainted `NoSchedule` or `NoExecute` is skipped unless the request tolerates the taint;
* a device without `allowMultipleAllocations` goes to one request of one claim; one with it goes to
  as many as its capacities hold: each capacity consumes what the request names for it, rounded up
  by the capacity's request policy (`validRange` min/step/max, `validValues`; an amount below the
  range's min, zero or negative included, consumes the min, as `roundUpRange` does), or, when the request
  names nothing, the policy's default, or the whole capacity when there is no policy; each such
  result carries a `shareID` and its `consumedCapacity`; a capacity a request names and the device
  lacks makes the device unsuitable, as does one over the device's value (for exclusive devices the
  request is a minimum);
* `adminAccess: true` (only on `exactly`, DRAAdminAccess): the device may already be allocated to
  other claims (not twice to this one, unless it allows multiple allocations); on a device that
  allows multiple allocations the request's capacity must still fit beside the other claims'
  shares (`CmpRequestOverCapacity` runs for it as for any request) and the result carries a
  `shareID` and `consumedCapacity`; the result says `adminAccess: true`, and results so marked
  count as allocated to nobody and consume nothing for later claims (kube-scheduler's
  `allocateddevices.go`, `foreachAllocatedDevice`);
* `exactly` with `count` or `allocationMode: All`; `firstAvailable` tries its sub-requests in order
  (results name `request/sub-request`); `matchAttribute` and `distinctAttribute` constraints;
* the allocation's `nodeSelector` names the node of node-local slices.

CEL runs through cel-python (a test dependency: the stand-in runs in tests); attributes are exposed
as `device.attributes[domain][name]` (versions as strings) and capacities as integers (`Value()`),
which covers the expressions kube-vgpu's classes and examples use.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, Decimal
from typing import Any

from kube_vgpu.standins.apiserver import quantity

DeviceId = tuple[str, str, str]  # driver, pool, device


class Unschedulable(Exception):
    """The claim cannot be allocated; the message says why, naming the request."""


@dataclass
class Candidate:
    """One device of a usable pool."""

    driver: str
    pool: str
    node: str | None
    device: dict[str, Any]

    @property
    def id(self) -> DeviceId:
        return (self.driver, self.pool, str(self.device.get("name")))

    @property
    def shared(self) -> bool:
        return self.device.get("allowMultipleAllocations") is True


def usable_devices(slices: Iterable[Mapping[str, Any]]) -> list[Candidate]:
    """The devices of the newest generation of each complete pool (`pools.go`: GatherPools)."""
    pools: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for s in slices:
        spec = s.get("spec") or {}
        pools.setdefault((str(spec.get("driver")), str((spec.get("pool") or {}).get("name"))), []).append(s)
    found: list[Candidate] = []
    for (driver, pool), members in sorted(pools.items()):
        newest = max(int(m["spec"]["pool"].get("generation") or 0) for m in members)
        current = [m for m in members if int(m["spec"]["pool"].get("generation") or 0) == newest]
        if len(current) != int(current[0]["spec"]["pool"].get("resourceSliceCount") or 0):
            continue  # incomplete: the allocator waits for the rest of the pool
        for m in current:
            for device in m["spec"].get("devices") or []:
                found.append(Candidate(driver, pool, m["spec"].get("nodeName"), device))
    return found


# -- quantities and request policies ---------------------------------------------------------------


def _amount(text: Any, what: str) -> Decimal:
    try:
        return quantity.parse(str(text)).amount
    except quantity.BadQuantity as exc:
        raise Unschedulable(f"{what}: {text!r} is not a quantity ({exc})") from None


def consumed(request_amount: Decimal | None, capacity: Mapping[str, Any], name: str) -> Decimal | None:
    """What one request consumes of one capacity of a shared device, or None when the policy
    cannot serve the amount (above max, or above every valid value)."""
    value = _amount(capacity.get("value"), f"capacity {name}")
    policy = capacity.get("requestPolicy")
    if request_amount is None:
        if isinstance(policy, dict) and policy.get("default") is not None:
            return _amount(policy["default"], f"capacity {name} default")
        return value
    if not isinstance(policy, dict):
        return request_amount
    if policy.get("validValues"):
        options = sorted(_amount(v, f"capacity {name} validValues") for v in policy["validValues"])
        return next((v for v in options if v >= request_amount), None)
    valid_range = policy.get("validRange")
    if not isinstance(valid_range, dict) or valid_range.get("min") is None:
        return request_amount
    low = _amount(valid_range["min"], f"capacity {name} min")
    high = _amount(valid_range["max"], f"capacity {name} max") if valid_range.get("max") is not None else None
    amount = max(request_amount, low)
    if valid_range.get("step") is not None:
        step = _amount(valid_range["step"], f"capacity {name} step")
        steps = ((amount - low) / step).to_integral_value(rounding=ROUND_CEILING)
        amount = low + steps * step
    if high is not None and amount > high:
        return None
    return amount


def _text(amount: Decimal, like: Any) -> str:
    binary = str(like).endswith("i")
    return quantity.Quantity(amount, "BinarySI" if binary else "DecimalSI").canonical()


# -- the allocator ---------------------------------------------------------------------------------


Selector = Callable[[str, Mapping[str, Any]], bool]


def cel_selector() -> Selector:
    """CEL through cel-python, compiled once per expression."""
    # A test dependency; only the stand-in imports it.
    import celpy
    from celpy.adapter import json_to_cel
    from celpy.evaluation import CELEvalError

    env = celpy.Environment()
    compiled: dict[str, Any] = {}

    def evaluate(expression: str, device: Mapping[str, Any]) -> bool:
        if expression not in compiled:
            compiled[expression] = env.program(env.compile(expression))
        try:
            return bool(compiled[expression].evaluate(json_to_cel({"device": device})))
        except CELEvalError:
            return False  # a missing attribute: the real allocator counts the device as not matching

    return evaluate


def cel_view(candidate: Candidate) -> dict[str, Any]:
    """The `device` variable a selector sees."""
    attributes: dict[str, dict[str, Any]] = {}
    for key, attribute in (candidate.device.get("attributes") or {}).items():
        domain, _, name = key.rpartition("/")
        value = next(iter(attribute.values())) if isinstance(attribute, dict) and attribute else None
        attributes.setdefault(domain or candidate.driver, {})[name] = value
    capacity: dict[str, dict[str, int]] = {}
    for key, entry in (candidate.device.get("capacity") or {}).items():
        domain, _, name = key.rpartition("/")
        capacity.setdefault(domain or candidate.driver, {})[name] = quantity.parse(
            str(entry["value"])
        ).value()
    return {"driver": candidate.driver, "attributes": attributes, "capacity": capacity}


def _tolerated(taint: Mapping[str, Any], tolerations: Sequence[Mapping[str, Any]]) -> bool:
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if t.get("operator", "Equal") == "Exists":
            if not t.get("key") or t.get("key") == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


@dataclass
class _Pick:
    request: str  # "req" or "req/sub"
    parent: str
    candidate: Candidate
    consumed: dict[str, Decimal] | None  # shared devices only
    admin: bool = False


@dataclass
class ClaimAllocator:
    """Allocates claims from the given slices and classes, given the claims allocated already."""

    slices: Sequence[Mapping[str, Any]]
    classes: Mapping[str, Mapping[str, Any]]
    allocated: Sequence[Mapping[str, Any]] = ()
    selector: Selector = field(default_factory=cel_selector)
    new_share_id: Callable[[], str] = lambda: str(uuid.uuid4())

    def __post_init__(self) -> None:
        self._devices = usable_devices(self.slices)
        self._exclusive: set[DeviceId] = set()
        self._consumed: dict[DeviceId, dict[str, Decimal]] = {}
        for claim in self.allocated:
            allocation = (claim.get("status") or {}).get("allocation") or {}
            for result in (allocation.get("devices") or {}).get("results") or []:
                if result.get("adminAccess") is True:
                    continue  # not considered as allocated: its device stays free for others
                device = (result["driver"], result["pool"], result["device"])
                if result.get("shareID") is None:
                    self._exclusive.add(device)
                    continue
                used = self._consumed.setdefault(device, {})
                for name, amount in (result.get("consumedCapacity") or {}).items():
                    used[name] = used.get(name, Decimal(0)) + _amount(amount, f"consumed {name}")

    def allocate(self, claim: Mapping[str, Any], node: str) -> dict[str, Any]:
        """The claim's `status.allocation` on `node`, or Unschedulable naming why not."""
        devices = (claim.get("spec") or {}).get("devices") or {}
        requests = devices.get("requests") or []
        constraints = devices.get("constraints") or []
        on_node = [c for c in self._devices if c.node in (None, node)]
        picks = self._search(list(requests), [], on_node, constraints)
        results = []
        for pick in picks:
            result: dict[str, Any] = {
                "request": pick.request,
                "driver": pick.candidate.driver,
                "pool": pick.candidate.pool,
                "device": pick.candidate.device["name"],
            }
            if pick.admin:
                result["adminAccess"] = True
            if pick.consumed is not None:
                result["shareID"] = self.new_share_id()
                capacity = pick.candidate.device.get("capacity") or {}
                result["consumedCapacity"] = {
                    n: _text(a, capacity[n]["value"]) for n, a in sorted(pick.consumed.items())
                }
            results.append(result)
        selector = {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        }
        return {"devices": {"results": results}, "nodeSelector": selector}

    # -- search ------------------------------------------------------------------------------------

    def _search(
        self,
        requests: list[Mapping[str, Any]],
        picked: list[_Pick],
        devices: list[Candidate],
        constraints: Sequence[Mapping[str, Any]],
    ) -> list[_Pick]:
        if not requests:
            return picked
        request, rest = requests[0], requests[1:]
        name = str(request.get("name"))
        alternatives: list[tuple[str, Mapping[str, Any]]]
        if request.get("exactly") is not None:
            alternatives = [(name, request["exactly"])]
        else:
            alternatives = [(f"{name}/{s.get('name')}", s) for s in request.get("firstAvailable") or []]
        reasons: list[str] = []
        for label, exact in alternatives:
            try:
                for chosen in self._choose(label, name, exact, picked, devices, constraints):
                    try:
                        return self._search(rest, chosen, devices, constraints)
                    except Unschedulable as exc:
                        reasons.append(str(exc))
            except Unschedulable as exc:
                reasons.append(str(exc))
        raise Unschedulable(reasons[-1] if reasons else f"request {name}: nothing to allocate")

    def _choose(  # noqa: PLR0917
        self,
        label: str,
        parent: str,
        exact: Mapping[str, Any],
        picked: list[_Pick],
        devices: list[Candidate],
        constraints: Sequence[Mapping[str, Any]],
    ) -> Iterable[list[_Pick]]:
        class_name = str(exact.get("deviceClassName"))
        device_class = self.classes.get(class_name)
        if device_class is None:
            raise Unschedulable(f"request {label}: device class {class_name} does not exist")
        expressions = [
            s["cel"]["expression"]
            for s in [
                *((device_class.get("spec") or {}).get("selectors") or []),
                *(exact.get("selectors") or []),
            ]
        ]
        wanted = {
            n: _amount(a, f"request {label}: capacity request {n}")
            for n, a in ((exact.get("capacity") or {}).get("requests") or {}).items()
        }
        tolerations = exact.get("tolerations") or []
        # A firstAvailable sub-request has no adminAccess (the accessor answers false).
        admin = label == parent and exact.get("adminAccess") is True
        matching: list[tuple[Candidate, dict[str, Decimal] | None]] = []
        why = "no device matches its class and selectors"
        for candidate in devices:
            if not all(self.selector(e, cel_view(candidate)) for e in expressions):
                continue
            taints = [
                t
                for t in candidate.device.get("taints") or []
                if t.get("effect") in ("NoSchedule", "NoExecute")
            ]
            if any(not _tolerated(t, tolerations) for t in taints):
                why = "every matching device is tainted"
                continue
            use = self._fits(candidate, wanted, admin=admin)
            if use is False:
                why = "no matching device has the capacity asked: " + ", ".join(
                    f"{n}={a}" for n, a in wanted.items()
                )
                continue
            matching.append((candidate, use if isinstance(use, dict) else None))
        mode = exact.get("allocationMode", "ExactCount")
        count = len(matching) if mode == "All" else int(exact.get("count") or 1)
        if mode == "All" and not matching:
            raise Unschedulable(f"request {label}: {why}")
        found = False
        for chosen in self._combinations(label, parent, matching, count, picked, constraints, admin):
            found = True
            yield chosen
        if not found:
            raise Unschedulable(
                f"request {label}: {why}" if len(matching) < count else f"request {label}: devices in use"
            )

    def _fits(
        self, candidate: Candidate, wanted: Mapping[str, Decimal], *, admin: bool = False
    ) -> dict[str, Decimal] | bool:
        capacity = candidate.device.get("capacity") or {}
        if any(n not in capacity for n in wanted):
            return False
        if not candidate.shared:
            ok = all(a <= _amount(capacity[n]["value"], n) for n, a in wanted.items())
            # Taken whole, or holding shares from when the device was published as shared; admin
            # access skips that check (`deviceInUse` is not asked for it).
            in_use = candidate.id in self._exclusive or candidate.id in self._consumed
            return ok and (admin or not in_use)
        use: dict[str, Decimal] = {}
        for n, entry in capacity.items():
            amount = consumed(wanted.get(n), entry, n)
            if amount is None or amount > _amount(entry.get("value"), n):
                return False  # never fits, whatever else is allocated
            use[n] = amount
        return use

    def _free(self, candidate: Candidate, use: Mapping[str, Decimal], picked: Sequence[_Pick]) -> bool:
        capacity = candidate.device.get("capacity") or {}
        total = dict(self._consumed.get(candidate.id, {}))
        for p in picked:
            if p.candidate.id == candidate.id and p.consumed is not None:
                for n, a in p.consumed.items():
                    total[n] = total.get(n, Decimal(0)) + a
        return all(total.get(n, Decimal(0)) + a <= _amount(capacity[n]["value"], n) for n, a in use.items())

    def _combinations(  # noqa: PLR0917
        self,
        label: str,
        parent: str,
        matching: list[tuple[Candidate, dict[str, Decimal] | None]],
        count: int,
        picked: list[_Pick],
        constraints: Sequence[Mapping[str, Any]],
        admin: bool = False,
    ) -> Iterable[list[_Pick]]:
        if count == 0:
            yield picked
            return
        taken = {p.candidate.id for p in picked if p.consumed is None}
        for i, (candidate, use) in enumerate(matching):
            if use is None and candidate.id in taken:
                continue
            if use is not None and not self._free(candidate, use, picked):
                continue
            pick = _Pick(label, parent, candidate, use, admin)
            if not _constraints_hold([*picked, pick], constraints):
                continue
            yield from self._combinations(
                label, parent, matching[i + 1 :], count - 1, [*picked, pick], constraints, admin
            )


def _attribute(candidate: Candidate, name: str) -> Any:
    attributes = candidate.device.get("attributes") or {}
    domain, _, short = name.rpartition("/")
    entry = attributes.get(name) or (attributes.get(short) if domain == candidate.driver else None)
    return next(iter(entry.values())) if isinstance(entry, dict) and entry else None


def _constraints_hold(picks: Sequence[_Pick], constraints: Sequence[Mapping[str, Any]]) -> bool:
    for constraint in constraints:
        names = constraint.get("requests") or []
        members = [p for p in picks if not names or p.parent in names or p.request in names]
        if constraint.get("matchAttribute"):
            values = [_attribute(p.candidate, constraint["matchAttribute"]) for p in members]
            if None in values or len(set(map(str, values))) > 1:
                return False
        elif constraint.get("distinctAttribute"):
            values = [_attribute(p.candidate, constraint["distinctAttribute"]) for p in members]
            if None in values or len(set(map(str, values))) != len(values):
                return False
    return True
