"""The checks and defaulting the real API server applies to a request body before storing it.

Only what product code can observe is reproduced: quantities in canonical form (pods and nodes), pod
defaults (scheduler name, restart policy, requests mirroring limits, a Pending phase), namespace labels
and finalizers, secret `stringData`, required pod containers, and string-only labels and annotations.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from kube_vgpu.standins.apiserver import errors, quantity
from kube_vgpu.standins.apiserver.events import validate_event
from kube_vgpu.standins.apiserver.resources import NAMESPACES, PODS, ResourceType, lookup_object
from kube_vgpu.standins.apiserver.store import Stored


def validate(rt: ResourceType, obj: dict[str, Any]) -> None:
    """The checks of the real server that product code could trip over (not its full validation)."""
    metadata = obj["metadata"]
    for field in ("labels", "annotations"):
        values = metadata.get(field)
        if values is None:
            continue
        if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
            # The real server fails to decode such a body before validating it.
            raise errors.bad_request(
                f"json: cannot unmarshal metadata.{field} of {rt.kind} {metadata.get('name')!r}: "
                f"it must be an object of strings, got {json.dumps(values)}"
            )
    if rt.kind == "Event" and not rt.group:
        validate_event(obj)
    if rt is not PODS:
        return
    causes: list[str] = []
    containers = (obj.get("spec") or {}).get("containers")
    if not isinstance(containers, list) or not containers:
        causes.append("spec.containers: Required value")
    else:
        for index, container in enumerate(containers):
            for field in ("name", "image"):
                if not isinstance(container, dict) or not container.get(field):
                    causes.append(f"spec.containers[{index}].{field}: Required value")
    if causes:
        raise errors.invalid(rt.kind, str(metadata.get("name") or ""), causes)


def canonicalise_quantities(rt: ResourceType, obj: dict[str, Any]) -> None:
    """Rewrite every resource quantity in canonical form, as the real server's decoder does on every
    write (`3000` is stored and read back as `3k`: k8s.io/apimachinery/pkg/api/resource/quantity.go); text
    that is no quantity fails the whole request, as it fails to decode there."""
    for amounts in _quantity_maps(rt, obj):
        for key, raw in list(amounts.items()):
            try:
                amounts[key] = quantity.from_json(raw)
            except quantity.BadQuantity as exc:
                why = f'{rt.kind} in version "v1" cannot be handled as a {rt.kind}: {exc}'
                raise errors.bad_request(why) from None


def _quantity_maps(rt: ResourceType, obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The objects of quantities a pod or node carries (resources, overhead, capacity)."""
    found: list[Any] = []
    if rt is PODS:
        spec = obj.get("spec") or {}
        for group in ("initContainers", "containers", "ephemeralContainers"):
            for container in spec.get(group) or []:
                resources = container.get("resources") if isinstance(container, dict) else None
                if isinstance(resources, dict):
                    found += [resources.get("limits"), resources.get("requests")]
        found.append(spec.get("overhead"))
    elif rt.plural == "nodes":
        status = obj.get("status") or {}
        found += [status.get("capacity"), status.get("allocatable")]
    return [amounts for amounts in found if isinstance(amounts, dict)]


def default(rt: ResourceType, obj: dict[str, Any], *, creating: bool) -> None:
    """The defaulting the real server applies before storing (the part product code can observe)."""
    canonicalise_quantities(rt, obj)
    metadata = obj["metadata"]
    if rt is NAMESPACES:
        metadata["labels"] = {
            **(metadata.get("labels") or {}),
            "kubernetes.io/metadata.name": metadata["name"],
        }
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
        obj.setdefault("status", {}).setdefault("phase", "Active")
    elif rt is PODS:
        _default_pod(obj, creating=creating)
    elif rt.plural == "secrets":
        obj.setdefault("type", "Opaque")
        string_data = obj.pop("stringData", None)
        if isinstance(string_data, dict):
            data = dict(obj.get("data") or {})
            data.update({k: base64.b64encode(str(v).encode()).decode() for k, v in string_data.items()})
            obj["data"] = data


def _default_pod(pod: dict[str, Any], *, creating: bool) -> None:
    spec = pod.setdefault("spec", {})
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("securityContext", {})
    for group in ("initContainers", "containers"):
        for container in spec.get(group) or []:
            if not isinstance(container, dict):
                continue
            container.setdefault("terminationMessagePath", "/dev/termination-log")
            container.setdefault("terminationMessagePolicy", "File")
            image = str(container.get("image") or "")
            tag = image.rsplit("/", 1)[-1]
            untagged_or_latest = "@" not in tag and (":" not in tag or tag.endswith(":latest"))
            container.setdefault("imagePullPolicy", "Always" if untagged_or_latest else "IfNotPresent")
            resources = container.setdefault("resources", {})
            limits = resources.get("limits")
            if isinstance(limits, dict) and limits:
                # Requests default to the limits, resource by resource.
                resources["requests"] = {**limits, **(resources.get("requests") or {})}
    if creating:
        # A created pod starts Pending whatever status it was sent with.
        pod["status"] = {"phase": "Pending"}
    else:
        pod.setdefault("status", {}).setdefault("phase", "Pending")


def bare_object(rt: ResourceType, body: Any) -> dict[str, Any]:
    """The request body as a bare object: checked to be this resource's type, kind/apiVersion removed."""
    if not isinstance(body, dict):
        raise errors.bad_request(f"the body of a {rt.kind} request must be a JSON object")
    obj = dict(body)
    api_version, kind = obj.pop("apiVersion", None), obj.pop("kind", None)
    if api_version not in (None, "", rt.api_version):
        raise errors.bad_request(
            f"the API version in the data ({api_version}) does not match "
            f"the expected API version ({rt.api_version})"
        )
    if kind not in (None, "", rt.kind):
        raise errors.bad_request(
            f"the kind in the data ({kind}) does not match the expected kind ({rt.kind})"
        )
    metadata = obj.get("metadata")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise errors.bad_request("metadata must be a JSON object")
    obj["metadata"] = dict(metadata)
    return obj


def check_namespace(rt: ResourceType, metadata: dict[str, Any], namespace: str) -> None:
    """Set the body's namespace from the URL; 400 when the body names another one."""
    if not rt.namespaced:
        metadata.pop("namespace", None)
        return
    if metadata.get("namespace") not in (None, "", namespace):
        raise errors.bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
        )
    metadata["namespace"] = namespace


def check_preconditions(rt: ResourceType, current: Stored, preconditions: Any) -> None:
    """DeleteOptions preconditions (uid, resourceVersion); 409 when the object no longer matches."""
    if not isinstance(preconditions, dict):
        return
    metadata = current.obj["metadata"]
    uid, rv = preconditions.get("uid"), preconditions.get("resourceVersion")
    if uid and uid != metadata.get("uid"):
        why = f"Precondition failed: UID in precondition: {uid}, UID in object meta: {metadata.get('uid')}"
        raise errors.conflict(rt.plural, current.key[1], rt.group, why=why)
    if rv and str(rv) != str(current.rv):
        why = (
            f"Precondition failed: ResourceVersion in precondition: {rv}, "
            f"ResourceVersion in object meta: {current.rv}"
        )
        raise errors.conflict(rt.plural, current.key[1], rt.group, why=why)


def decoded(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A create body as mutating admission sees it: decoded,
    quantities in canonical form, defaulted, nothing stored and no system metadata yet (a
    `generateName` pod has no name). Raises the 400 the real server answers for a bad quantity."""
    rt = lookup_object(obj)
    bare = bare_object(rt, json.loads(json.dumps(obj)))
    default(rt, bare, creating=True)
    return {"apiVersion": rt.api_version, "kind": rt.kind, **bare}
