"""What the real server does to resource.k8s.io/v1 objects before storing them: the fields it drops
while a feature gate is off, the defaults it sets, canonical quantities, and the validation a driver
or a claim author could trip over.

Written from Kubernetes' `pkg/registry/resource/{resourceslice,resourceclaim,deviceclass}/strategy.go`
(`dropDisabledFields`: a gated field is dropped unless the stored object already uses it),
`pkg/apis/resource/v1/defaults.go` and `pkg/apis/resource/validation/validation.go`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kube_vgpu.standins.apiserver import errors, quantity
from kube_vgpu.standins.apiserver.resources import ResourceType

GROUP = "resource.k8s.io"

# validation.go / k8s.io/api/resource/v1/types.go limits.
MAX_DEVICES = 128  # ResourceSliceMaxDevices
MAX_DEVICES_ADVANCED = 64  # ResourceSliceMaxDevicesWithAdvancedFeatures (taints or counters)
MAX_ATTRIBUTES_AND_CAPACITIES = 32  # ResourceSliceMaxAttributesAndCapacitiesPerDevice
MAX_ATTRIBUTE_VALUE_LENGTH = 64  # DeviceAttributeMaxValueLength
MAX_ID_LENGTH = 32  # DeviceMaxIDLength
MAX_DOMAIN_LENGTH = 63  # DeviceMaxDomainLength
MAX_POOL_NAME_LENGTH = 253  # PoolNameMaxLength
MAX_REQUESTS = 32  # DeviceRequestsMaxSize
MAX_FIRST_AVAILABLE = 8  # FirstAvailableDeviceRequestMaxSize
MAX_SELECTORS = 32  # DeviceSelectorsMaxSize
MAX_CEL_LENGTH = 10 * 1024  # CELSelectorExpressionMaxLength
MAX_RESERVED_FOR = 256  # ResourceClaimReservedForMaxSize
MAX_TAINTS = 16  # DeviceTaintsMaxLength
TAINT_EFFECTS = ("NoSchedule", "NoExecute")
# k8s.io/api/resource/v1 DRAAdminNamespaceLabelKey: only a namespace carrying it with "true" may
# hold claims, templates or allocations with adminAccess (DRAAdminAccess: beta and on in 1.34 and
# 1.35, GA in 1.36).
ADMIN_NAMESPACE_LABEL = "resource.kubernetes.io/admin-access"

# The labels of a namespace, or None when it does not exist.
NamespaceLabels = Callable[[str], Mapping[str, str] | None]

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(-(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(\.(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*)?"
    r"(\+[0-9a-zA-Z-]+(\.[0-9a-zA-Z-]+)*)?$"
)


@dataclass
class FeatureGates:
    """The DRA feature gates of the server being imitated (`pkg/features/kube_features.go`).

    The defaults are those of Kubernetes 1.34 and 1.35: consumable capacity, device taints,
    partitionable devices and extended resources by DeviceClass are alpha and off; 1.36 turns all
    four on (beta)."""

    consumable_capacity: bool = False  # DRAConsumableCapacity
    device_taints: bool = False  # DRADeviceTaints
    partitionable_devices: bool = False  # DRAPartitionableDevices
    extended_resource: bool = False  # DRAExtendedResource
    admin_access: bool = True  # DRAAdminAccess: beta and on in 1.34 and 1.35, GA in 1.36

    @classmethod
    def of_release(cls, minor: int) -> FeatureGates:
        """The default gates of Kubernetes 1.`minor` (1.34 or later)."""
        on = minor >= 36
        return cls(consumable_capacity=on, device_taints=on, partitionable_devices=on, extended_resource=on)


def is_dra(rt: ResourceType) -> bool:
    """Whether `rt` is one of the resource.k8s.io types handled here."""
    return rt.group == GROUP


def prepare(
    rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None, gates: FeatureGates, *, scope: str
) -> None:
    """The strategy's PrepareForCreate/PrepareForUpdate: reset status, drop disabled fields, default,
    canonicalise quantities (400 for text that is no quantity, as decoding fails there)."""
    if rt.plural == "resourceslices":
        _drop_slice_fields(obj, old, gates)
        _default_taints(obj)
    elif rt.plural == "deviceclasses":
        spec = _dict(obj.get("spec"))
        old_spec = _dict((old or {}).get("spec"))
        if not gates.extended_resource and old_spec.get("extendedResourceName") is None:
            spec.pop("extendedResourceName", None)
    elif rt.plural == "resourceclaims":
        if old is None and scope != "all":
            obj.pop("status", None)  # status must not be set by the user on create
        _default_claim_spec(_dict(obj.get("spec")))
    elif rt.plural == "resourceclaimtemplates":
        _default_claim_spec(_dict(_dict(obj.get("spec")).get("spec")))
    _canonicalise(rt, obj)  # decoding comes first: a bad quantity is a 400 even where it is dropped
    if rt.plural == "resourceclaims":
        _drop_claim_spec_fields(_dict(obj.get("spec")), _dict((old or {}).get("spec")), gates)
    elif rt.plural == "resourceclaimtemplates":
        _drop_claim_spec_fields(
            _dict(_dict(obj.get("spec")).get("spec")),
            _dict(_dict((old or {}).get("spec")).get("spec")),
            gates,
        )


def validate(
    rt: ResourceType,
    obj: dict[str, Any],
    old: dict[str, Any] | None,
    namespace_labels: NamespaceLabels | None = None,
    gates: FeatureGates | None = None,
) -> None:
    """The part of validation.go a driver or a claim author could trip over, after the admin-access
    check of the strategies when `namespace_labels` is given; 422 naming every field. `gates`
    (default: those of 1.34 and 1.35) pick the wording where validation.go reads a gate."""
    gates = gates if gates is not None else FeatureGates()
    causes: list[str] = []
    if namespace_labels is not None:
        causes += admin_access_causes(rt, obj, old, namespace_labels)
    if rt.plural == "resourceslices":
        _validate_slice(_dict(obj.get("spec")), _dict((old or {}).get("spec")) if old else None, causes)
    elif rt.plural == "deviceclasses":
        _validate_class(_dict(obj.get("spec")), causes)
    elif rt.plural == "resourceclaims":
        if old is not None and obj.get("spec") != old.get("spec"):
            causes.append("spec: Invalid value: field is immutable")
        elif old is None:
            _validate_claim_spec(_dict(obj.get("spec")), "spec", causes, gates)
        _validate_claim_status(_dict(obj.get("status")), _dict((old or {}).get("status")), causes)
    elif rt.plural == "resourceclaimtemplates":
        if old is not None and obj.get("spec") != old.get("spec"):
            causes.append("spec: Invalid value: field is immutable")
        elif old is None:
            _validate_claim_spec(_dict(_dict(obj.get("spec")).get("spec")), "spec.spec", causes, gates)
    if causes:
        raise errors.invalid(rt.kind, str(obj["metadata"].get("name") or ""), causes, GROUP)


# -- admin access -----------------------------------------------------------------------------------


def admin_access_causes(
    rt: ResourceType, obj: Mapping[str, Any], old: Mapping[str, Any] | None, namespace_labels: NamespaceLabels
) -> list[str]:
    """What the strategies of ResourceClaim and ResourceClaimTemplate refuse before validation
    (pkg/registry/resource/utils.go: AuthorizedForAdmin on create, AuthorizedForAdminStatus on a
    claim's status): the first request, or allocation result, with `adminAccess: true`, unless the
    namespace is labelled `resource.kubernetes.io/admin-access: "true"`. The template's path is the
    claim's (`spec.devices...`), as the real check builds it from the requests alone."""
    path = None
    if rt.plural in ("resourceclaims", "resourceclaimtemplates") and old is None:
        spec = _dict(obj.get("spec"))
        if rt.plural == "resourceclaimtemplates":
            spec = _dict(spec.get("spec"))
        for i, request in enumerate(_list(_dict(spec.get("devices")).get("requests"))):
            # Only `exactly` has the field: a firstAvailable sub-request cannot ask admin access.
            if _dict(_dict(request).get("exactly")).get("adminAccess") is True:
                path = f"spec.devices.requests[{i}].adminAccess"
                break
    if rt.plural == "resourceclaims" and path is None:
        old_results = _list(
            _dict(_dict(_dict(_dict(old).get("status")).get("allocation")).get("devices")).get("results")
        )
        if not any(_dict(r).get("adminAccess") is True for r in old_results):
            results = _list(
                _dict(_dict(_dict(obj.get("status")).get("allocation")).get("devices")).get("results")
            )
            for i, result in enumerate(results):
                if _dict(result).get("adminAccess") is True:
                    path = f"status.allocation.devices.results[{i}].adminAccess"
                    break
    if path is None:
        return []
    namespace = str(_dict(obj.get("metadata")).get("namespace") or "")
    labels = namespace_labels(namespace)
    if labels is None:
        return [
            f"{path}: Internal error: could not retrieve namespace to verify admin access: "
            f'namespaces "{namespace}" not found'
        ]
    if labels.get(ADMIN_NAMESPACE_LABEL) != "true":
        return [
            f"{path}: Forbidden: admin access to devices requires the "
            f"`{ADMIN_NAMESPACE_LABEL}: true` label on the containing namespace"
        ]
    return []


# -- unknown fields ----------------------------------------------------------------------------------

# The fields of the request objects of resource.k8s.io/v1 (k8s.io/api/resource/v1/types.go), held
# equal to Kubernetes 1.36's OpenAPI schema by a test. A field not named here is unknown: the real
# server's decoder drops it with a warning (fieldValidation=Warn, the default) or refuses the request
# (fieldValidation=Strict).
REQUEST_FIELDS: dict[str, frozenset[str]] = {
    "DeviceClaim": frozenset({"requests", "constraints", "config"}),
    "DeviceRequest": frozenset({"name", "exactly", "firstAvailable"}),
    "ExactDeviceRequest": frozenset(
        {"deviceClassName", "selectors", "allocationMode", "count", "adminAccess", "tolerations", "capacity"}
    ),
    "DeviceSubRequest": frozenset(
        {"name", "deviceClassName", "selectors", "allocationMode", "count", "tolerations", "capacity"}
    ),
    "CapacityRequirements": frozenset({"requests"}),
    "DeviceToleration": frozenset({"key", "operator", "value", "effect", "tolerationSeconds"}),
}


def drop_unknown_fields(rt: ResourceType, obj: Any) -> list[str]:
    """Remove the unknown fields of a claim's or template's device requests from a request body;
    returns their paths (`spec.devices.requests[0].exactly.capcity`), in order."""
    if rt.plural not in ("resourceclaims", "resourceclaimtemplates") or not isinstance(obj, dict):
        return []
    spec = _dict(obj.get("spec"))
    prefix = "spec"
    if rt.plural == "resourceclaimtemplates":
        spec, prefix = _dict(spec.get("spec")), "spec.spec"
    found: list[str] = []

    def check(holder: Any, kind: str, path: str) -> None:
        if not isinstance(holder, dict):
            return
        for key in sorted(set(holder) - REQUEST_FIELDS[kind]):
            found.append(f"{path}.{key}")
            del holder[key]
        if "capacity" in holder:
            check(holder["capacity"], "CapacityRequirements", f"{path}.capacity")
        for j, toleration in enumerate(_list(holder.get("tolerations"))):
            check(toleration, "DeviceToleration", f"{path}.tolerations[{j}]")

    devices = spec.get("devices")
    check(devices, "DeviceClaim", f"{prefix}.devices")
    for i, request in enumerate(_list(_dict(devices).get("requests"))):
        where = f"{prefix}.devices.requests[{i}]"
        check(request, "DeviceRequest", where)
        check(_dict(request).get("exactly"), "ExactDeviceRequest", f"{where}.exactly")
        for j, sub in enumerate(_list(_dict(request).get("firstAvailable"))):
            check(sub, "DeviceSubRequest", f"{where}.firstAvailable[{j}]")
    return found


# -- dropDisabledFields ------------------------------------------------------------------------------


def _drop_slice_fields(obj: dict[str, Any], old: dict[str, Any] | None, gates: FeatureGates) -> None:
    spec = _dict(obj.get("spec"))
    devices = [d for d in _list(spec.get("devices")) if isinstance(d, dict)]
    old_devices = [d for d in _list(_dict((old or {}).get("spec")).get("devices")) if isinstance(d, dict)]
    if not gates.device_taints and not any(d.get("taints") for d in old_devices):
        for device in devices:
            device.pop("taints", None)
    if not gates.consumable_capacity and not _uses_consumable_capacity(old_devices):
        for device in devices:
            device.pop("allowMultipleAllocations", None)
            for capacity in _dict(device.get("capacity")).values():
                if isinstance(capacity, dict):
                    capacity.pop("requestPolicy", None)
    old_spec = _dict((old or {}).get("spec"))
    partitionable_in_use = (
        bool(old_spec.get("sharedCounters")) or old_spec.get("perDeviceNodeSelection") is not None
    )
    partitionable_in_use = partitionable_in_use or any(
        d.get("consumesCounters")
        or any(d.get(k) is not None for k in ("nodeName", "nodeSelector", "allNodes"))
        for d in old_devices
    )
    if not gates.partitionable_devices and not partitionable_in_use:
        spec.pop("sharedCounters", None)
        spec.pop("perDeviceNodeSelection", None)
        for device in devices:
            for key in ("consumesCounters", "nodeName", "nodeSelector", "allNodes"):
                device.pop(key, None)


def _drop_claim_spec_fields(spec: dict[str, Any], old_spec: dict[str, Any], gates: FeatureGates) -> None:
    """pkg/registry/resource/resourceclaimspec/strategy.go (DropDisabledFields) for the gates kept
    here: while DRAConsumableCapacity is off a request's `capacity` (so a claim asking a slice is
    stored asking a whole device) and every constraint's `distinctAttribute` (so validation then
    refuses a constraint left with neither attribute), `adminAccess` while DRAAdminAccess is off;
    unless the stored spec already uses them."""

    def requests(of: dict[str, Any]) -> list[dict[str, Any]]:
        return [r for r in _list(_dict(of.get("devices")).get("requests")) if isinstance(r, dict)]

    def exact_and_subs(request: dict[str, Any]) -> list[dict[str, Any]]:
        subs = [s for s in _list(request.get("firstAvailable")) if isinstance(s, dict)]
        exact = request.get("exactly")
        return [exact, *subs] if isinstance(exact, dict) else subs

    def constraints(of: dict[str, Any]) -> list[dict[str, Any]]:
        return [c for c in _list(_dict(of.get("devices")).get("constraints")) if isinstance(c, dict)]

    old = [e for r in requests(old_spec) for e in exact_and_subs(r)]
    # DRAConsumableCapacityFeatureInUse: a capacity or a distinctAttribute in the stored spec.
    capacity_in_use = any(e.get("capacity") is not None for e in old) or any(
        c.get("distinctAttribute") is not None for c in constraints(old_spec)
    )
    if not gates.consumable_capacity and not capacity_in_use:
        for constraint in constraints(spec):
            constraint.pop("distinctAttribute", None)
        for request in requests(spec):
            for exact in exact_and_subs(request):
                exact.pop("capacity", None)
    if not gates.admin_access and not any(
        _dict(r.get("exactly")).get("adminAccess") is not None for r in requests(old_spec)
    ):
        for request in requests(spec):
            _dict(request.get("exactly")).pop("adminAccess", None)


def _uses_consumable_capacity(devices: list[dict[str, Any]]) -> bool:
    for device in devices:
        if device.get("allowMultipleAllocations") is not None:
            return True
        if any(
            isinstance(c, dict) and c.get("requestPolicy") is not None
            for c in _dict(device.get("capacity")).values()
        ):
            return True
    return False


# -- defaults.go -------------------------------------------------------------------------------------


def _default_taints(obj: dict[str, Any]) -> None:
    """SetDefaults_DeviceTaint: a taint without timeAdded gets the time it was stored; a given one is
    read as a metav1.Time and written back as RFC 3339 in UTC with seconds (`...Z`)."""
    for i, device in enumerate(_list(_dict(obj.get("spec")).get("devices"))):
        for j, taint in enumerate(_list(_dict(device).get("taints"))):
            if not isinstance(taint, dict):
                continue
            given = taint.get("timeAdded")
            try:
                moment = (
                    datetime.fromisoformat(str(given).replace("Z", "+00:00")) if given else datetime.now(UTC)
                )
            except ValueError:
                raise errors.bad_request(
                    f'spec.devices[{i}].taints[{j}].timeAdded: parsing time "{given}" as RFC 3339 failed'
                ) from None
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=UTC)
            taint["timeAdded"] = moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _default_claim_spec(spec: dict[str, Any]) -> None:
    for request in _list(_dict(spec.get("devices")).get("requests")):
        if not isinstance(request, dict):
            continue
        if isinstance(request.get("exactly"), dict):
            _default_exact(request["exactly"])
        for sub in _list(request.get("firstAvailable")):
            if isinstance(sub, dict):
                _default_exact(sub)


def _default_exact(request: dict[str, Any]) -> None:
    request.setdefault("allocationMode", "ExactCount")
    if request["allocationMode"] == "ExactCount" and not request.get("count"):
        request["count"] = 1
    for toleration in _list(request.get("tolerations")):
        if isinstance(toleration, dict):
            toleration.setdefault("operator", "Equal")


# -- quantities --------------------------------------------------------------------------------------


def _canonicalise(rt: ResourceType, obj: dict[str, Any]) -> None:
    """Rewrite every quantity in canonical form, as decoding and encoding do on the real server."""
    places: list[tuple[Any, Any, str]] = []  # (dict or list holding it, key or index, field path)

    def values_of(holder: Any, path: str) -> None:  # {name: {value: q}}
        for name, entry in _dict(holder).items():
            if isinstance(entry, dict) and "value" in entry:
                places.append((entry, "value", f"{path}[{name}].value"))

    def amounts_of(holder: Any, path: str) -> None:  # {name: q}
        amounts = _dict(holder)
        for name in amounts:
            places.append((amounts, name, f"{path}[{name}]"))

    spec = _dict(obj.get("spec"))
    if rt.plural == "resourceslices":
        for i, device in enumerate(_list(spec.get("devices"))):
            device = _dict(device)  # noqa: PLW2901
            values_of(device.get("capacity"), f"spec.devices[{i}].capacity")
            for name, capacity in _dict(device.get("capacity")).items():
                policy = _dict(_dict(capacity).get("requestPolicy"))
                path = f"spec.devices[{i}].capacity[{name}].requestPolicy"
                if "default" in policy:
                    places.append((policy, "default", f"{path}.default"))
                valid_range = _dict(policy.get("validRange"))
                for key in ("min", "max", "step"):
                    if key in valid_range:
                        places.append((valid_range, key, f"{path}.validRange.{key}"))
                values = _list(policy.get("validValues"))
                for j in range(len(values)):
                    places.append((values, j, f"{path}.validValues[{j}]"))
            for j, consumption in enumerate(_list(device.get("consumesCounters"))):
                values_of(
                    _dict(consumption).get("counters"), f"spec.devices[{i}].consumesCounters[{j}].counters"
                )
        for i, counter_set in enumerate(_list(spec.get("sharedCounters"))):
            values_of(_dict(counter_set).get("counters"), f"spec.sharedCounters[{i}].counters")
    elif rt.plural in ("resourceclaims", "resourceclaimtemplates"):
        claim_spec = spec if rt.plural == "resourceclaims" else _dict(spec.get("spec"))
        prefix = "spec" if rt.plural == "resourceclaims" else "spec.spec"
        for i, request in enumerate(_list(_dict(claim_spec.get("devices")).get("requests"))):
            request = _dict(request)  # noqa: PLW2901
            exact = _dict(request.get("exactly"))
            amounts_of(
                _dict(exact.get("capacity")).get("requests"),
                f"{prefix}.devices.requests[{i}].exactly.capacity.requests",
            )
            for j, sub in enumerate(_list(request.get("firstAvailable"))):
                path = f"{prefix}.devices.requests[{i}].firstAvailable[{j}].capacity.requests"
                amounts_of(_dict(_dict(sub).get("capacity")).get("requests"), path)
        allocation = _dict(_dict(obj.get("status")).get("allocation"))
        for i, result in enumerate(_list(_dict(allocation.get("devices")).get("results"))):
            amounts_of(
                _dict(result).get("consumedCapacity"),
                f"status.allocation.devices.results[{i}].consumedCapacity",
            )
    for holder, key, path in places:
        try:
            holder[key] = quantity.from_json(holder[key])
        except quantity.BadQuantity as exc:
            raise errors.bad_request(f"{path}: {exc}") from None


# -- validation --------------------------------------------------------------------------------------


def _validate_slice(spec: dict[str, Any], old_spec: dict[str, Any] | None, causes: list[str]) -> None:
    _driver_name(spec.get("driver"), "spec.driver", causes)
    pool = _dict(spec.get("pool"))
    name = pool.get("name")
    if not isinstance(name, str) or not name:
        causes.append("spec.pool.name: Required value")
    elif len(name) > MAX_POOL_NAME_LENGTH:
        causes.append(f"spec.pool.name: Too long: may not be more than {MAX_POOL_NAME_LENGTH} bytes")
    elif not all(_DNS_SUBDOMAIN.match(part) for part in name.split("/")):
        causes.append(f'spec.pool.name: Invalid value: "{name}": a lowercase RFC 1123 subdomain is required')
    if not _positive_int(pool.get("resourceSliceCount")):
        causes.append(
            f"spec.pool.resourceSliceCount: Invalid value: {pool.get('resourceSliceCount')}:"
            " must be greater than zero"
        )
    generation = pool.get("generation", 0)
    if not isinstance(generation, int) or isinstance(generation, bool) or generation < 0:
        causes.append(
            f"spec.pool.generation: Invalid value: {generation}: must be greater than or equal to zero"
        )
    if old_spec is not None:
        for path, new, old in (
            ("spec.pool.name", name, _dict(old_spec.get("pool")).get("name")),
            ("spec.driver", spec.get("driver"), old_spec.get("driver")),
            ("spec.nodeName", spec.get("nodeName"), old_spec.get("nodeName")),
        ):
            if new != old:
                causes.append(f"{path}: Invalid value: field is immutable")
    chosen = [
        f"`{k}`" for k in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection") if spec.get(k)
    ]
    if len(chosen) != 1:
        detail = "is required" if not chosen else "is required, but multiple fields are set"
        causes.append(
            f"spec: exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` {detail}"
        )
    if spec.get("sharedCounters") is not None and spec.get("devices") is not None:
        causes.append("spec: Invalid value: only one of `sharedCounters` or `devices` is allowed")
    devices = _list(spec.get("devices"))
    advanced = any(_dict(d).get("taints") or _dict(d).get("consumesCounters") for d in devices)
    limit = MAX_DEVICES_ADVANCED if advanced else MAX_DEVICES
    if len(devices) > limit:
        causes.append(f"spec.devices: Too many: {len(devices)}: must have at most {limit} items")
        return
    seen: set[str] = set()
    for i, device in enumerate(devices):
        _validate_device(_dict(device), f"spec.devices[{i}]", causes)
        device_name = str(_dict(device).get("name"))
        if device_name in seen:
            causes.append(f'spec.devices[{i}]: Duplicate value: "{device_name}"')
        seen.add(device_name)


def _validate_device(device: dict[str, Any], path: str, causes: list[str]) -> None:
    _label(device.get("name"), f"{path}.name", causes)
    attributes, capacities = _dict(device.get("attributes")), _dict(device.get("capacity"))
    if len(attributes) + len(capacities) > MAX_ATTRIBUTES_AND_CAPACITIES:
        causes.append(
            f"{path}: Invalid value: {len(attributes) + len(capacities)}: the total number of attributes "
            f"and capacities must not exceed {MAX_ATTRIBUTES_AND_CAPACITIES}"
        )
    for key, attribute in attributes.items():
        _qualified_name(key, f"{path}.attributes[{key}]", causes)
        _validate_attribute(_dict(attribute), f"{path}.attributes[{key}]", causes)
    multiple = device.get("allowMultipleAllocations") is True
    for key, capacity in capacities.items():
        _qualified_name(key, f"{path}.capacity[{key}]", causes)
        capacity = _dict(capacity)  # noqa: PLW2901
        policy = capacity.get("requestPolicy")
        if policy is None:
            continue
        if not multiple:
            causes.append(
                f"{path}.capacity[{key}].requestPolicy: Forbidden: allowMultipleAllocations must be true"
            )
            continue
        _validate_policy(
            str(capacity.get("value", "0")), _dict(policy), f"{path}.capacity[{key}].requestPolicy", causes
        )
    taints = _list(device.get("taints"))
    if len(taints) > MAX_TAINTS:
        causes.append(f"{path}.taints: Too many: {len(taints)}: must have at most {MAX_TAINTS} items")
    for j, taint in enumerate(taints):
        taint = _dict(taint)  # noqa: PLW2901
        _qualified_name(taint.get("key"), f"{path}.taints[{j}].key", causes, label_key=True)
        if taint.get("effect") not in TAINT_EFFECTS:
            causes.append(
                f'{path}.taints[{j}].effect: Unsupported value: "{taint.get("effect")}": supported values: '
                + ", ".join(f'"{e}"' for e in TAINT_EFFECTS)
            )


def _validate_attribute(attribute: dict[str, Any], path: str, causes: list[str]) -> None:
    kinds = [k for k in ("bool", "int", "string", "version") if k in attribute]
    if len(kinds) != 1:
        causes.append(f"{path}: Invalid value: exactly one value must be specified")
        return
    value = attribute[kinds[0]]
    if kinds[0] in ("string", "version"):
        if not isinstance(value, str):
            causes.append(f"{path}.{kinds[0]}: Invalid value: must be a string")
            return
        if len(value) > MAX_ATTRIBUTE_VALUE_LENGTH:
            causes.append(
                f"{path}.{kinds[0]}: Too long: may not be more than {MAX_ATTRIBUTE_VALUE_LENGTH} bytes"
            )
        if kinds[0] == "version" and not _SEMVER.match(value):
            causes.append(
                f'{path}.version: Invalid value: "{value}":'
                " must be a string compatible with semver.org spec 2.0.0"
            )
    elif kinds[0] == "int" and (not isinstance(value, int) or isinstance(value, bool)):
        causes.append(f"{path}.int: Invalid value: must be an integer")
    elif kinds[0] == "bool" and not isinstance(value, bool):
        causes.append(f"{path}.bool: Invalid value: must be a boolean")


def _validate_policy(capacity: str, policy: dict[str, Any], path: str, causes: list[str]) -> None:
    maximum = quantity.parse(capacity).amount
    if policy.get("validValues") and policy.get("validRange") is not None:
        causes.append(
            f"{path}: Forbidden: exactly one policy can be specified,"
            ' cannot specify "validValues" and "validRange" at the same time'
        )
        return
    default = policy.get("default")
    if policy.get("validValues"):
        values = [quantity.parse(str(v)).amount for v in policy["validValues"]]
        if default is None:
            causes.append(f"{path}.default: Required value: required when validValues is defined")
        elif quantity.parse(str(default)).amount not in values:
            causes.append(
                f'{path}.validValues: Invalid value: "{default}":'
                " default value is not valid according to the requestPolicy"
            )
        if values != sorted(values):
            causes.append(f"{path}.validValues: Invalid value: values must be sorted in ascending order")
        if any(v > maximum for v in values):
            causes.append(
                f"{path}.validValues: Invalid value: option is larger than capacity value: {capacity}"
            )
        return
    valid_range = policy.get("validRange")
    if valid_range is None:
        return
    valid_range = _dict(valid_range)
    if default is None:
        causes.append(f"{path}.default: Required value: required when validRange is defined")
        return
    if valid_range.get("min") is None:
        causes.append(f"{path}.validRange.min: Required value: required when validRange is defined")
        return
    low, dflt = quantity.parse(str(valid_range["min"])).amount, quantity.parse(str(default)).amount
    if low > maximum:
        causes.append(
            f'{path}.validRange.min: Invalid value: "{valid_range["min"]}":'
            f" min is larger than capacity value: {capacity}"
        )
    if dflt < low:
        causes.append(
            f'{path}.validRange.default: Invalid value: "{default}": default is less than min:'
            f" {valid_range['min']}"
        )
    high = quantity.parse(str(valid_range["max"])).amount if valid_range.get("max") is not None else None
    if high is not None:
        if low > high:
            causes.append(
                f"{path}.validRange.max: Invalid value: min is larger than max: {valid_range['max']}"
            )
        if high > maximum:
            causes.append(
                f'{path}.validRange.max: Invalid value: "{valid_range["max"]}":'
                f" max is larger than capacity value: {capacity}"
            )
        if dflt > high:
            causes.append(
                f'{path}.validRange.default: Invalid value: "{default}": default is more than max:'
                f" {valid_range['max']}"
            )
    if valid_range.get("step") is not None:
        step = quantity.parse(str(valid_range["step"])).amount
        if step <= 0:
            causes.append(
                f'{path}.validRange.step: Invalid value: "{valid_range["step"]}": must be greater than zero'
            )
        elif low + step > maximum:
            causes.append(
                f"{path}.validRange.step: Invalid value: one step is larger than capacity value: {capacity}"
            )
        else:
            for value in (dflt, high):
                if value is not None and (value - low) % step != 0:
                    causes.append(
                        f"{path}.validRange.step: Invalid value: value is not a multiple of a given step "
                        f"({valid_range['step']}) from ({valid_range['min']})"
                    )


def _validate_class(spec: dict[str, Any], causes: list[str]) -> None:
    selectors = _list(spec.get("selectors"))
    if len(selectors) > MAX_SELECTORS:
        causes.append(f"spec.selectors: Too many: {len(selectors)}: must have at most {MAX_SELECTORS} items")
        return
    for i, selector in enumerate(selectors):
        _validate_selector(selector, f"spec.selectors[{i}]", causes)


def _validate_selector(selector: Any, path: str, causes: list[str]) -> None:
    expression = _dict(_dict(selector).get("cel")).get("expression")
    if not isinstance(expression, str) or not expression:
        causes.append(f"{path}.cel.expression: Required value")
    elif len(expression) > MAX_CEL_LENGTH:
        causes.append(f"{path}.cel.expression: Too long: may not be more than {MAX_CEL_LENGTH} bytes")


def _validate_claim_spec(spec: dict[str, Any], path: str, causes: list[str], gates: FeatureGates) -> None:
    requests = _list(_dict(spec.get("devices")).get("requests"))
    if len(requests) > MAX_REQUESTS:
        causes.append(
            f"{path}.devices.requests: Too many: {len(requests)}: must have at most {MAX_REQUESTS} items"
        )
        return
    names: set[str] = set()
    for i, request in enumerate(requests):
        request, where = _dict(request), f"{path}.devices.requests[{i}]"  # noqa: PLW2901
        _label(request.get("name"), f"{where}.name", causes)
        if str(request.get("name")) in names:
            causes.append(f'{where}.name: Duplicate value: "{request.get("name")}"')
        names.add(str(request.get("name")))
        has_exact, subs = request.get("exactly") is not None, _list(request.get("firstAvailable"))
        if has_exact == bool(subs):
            detail = "is required" if not has_exact else "is required, but multiple fields are set"
            causes.append(f"{where}: Required value: exactly one of `exactly` or `firstAvailable` {detail}")
            continue
        if has_exact:
            _validate_exact(_dict(request["exactly"]), f"{where}.exactly", causes)
            continue
        if len(subs) > MAX_FIRST_AVAILABLE:
            causes.append(
                f"{where}.firstAvailable: Too many: {len(subs)}:"
                f" must have at most {MAX_FIRST_AVAILABLE} items"
            )
            continue
        for j, sub in enumerate(subs):
            _label(_dict(sub).get("name"), f"{where}.firstAvailable[{j}].name", causes)
            _validate_exact(_dict(sub), f"{where}.firstAvailable[{j}]", causes)
    # validateDeviceConstraint: matchAttribute, else distinctAttribute (which the strategy has dropped
    # while DRAConsumableCapacity is off), else Required, worded by the gate.
    for i, constraint in enumerate(_list(_dict(spec.get("devices")).get("constraints"))):
        constraint = _dict(constraint)  # noqa: PLW2901
        attribute = constraint.get("matchAttribute") or constraint.get("distinctAttribute")
        if attribute is not None:
            _qualified_name(attribute, f"{path}.devices.constraints[{i}]", causes, fully=True)
        elif gates.consumable_capacity:
            causes.append(
                f"{path}.devices.constraints[{i}]: Required value:"
                ' exactly one of "matchAttribute" or "distinctAttribute" is required'
            )
        else:
            causes.append(f"{path}.devices.constraints[{i}].matchAttribute: Required value")


def _validate_exact(request: dict[str, Any], path: str, causes: list[str]) -> None:
    class_name = request.get("deviceClassName")
    if not isinstance(class_name, str) or not class_name:
        causes.append(f"{path}.deviceClassName: Required value")
    elif len(class_name) > 253 or not _DNS_SUBDOMAIN.match(class_name):
        causes.append(
            f'{path}.deviceClassName: Invalid value: "{class_name}":'
            " a lowercase RFC 1123 subdomain is required"
        )
    selectors = _list(request.get("selectors"))
    if len(selectors) > MAX_SELECTORS:
        causes.append(
            f"{path}.selectors: Too many: {len(selectors)}: must have at most {MAX_SELECTORS} items"
        )
    else:
        for i, selector in enumerate(selectors):
            _validate_selector(selector, f"{path}.selectors[{i}]", causes)
    mode, count = request.get("allocationMode"), request.get("count")
    if mode == "All":
        if count:
            causes.append(
                f"{path}.count: Invalid value: {count}: must not be specified when allocationMode is 'All'"
            )
    elif mode == "ExactCount":
        if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
            causes.append(f"{path}.count: Invalid value: {count}: must be greater than zero")
    else:
        causes.append(
            f'{path}.allocationMode: Unsupported value: "{mode}": supported values: "All", "ExactCount"'
        )


def _validate_claim_status(status: dict[str, Any], old_status: dict[str, Any], causes: list[str]) -> None:
    reserved = _list(status.get("reservedFor"))
    if len(reserved) > MAX_RESERVED_FOR:
        causes.append(
            f"status.reservedFor: Too many: {len(reserved)}: must have at most {MAX_RESERVED_FOR} items"
        )
    if reserved and status.get("allocation") is None:
        causes.append("status.reservedFor: Forbidden: may not be specified when `allocated` is not set")
    old_allocation, allocation = old_status.get("allocation"), status.get("allocation")
    if old_allocation is not None and allocation is not None and allocation != old_allocation:
        causes.append("status.allocation: Invalid value: field is immutable")


def _driver_name(name: Any, path: str, causes: list[str]) -> None:
    # ValidateCSIDriverName: a DNS-1123 subdomain of at most 63 characters.
    if not isinstance(name, str) or not name:
        causes.append(f"{path}: Required value")
    elif len(name) > 63:
        causes.append(f"{path}: Too long: may not be more than 63 bytes")
    elif not _DNS_SUBDOMAIN.match(name.lower()):
        causes.append(
            f'{path}: Invalid value: "{name}":'
            " a DNS-1123 subdomain must consist of lower case alphanumeric characters"
        )


def _label(name: Any, path: str, causes: list[str]) -> None:
    if not isinstance(name, str) or not name:
        causes.append(f"{path}: Required value")
    elif len(name) > 63:
        causes.append(f'{path}: Invalid value: "{name}": must be no more than 63 characters')
    elif not _DNS_LABEL.match(name):
        causes.append(
            f'{path}: Invalid value: "{name}":'
            " a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-'"
        )


def _qualified_name(
    name: Any, path: str, causes: list[str], *, fully: bool = False, label_key: bool = False
) -> None:
    """validateQualifiedName: `[domain/]identifier`, the domain a driver name, the identifier a C
    identifier of at most 32 characters. A taint key is a label key instead."""
    if not isinstance(name, str) or not name:
        causes.append(f"{path}: Required value")
        return
    parts = name.split("/")
    if len(parts) > 2:
        causes.append(f'{path}: Invalid value: "{name}": must not contain more than one slash')
        return
    if fully and len(parts) == 1:
        causes.append(
            f'{path}: Invalid value: "{name}":'
            " a fully qualified name must be a domain and a name separated by a slash"
        )
    if len(parts) == 2:
        _driver_name(parts[0], path, causes)
    identifier = parts[-1]
    if label_key:
        if len(identifier) > 63 or not re.match(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$", identifier):
            causes.append(f'{path}: Invalid value: "{name}": name part must be a valid label name')
        return
    if len(identifier) > MAX_ID_LENGTH:
        causes.append(f"{path}: Too long: may not be more than {MAX_ID_LENGTH} bytes")
    elif not _C_IDENTIFIER.match(identifier):
        causes.append(
            f'{path}: Invalid value: "{identifier}":'
            " a valid C identifier must start with alphabetic character or '_'"
        )


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
