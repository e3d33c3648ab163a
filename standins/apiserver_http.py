"""The stand-in API server's HTTP face: Kubernetes REST paths, verbs, discovery and watch streams.

Requests are routed by hand, like the real server's path scheme (`/api/v1/namespaces/{ns}/pods/{name}`,
`/apis/{group}/{version}/...`), checked against the injected faults (hang, bearer token, deny rules),
then handed to `Operations`. Every failure is answered as a `Status` object.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from standins import apiserver_errors as errors
from standins.apiserver_errors import ApiError
from standins.apiserver_faults import Faults, RequestRecord
from standins.apiserver_ops import Operations, Scope, selected
from standins.apiserver_resources import GROUP_VERSIONS, GroupVersion, ResourceType, lookup
from standins.apiserver_selectors import FieldSelector, LabelSelector, SelectorError
from standins.apiserver_store import Bookmark, Change, Stored, Subscription, encode

log = logging.getLogger("standins.apiserver")

_TRUE = ("1", "t", "T", "TRUE", "true", "True")
_FALSE = ("0", "f", "F", "FALSE", "false", "False")


@dataclass
class ServerConfig:
    """Settings the HTTP layer reads on every request (tests may change them while it runs)."""

    git_version: str = "v1.30.0"
    token: str | None = "standin-token"
    user: str = "system:serviceaccount:kube-vgpu:kube-vgpu"
    default_watch_timeout_s: float = 1800.0
    bookmark_interval_s: float = 60.0
    address: str = "127.0.0.1:0"


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


class ApiHttp:
    """Builds the aiohttp application answering the Kubernetes REST API from `ops`."""

    def __init__(self, ops: Operations, faults: Faults, config: ServerConfig) -> None:
        self.ops = ops
        self.faults = faults
        self.config = config

    def application(self) -> web.Application:
        """A fresh application serving every path through one dispatcher."""
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        return app

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        record = RequestRecord(
            method=request.method,
            path=request.path,
            query=dict(request.query),
            content_type=request.headers.get("Content-Type", ""),
            body=body,
        )
        self.faults.record(record)
        if self.faults.hangs(request.path) and not await self.faults.wait_released(request.path):
            # The server is going away: drop the connection without an answer, as a dead server would.
            if request.transport is not None:
                request.transport.abort()
            raise asyncio.CancelledError
        try:
            response = await self._answer(request, body)
        except ApiError as exc:
            response = _json(exc.status_body(), exc.code)
        except Exception as exc:  # the real server answers 500 with a Status; so does the stand-in
            log.exception("event=internal_error method=%s path=%s", request.method, request.path)
            response = _json(
                ApiError(500, "InternalError", f"Internal error occurred: {exc}").status_body(), 500
            )
        record.status = response.status
        log.debug("event=request method=%s path=%s status=%s", request.method, request.path, response.status)
        return response

    async def _answer(self, request: web.Request, body: bytes) -> web.StreamResponse:
        path = request.path.rstrip("/") or "/"
        if path in ("/healthz", "/livez", "/readyz"):
            return web.Response(text="ok")
        token = self.config.token
        if token is not None and request.headers.get("Authorization") != f"Bearer {token}":
            raise errors.unauthorized()
        if path == "/version":
            return _json(version_info(self.config.git_version))
        discovery = self._discovery(path)
        if discovery is not None:
            return _json(discovery)
        if not (path.startswith("/api/") or path.startswith("/apis/")):
            return web.Response(status=404, text="404 page not found\n")
        target = parse_path(path)
        return await self._serve(request, target, body)

    async def _serve(self, request: web.Request, target: Target, body: bytes) -> web.StreamResponse:
        query = request.query
        verb = _verb(request.method, target, query)
        self._authorize(verb, target)
        rt, name, sub = target.rt, target.name, target.subresource
        namespace = target.namespace or ""
        dry_run = _dry_run(query.get("dryRun"))
        ops = self.ops
        if verb == "get":
            assert name is not None
            return _object(rt, ops.get(rt, namespace, name))
        if verb == "list":
            return self._list(target, query)
        if verb == "watch":
            return await self._watch(request, target)
        if sub == "binding" or rt.create_only:
            binding = _parse_json(body)
            pod_name = name if name is not None else _name_in(binding)
            ops.bind(namespace, pod_name, binding, dry_run=dry_run)
            return _json(errors.status_success(201), 201)
        if verb == "create":
            return _object(rt, ops.create(rt, namespace, _parse_json(body), dry_run=dry_run), 201)
        assert name is not None
        scope: Scope = "status" if sub == "status" else "main"
        if verb == "update":
            return _object(
                rt, ops.replace(rt, namespace, name, _parse_json(body), scope=scope, dry_run=dry_run)
            )
        if verb == "patch":
            content_type = request.headers.get("Content-Type", "")
            return _object(
                rt, ops.patch(rt, namespace, name, content_type, body, scope=scope, dry_run=dry_run)
            )
        # delete
        options = _parse_json(body) if body.strip() else {}
        if not isinstance(options, dict):
            raise errors.bad_request("DeleteOptions must be a JSON object")
        if "gracePeriodSeconds" in query:
            options["gracePeriodSeconds"] = _int(query, "gracePeriodSeconds")
        deleted = ops.delete(rt, namespace, name, options, dry_run=dry_run)
        if deleted.removed and not rt.return_deleted_object and rt.plural != "namespaces":
            details: errors.StatusDetails = {"name": name, "kind": rt.plural}
            if rt.group:
                details["group"] = rt.group
            details["uid"] = str(deleted.stored.obj["metadata"].get("uid", ""))
            return _json(errors.status_success(details=details))
        return _object(rt, deleted.stored)

    def _authorize(self, verb: str, target: Target) -> None:
        resource = target.resource
        if not self.faults.denied(verb, resource, target.namespace):
            return
        group = target.rt.group
        scope = f'in the namespace "{target.namespace}"' if target.namespace else "at the cluster scope"
        name = target.name or ""
        subject = f'{target.rt.plural} "{name}"' if name else target.rt.plural
        message = (
            f'{subject} is forbidden: User "{self.config.user}" cannot {verb} resource "{resource}" '
            f'in API group "{group}" {scope}'
        )
        raise errors.forbidden(message, target.rt.plural, name, group)

    def _list(self, target: Target, query: Any) -> web.Response:
        labels, fields = _selectors(target, query)
        limit = _int(query, "limit") if query.get("limit") else None
        exact_rv = None
        if query.get("resourceVersionMatch") == "Exact" and query.get("resourceVersion"):
            exact_rv = _int(query, "resourceVersion")
        page = self.ops.list(
            target.rt,
            target.namespace,
            labels=labels,
            fields=fields,
            limit=limit or None,
            continue_token=query.get("continue") or None,
            exact_rv=exact_rv,
        )
        metadata: dict[str, Any] = {"resourceVersion": str(page.rv)}
        if page.continue_token:
            metadata["continue"] = page.continue_token
        if page.remaining is not None:
            metadata["remainingItemCount"] = page.remaining
        rt = target.rt
        # Items are joined from each object's cached encoding: a list of 50,000 pods is not re-serialised.
        head = encode({"kind": rt.list_kind, "apiVersion": rt.api_version, "metadata": metadata})
        body = head[:-1] + b',"items":[' + b",".join(s.raw for s in page.items) + b"]}"
        return web.Response(body=body, content_type="application/json")

    async def _watch(self, request: web.Request, target: Target) -> web.StreamResponse:
        params = _watch_params(target, request.query, self.config.default_watch_timeout_s)
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        store = self.ops.store
        try:
            subscription, backlog = store.subscribe(target.rt, params.from_rv, asyncio.get_running_loop())
        except ApiError as exc:
            # The real server answers an expired resourceVersion with 200 and one ERROR event.
            await response.prepare(request)
            await response.write(encode({"type": "ERROR", "object": exc.status_body()}) + b"\n")
            await response.write_eof()
            return response
        try:
            await response.prepare(request)
            for change in backlog:
                await _send_change(response, change, params.select)
            if params.initial_events:
                store.bookmark(subscription, initial_events_end=True)
            await self._follow(response, subscription, params)
            await response.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            # The client went away, or the server is stopping: nothing more to send.
            pass
        finally:
            store.unsubscribe(subscription)
        return response

    async def _follow(
        self, response: web.StreamResponse, subscription: Subscription, params: WatchParams
    ) -> None:
        """Send changes as they come until the watch times out or the server ends it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + params.timeout_s
        interval = self.config.bookmark_interval_s
        next_bookmark = loop.time() + interval
        while (now := loop.time()) < deadline:
            wait = min(deadline, next_bookmark) - now if params.bookmarks else deadline - now
            try:
                item = await asyncio.wait_for(subscription.queue.get(), wait)
            except TimeoutError:
                if params.bookmarks and loop.time() >= next_bookmark:
                    # Queued behind pending changes, so its revision never runs ahead of them.
                    self.ops.store.bookmark(subscription)
                    next_bookmark = loop.time() + interval
                continue
            if item is None:
                return
            if isinstance(item, Bookmark):
                if params.bookmarks or item.initial_events_end:
                    await response.write(_bookmark_line(subscription.rt, item))
                continue
            await _send_change(response, item, params.select)

    def _discovery(self, path: str) -> dict[str, Any] | None:
        if path == "/api":
            return {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": self.config.address}
                ],
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


@dataclass(frozen=True)
class WatchParams:
    """What a watch request asks for."""

    from_rv: int | None  # None: start with the current objects as ADDED events
    select: Callable[[dict[str, Any]], bool]
    timeout_s: float
    bookmarks: bool
    initial_events: bool


def _watch_params(target: Target, query: Any, default_timeout_s: float) -> WatchParams:
    labels, fields = _selectors(target, query)
    if target.name is not None:
        # The deprecated single-object watch is a watch of the collection selected by name.
        terms = filter(None, (query.get("fieldSelector"), f"metadata.name={_escape(target.name)}"))
        fields = FieldSelector.parse(",".join(terms), target.rt.field_selectable)
    initial = _bool(query, "sendInitialEvents")
    timeout = float(_int(query, "timeoutSeconds")) if query.get("timeoutSeconds") else 0.0
    rv_text = query.get("resourceVersion", "")
    from_rv = None if initial or rv_text in ("", "0") else _int(query, "resourceVersion")
    filtered = not (labels.empty and fields.empty)
    namespace = target.namespace

    def select(obj: dict[str, Any]) -> bool:
        if namespace is not None and obj["metadata"].get("namespace") != namespace:
            return False
        return not filtered or selected(obj, labels, fields)

    return WatchParams(
        from_rv=from_rv,
        select=select,
        timeout_s=timeout if timeout > 0 else default_timeout_s,
        bookmarks=_bool(query, "allowWatchBookmarks"),
        initial_events=initial,
    )


def _verb(method: str, target: Target, query: Any) -> str:
    name, sub, rt = target.name, target.subresource, target.rt
    if rt.create_only:
        if method == "POST" and name is None:
            return "create"
    elif method == "GET":
        if _bool(query, "watch"):
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


def _selectors(target: Target, query: Any) -> tuple[LabelSelector, FieldSelector]:
    try:
        labels = LabelSelector.parse(query.get("labelSelector", ""))
        fields = FieldSelector.parse(query.get("fieldSelector", ""), target.rt.field_selectable)
    except SelectorError as exc:
        raise errors.bad_request(str(exc)) from exc
    return labels, fields


async def _send_change(
    response: web.StreamResponse, change: Change, select: Callable[[dict[str, Any]], bool]
) -> None:
    new_in = select(change.new.obj)
    if change.type == "MODIFIED" and change.old is not None:
        old_in = select(change.old.obj)
        # Objects moving into or out of the selection appear and disappear, as in the real watch cache.
        kind = "MODIFIED" if old_in and new_in else "ADDED" if new_in else "DELETED" if old_in else None
    elif change.type == "DELETED":
        kind = "DELETED" if select(change.old.obj if change.old else change.new.obj) else None
    else:
        kind = change.type if new_in else None
    if kind is not None:
        await response.write(_event_line(kind, change.rt, change.new))


def _event_line(kind: str, rt: ResourceType, stored: Stored) -> bytes:
    prefix = f'{{"type":"{kind}","object":{{"kind":"{rt.kind}","apiVersion":"{rt.api_version}",'.encode()
    # Every stored object has metadata, so its encoding is never the empty "{}".
    return prefix + stored.raw[1:] + b"}\n"


def _bookmark_line(rt: ResourceType, bookmark: Bookmark) -> bytes:
    metadata: dict[str, Any] = {"resourceVersion": str(bookmark.rv)}
    if bookmark.initial_events_end:
        metadata["annotations"] = {"k8s.io/initial-events-end": "true"}
    obj = {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": metadata}
    return encode({"type": "BOOKMARK", "object": obj}) + b"\n"


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


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=encode(body), status=status, content_type="application/json")


def _object(rt: ResourceType, stored: Stored, status: int = 200) -> web.Response:
    body = b'{"kind":"%s","apiVersion":"%s",' % (rt.kind.encode(), rt.api_version.encode()) + stored.raw[1:]
    return web.Response(body=body, status=status, content_type="application/json")


def _parse_json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise errors.bad_request(f"the request body is not valid JSON: {exc}") from exc


def _name_in(binding: Any) -> str:
    metadata = binding.get("metadata") if isinstance(binding, dict) else None
    name = metadata.get("name") if isinstance(metadata, dict) else None
    if not isinstance(name, str) or not name:
        raise errors.invalid(
            "Binding", "", ["metadata.name: Required value: name or generateName is required"]
        )
    return name


def _bool(query: Any, key: str) -> bool:
    value = query.get(key)
    if value is None or value == "":
        return False
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise errors.bad_request(f'invalid value for {key}: "{value}" is not a boolean')


def _int(query: Any, key: str) -> int:
    value = query.get(key)
    try:
        return int(value)
    except (TypeError, ValueError) as exc:
        raise errors.bad_request(f'invalid value for {key}: "{value}" is not an integer') from exc


def _dry_run(value: str | None) -> bool:
    if value is None or value == "":
        return False
    if value != "All":
        raise errors.bad_request(f'Invalid dry run value: "{value}": supported values: "All"')
    return True


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")
