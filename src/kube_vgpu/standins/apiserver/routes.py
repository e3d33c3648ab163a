"""Where a request goes: the Kubernetes REST path scheme, the RBAC verb of a request, discovery
documents, and the query parameters every endpoint shares.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kube_vgpu.standins.apiserver import errors
from kube_vgpu.standins.apiserver.resources import GROUP_VERSIONS, GroupVersion, ResourceType, lookup

_TRUE = ("1", "t", "T", "TRUE", "true", "True")
_FALSE = ("0", "f", "F", "FALSE", "false", "False")


@dataclass(frozen=True)
class Target:
    """What a resource path names."""

    rt: ResourceType
    namespace: str | None  # None: cluster-scoped, or all namespaces
    name: str | None
    subresource: str | None

    @property
    def resource(self) -> str:
        """The resource as RBAC names it (`pods`, `pods/status`)."""
        return f"{self.rt.plural}/{self.subresource}" if self.subresource else self.rt.plural


def version_info(git_version: str) -> dict[str, str]:
    """The `/version` answer for a gitVersion such as `v1.30.0`."""
    core = git_version.lstrip("v").split("-", 1)[0].split("+", 1)[0]
    major, _, rest = core.partition(".")
    minor = rest.partition(".")[0]
    return {
        "major": major,
        "minor": minor,
        "gitVersion": git_version,
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2024-04-17T17:27:03Z",
        "goVersion": "go1.22.2",
        "compiler": "gc",
        "platform": "linux/amd64",
    }


def parse_path(path: str) -> Target:
    """The resource a REST path names; 404 (a Status) for paths no resource answers."""
    parts = path.strip("/").split("/")
    if parts[0] == "api" and len(parts) >= 2:
        gv, rest = GROUP_VERSIONS.get(("", parts[1])), parts[2:]
    elif parts[0] == "apis" and len(parts) >= 3:
        gv, rest = GROUP_VERSIONS.get((parts[1], parts[2])), parts[3:]
    else:
        raise errors.page_not_found()
    if gv is None or not rest or any(not p for p in rest):
        raise errors.page_not_found()
    namespaced = rest[0] == "namespaces" and len(rest) >= 3 and rest[2] in gv.resources
    if namespaced and gv.resources[rest[2]].namespaced:
        rt, namespace, tail = gv.resources[rest[2]], rest[1], rest[3:]
    else:
        rt_or_none = gv.resources.get(rest[0])
        if rt_or_none is None:
            raise errors.page_not_found()
        rt, namespace, tail = rt_or_none, None, rest[1:]
        if rt.namespaced and tail:
            raise errors.page_not_found()
    if len(tail) > 2 or (len(tail) == 2 and tail[1] not in rt.subresources):
        raise errors.page_not_found()
    return Target(rt, namespace, tail[0] if tail else None, tail[1] if len(tail) == 2 else None)


def verb_of(method: str, target: Target, query: Any) -> str:
    """The RBAC verb of a request (get, list, watch, create, update, patch, delete); 405 otherwise."""
    name, sub, rt = target.name, target.subresource, target.rt
    if rt.create_only:
        if method == "POST" and name is None:
            return "create"
    elif method == "GET":
        if query_bool(query, "watch"):
            return "watch"
        if name is None:
            return "list"
        if sub in (None, "status"):
            return "get"
    elif method == "POST":
        if name is None and (target.namespace is not None or not rt.namespaced):
            return "create"
        if sub == "binding":
            return "create"
    elif method in ("PUT", "PATCH") and name is not None and sub in (None, "status"):
        return "update" if method == "PUT" else "patch"
    elif method == "DELETE" and name is not None and sub is None:
        return "delete"
    raise errors.method_not_allowed(method, target.resource)


def _group(group: str) -> dict[str, Any]:
    versions = [
        {"groupVersion": gv.group_version, "version": gv.version}
        for gv in GROUP_VERSIONS.values()
        if gv.group == group
    ]
    return {"name": group, "versions": versions, "preferredVersion": versions[0]}


def _resource_list(gv: GroupVersion) -> dict[str, Any]:
    resources: list[dict[str, Any]] = []
    for rt in gv.resources.values():
        entry: dict[str, Any] = {
            "name": rt.plural,
            "singularName": rt.kind.lower(),
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": list(rt.verbs),
        }
        if rt.short_names:
            entry["shortNames"] = list(rt.short_names)
        resources.append(entry)
        for sub in rt.subresources:
            sub_kind = lookup("bindings").kind if sub == "binding" else rt.kind
            sub_verbs = ["create"] if sub == "binding" else ["get", "patch", "update"]
            resources.append(
                {
                    "name": f"{rt.plural}/{sub}",
                    "singularName": "",
                    "namespaced": rt.namespaced,
                    "kind": sub_kind,
                    "verbs": sub_verbs,
                }
            )
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": gv.group_version,
        "resources": resources,
    }


def query_bool(query: Any, key: str) -> bool:
    """A boolean query parameter, spelled as Go's strconv.ParseBool accepts; absent is false."""
    value = query.get(key)
    if value is None or value == "":
        return False
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise errors.bad_request(f'invalid value for {key}: "{value}" is not a boolean')


def query_int(query: Any, key: str) -> int:
    """An integer query parameter; 400 when it is not one."""
    value = query.get(key)
    try:
        return int(value)
    except (TypeError, ValueError) as exc:
        raise errors.bad_request(f'invalid value for {key}: "{value}" is not an integer') from exc


def query_dry_run(value: str | None) -> bool:
    """Whether `dryRun` asks for a dry run; only `All` is a valid value, as on the real server."""
    if value is None or value == "":
        return False
    if value != "All":
        raise errors.bad_request(f'Invalid dry run value: "{value}": supported values: "All"')
    return True


def discovery(path: str, address: str) -> dict[str, Any] | None:
    """The discovery document at `path` (`/api`, `/apis`, `/api/v1`, `/apis/<group>[/<version>]`), or None."""
    if path == "/api":
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}],
        }
    groups = sorted({gv.group for gv in GROUP_VERSIONS.values() if gv.group})
    if path == "/apis":
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [_group(g) for g in groups]}
    parts = path.strip("/").split("/")
    if parts[0] == "apis" and len(parts) == 2 and parts[1] in groups:
        return {"kind": "APIGroup", "apiVersion": "v1", **_group(parts[1])}
    gv = None
    if parts[0] == "api" and len(parts) == 2:
        gv = GROUP_VERSIONS.get(("", parts[1]))
    elif parts[0] == "apis" and len(parts) == 3:
        gv = GROUP_VERSIONS.get((parts[1], parts[2]))
    return _resource_list(gv) if gv is not None else None
