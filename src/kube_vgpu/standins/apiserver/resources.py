"""The resource types the stand-in API server serves: names, scope, subresources, selectable fields.

One table drives routing, discovery, list kinds and field selectors; adding a resource is one entry.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

# Fields every resource can be selected on; the real server adds metadata.namespace only when namespaced.
_META_FIELDS = ("metadata.name",)


@dataclass(frozen=True)
class ResourceType:
    """One REST resource, as discovery describes it."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    # Fields beyond metadata.* that `fieldSelector` accepts (the real server refuses others).
    selectable_fields: tuple[str, ...] = ()
    # Objects of this type carry metadata.generation, bumped when anything outside metadata/status changes.
    has_generation: bool = False
    # PUT of a missing object creates it (true for leases, false for most built-in types).
    create_on_update: bool = False
    # DELETE answers the deleted object (pods) instead of a Status (most other types).
    return_deleted_object: bool = False
    # Only create is served (bindings).
    create_only: bool = False
    verbs: tuple[str, ...] = field(default=("create", "delete", "get", "list", "patch", "update", "watch"))

    @property
    def api_version(self) -> str:
        """`apiVersion` of objects of this type (`v1` or `<group>/<version>`)."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        """Kind of a list of these objects."""
        return f"{self.kind}List"

    @property
    def key(self) -> str:
        """Unique name of this resource across groups (`pods`, `leases.coordination.k8s.io`)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def has_status(self) -> bool:
        """Whether `status` is written only through the `/status` subresource."""
        return "status" in self.subresources

    def field_selectable(self, name: str) -> bool:
        """Whether `fieldSelector` may name this field for this resource."""
        if name in _META_FIELDS or name in self.selectable_fields:
            return True
        return self.namespaced and name == "metadata.namespace"


_POD_FIELDS = (
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
)
_EVENT_FIELDS = (
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
)

RESOURCES: tuple[ResourceType, ...] = (
    ResourceType(
        "",
        "v1",
        "namespaces",
        "Namespace",
        namespaced=False,
        short_names=("ns",),
        subresources=("status",),
        selectable_fields=("status.phase",),
    ),
    ResourceType(
        "",
        "v1",
        "nodes",
        "Node",
        namespaced=False,
        short_names=("no",),
        subresources=("status",),
        selectable_fields=("spec.unschedulable",),
    ),
    ResourceType(
        "",
        "v1",
        "pods",
        "Pod",
        namespaced=True,
        short_names=("po",),
        subresources=("status", "binding"),
        selectable_fields=_POD_FIELDS,
        has_generation=True,
        return_deleted_object=True,
    ),
    ResourceType("", "v1", "bindings", "Binding", namespaced=True, create_only=True, verbs=("create",)),
    ResourceType("", "v1", "configmaps", "ConfigMap", namespaced=True, short_names=("cm",)),
    ResourceType("", "v1", "secrets", "Secret", namespaced=True, selectable_fields=("type",)),
    ResourceType(
        "", "v1", "events", "Event", namespaced=True, short_names=("ev",), selectable_fields=_EVENT_FIELDS
    ),
    ResourceType("", "v1", "serviceaccounts", "ServiceAccount", namespaced=True, short_names=("sa",)),
    ResourceType(
        "admissionregistration.k8s.io",
        "v1",
        "mutatingwebhookconfigurations",
        "MutatingWebhookConfiguration",
        namespaced=False,
        has_generation=True,
    ),
    ResourceType(
        "admissionregistration.k8s.io",
        "v1",
        "validatingwebhookconfigurations",
        "ValidatingWebhookConfiguration",
        namespaced=False,
        has_generation=True,
    ),
    ResourceType("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True, create_on_update=True),
    # resource.k8s.io/v1 (pkg/registry/resource/*/strategy.go): slices and classes bump
    # metadata.generation on spec changes; a slice is selectable by node and driver (toSelectableFields).
    ResourceType(
        "resource.k8s.io",
        "v1",
        "resourceslices",
        "ResourceSlice",
        namespaced=False,
        selectable_fields=("spec.nodeName", "spec.driver"),
        has_generation=True,
    ),
    ResourceType(
        "resource.k8s.io", "v1", "deviceclasses", "DeviceClass", namespaced=False, has_generation=True
    ),
    ResourceType(
        "resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", namespaced=True, subresources=("status",)
    ),
    ResourceType("resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate", namespaced=True),
)


@dataclass(frozen=True)
class GroupVersion:
    """One served API group version and its resources."""

    group: str
    version: str
    resources: Mapping[str, ResourceType]

    @property
    def group_version(self) -> str:
        """`v1` or `<group>/<version>`, as written in `apiVersion`."""
        return f"{self.group}/{self.version}" if self.group else self.version


def _group_versions() -> dict[tuple[str, str], GroupVersion]:
    grouped: dict[tuple[str, str], dict[str, ResourceType]] = {}
    for rt in RESOURCES:
        grouped.setdefault((rt.group, rt.version), {})[rt.plural] = rt
    return {gv: GroupVersion(gv[0], gv[1], resources) for gv, resources in grouped.items()}


GROUP_VERSIONS: dict[tuple[str, str], GroupVersion] = _group_versions()
_BY_API_KIND = {(rt.api_version, rt.kind): rt for rt in RESOURCES}
_BY_NAME: dict[str, ResourceType] = {}
for _rt in RESOURCES:
    for _name in (_rt.kind.lower(), _rt.plural, _rt.key, *_rt.short_names):
        _BY_NAME.setdefault(_name, _rt)


def lookup(name: str) -> ResourceType:
    """The resource called `name`: a kind (`Pod`), a plural (`pods`), `plural.group`, or a short name."""
    rt = _BY_NAME.get(name.lower())
    if rt is None:
        known = ", ".join(sorted(rt.kind for rt in RESOURCES))
        raise LookupError(f"unknown resource {name!r}; the stand-in serves {known}")
    return rt


def lookup_object(obj: Mapping[str, Any]) -> ResourceType:
    """The resource an object belongs to, from its `apiVersion` and `kind`."""
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    rt = _BY_API_KIND.get((str(api_version), str(kind)))
    if rt is None:
        raise LookupError(f"unknown object type apiVersion={api_version!r} kind={kind!r}")
    return rt


@functools.cache
def _split_path(path: str) -> tuple[str, ...]:
    return tuple(path.split("."))


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The string a field selector compares for `path` (a dotted path; absent fields read as "")."""
    node: Any = obj
    for part in _split_path(path):
        # `dict`, not `Mapping`: this runs for every object of a filtered list, and ABC checks are slow.
        if not isinstance(node, dict):
            return ""
        node = node.get(part)
    if node is None or isinstance(node, dict | list):
        return ""
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _subdomain_problem(name: str) -> str | None:
    if len(name) > 253:
        return "must be no more than 253 characters"
    if not _DNS1123_SUBDOMAIN.match(name):
        return (
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
            "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
            "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
        )
    return None


def _label_problem(name: str) -> str | None:
    if len(name) > 63:
        return "must be no more than 63 characters"
    if not _DNS1123_LABEL.match(name):
        return (
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
            "and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', "
            "regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
        )
    return None


NAME_VALIDATORS: dict[str, Callable[[str], str | None]] = {"namespaces": _label_problem}


def name_problem(rt: ResourceType, name: str) -> str | None:
    """Why `name` is not a valid object name for `rt`, or None when it is."""
    return NAME_VALIDATORS.get(rt.plural, _subdomain_problem)(name)


NAMESPACES = lookup("namespaces")
PODS = lookup("pods")
