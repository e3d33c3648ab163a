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

from kube_vgpu.standins.apiserver import dra, errors
from kube_vgpu.standins.apiserver.errors import StatusError
from kube_vgpu.standins.apiserver.faults import Faults, RequestRecord
from kube_vgpu.standins.apiserver.ops import Operations, Scope, selected
from kube_vgpu.standins.apiserver.resources import ResourceType
from kube_vgpu.standins.apiserver.routes import (
    Target,
    discovery,
    parse_path,
    query_bool,
    query_dry_run,
    query_int,
    verb_of,
    version_info,
)
from kube_vgpu.standins.apiserver.selectors import FieldSelector, LabelSelector, SelectorParseError
from kube_vgpu.standins.apiserver.store import Bookmark, Change, Stored, Subscription, encode

log = logging.getLogger("standins.apiserver")


@dataclass
class ServerConfig:
    """Settings the HTTP layer reads on every request (tests may change them while it runs)."""

    git_version: str = "v1.30.0"
    token: str | None = "standin-token"
    user: str = "system:serviceaccount:kube-vgpu:kube-vgpu"
    default_watch_timeout_s: float = 1800.0
    bookmark_interval_s: float = 60.0
    address: str = "127.0.0.1:0"


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
        except StatusError as exc:
            response = _json(exc.status_body(), exc.code)
        except Exception as exc:  # the real server answers 500 with a Status; so does the stand-in
            log.exception("event=internal_error method=%s path=%s", request.method, request.path)
            response = _json(
                StatusError(500, "InternalError", f"Internal error occurred: {exc}").status_body(), 500
            )
        record.status = response.status
        log.debug("event=request method=%s path=%s status=%s", request.method, request.path, response.status)
        return response

    async def _answer(self, request: web.Request, body: bytes) -> web.StreamResponse:
        path = request.path.rstrip("/") or "/"
        token, presented = self.config.token, request.headers.get("Authorization")
        if token is not None and presented is not None and presented != f"Bearer {token}":
            raise errors.unauthorized()
        # Health and version are public, as the real server's system:public-info-viewer role makes them.
        if path in ("/healthz", "/livez", "/readyz"):
            return web.Response(text="ok")
        if path == "/version":
            return _json(version_info(self.config.git_version))
        if token is not None and presented is None:
            raise errors.unauthorized()
        document = discovery(path, self.config.address)
        if document is not None:
            return _json(document)
        if not (path.startswith("/api/") or path.startswith("/apis/")):
            return web.Response(status=404, text="404 page not found\n")
        target = parse_path(path)
        return await self._serve(request, target, body)

    async def _serve(self, request: web.Request, target: Target, body: bytes) -> web.StreamResponse:
        query = request.query
        verb = verb_of(request.method, target, query)
        self._authorize(verb, target)
        rt, name, sub = target.rt, target.name, target.subresource
        namespace = target.namespace or ""
        dry_run = query_dry_run(query.get("dryRun"))
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
            obj, warnings = _known_fields(rt, _parse_json(body), query)
            return _warn(_object(rt, ops.create(rt, namespace, obj, dry_run=dry_run), 201), warnings)
        assert name is not None
        scope: Scope = "status" if sub == "status" else "main"
        if verb == "update":
            obj, warnings = _known_fields(rt, _parse_json(body), query)
            return _warn(
                _object(rt, ops.replace(rt, namespace, name, obj, scope=scope, dry_run=dry_run)), warnings
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
            options["gracePeriodSeconds"] = query_int(query, "gracePeriodSeconds")
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
        limit = query_int(query, "limit") if query.get("limit") else None
        exact_rv = self._list_version(query, limit)
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

    def _list_version(self, query: Any, limit: int | None) -> int | None:
        """The revision a list must be read at (None: the latest), after the real server's rules for
        `resourceVersion` and `resourceVersionMatch` (k8s.io/apimachinery/pkg/apis/meta/internalversion/
        validation ValidateListOptions; the semantics table of the API concepts page): unset, "0" and
        NotOlderThan are served the latest state, which is never older than any version asked for;
        Exact, or a version with a `limit` and no match (the legacy rule), reads at that revision."""
        text, match = query.get("resourceVersion", ""), query.get("resourceVersionMatch", "")
        causes = []
        if match:
            if not text:
                causes.append(
                    "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless "
                    "resourceVersion is provided"
                )
            if query.get("continue"):
                causes.append(
                    "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when continue "
                    "is provided"
                )
            if match not in ("Exact", "NotOlderThan"):
                causes.append(
                    f'resourceVersionMatch: Unsupported value: "{match}": supported values: '
                    '"Exact", "NotOlderThan", ""'
                )
            if match == "Exact" and text == "0":
                causes.append(
                    'resourceVersionMatch: Forbidden: resourceVersionMatch "exact" is forbidden for '
                    'resourceVersion "0"'
                )
        if causes:
            raise errors.invalid("ListOptions", "", causes, "meta.k8s.io")
        if text in ("", "0"):
            return None
        if query.get("continue"):
            # k8s.io/apiserver/pkg/storage ValidateListOptions: the token holds its own revision.
            raise errors.bad_request("specifying resource version is not allowed when using continue")
        wanted = query_int(query, "resourceVersion")
        current = self.ops.store.rv
        if wanted > current:
            # The real server first waits up to 3 s for its watch cache to reach `wanted`; the
            # stand-in's store is the only copy, so nothing would arrive by waiting.
            raise errors.too_large_resource_version(wanted, current)
        return wanted if match == "Exact" or (not match and limit) else None

    async def _watch(self, request: web.Request, target: Target) -> web.StreamResponse:
        params = _watch_params(target, request.query, self.config.default_watch_timeout_s)
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        store = self.ops.store
        try:
            subscription, backlog = store.subscribe(target.rt, params.from_rv, asyncio.get_running_loop())
        except StatusError as exc:
            # The real server answers an expired resourceVersion with 200 and one ERROR event.
            await response.prepare(request)
            await response.write(encode({"type": "ERROR", "object": exc.status_body()}) + b"\n")
            await response.write_eof()
            return response
        try:
            await response.prepare(request)
            # The backlog (up to every object of the resource) goes out in large writes.
            batch = bytearray()
            for change in backlog:
                batch += _change_line(change, params.select)
                if len(batch) >= 256 * 1024:
                    await response.write(bytes(batch))
                    batch.clear()
            if batch:
                await response.write(bytes(batch))
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
                async with asyncio.timeout(wait):
                    item = await subscription.queue.get()
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
            line = _change_line(item, params.select)
            if line:
                await response.write(line)


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
    initial = query_bool(query, "sendInitialEvents")
    timeout = float(query_int(query, "timeoutSeconds")) if query.get("timeoutSeconds") else 0.0
    rv_text = query.get("resourceVersion", "")
    from_rv = None if initial or rv_text in ("", "0") else query_int(query, "resourceVersion")
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
        bookmarks=query_bool(query, "allowWatchBookmarks"),
        initial_events=initial,
    )


def _selectors(target: Target, query: Any) -> tuple[LabelSelector, FieldSelector]:
    try:
        labels = LabelSelector.parse(query.get("labelSelector", ""))
        fields = FieldSelector.parse(query.get("fieldSelector", ""), target.rt.field_selectable)
    except SelectorParseError as exc:
        raise errors.bad_request(str(exc)) from exc
    return labels, fields


def _change_line(change: Change, select: Callable[[dict[str, Any]], bool]) -> bytes:
    """The event a change is for a watcher selecting with `select` (empty when it does not see it)."""
    new_in = select(change.new.obj)
    if change.type == "MODIFIED" and change.old is not None:
        old_in = select(change.old.obj)
        # Objects moving into or out of the selection appear and disappear, as in the real watch cache.
        kind = "MODIFIED" if old_in and new_in else "ADDED" if new_in else "DELETED" if old_in else None
    elif change.type == "DELETED":
        kind = "DELETED" if select(change.old.obj if change.old else change.new.obj) else None
    else:
        kind = change.type if new_in else None
    return _event_line(kind, change.rt, change.new) if kind is not None else b""


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


def _known_fields(rt: ResourceType, obj: Any, query: Any) -> tuple[Any, list[str]]:
    """The body without the unknown fields the decoder would drop, and the warnings to send; with
    `fieldValidation=Strict`, a 400 naming the first unknown field (as the strict decoder answers)."""
    mode = query.get("fieldValidation") or "Warn"
    if mode not in ("Ignore", "Warn", "Strict"):
        raise errors.bad_request(
            f'fieldValidation must be one of "Ignore", "Warn", or "Strict", got "{mode}"'
        )
    unknown = dra.drop_unknown_fields(rt, obj)
    if unknown and mode == "Strict":
        raise errors.bad_request(
            "strict decoding error: " + ", ".join(f'unknown field "{f}"' for f in unknown)
        )
    return obj, [f'unknown field "{f}"' for f in unknown] if mode == "Warn" else []


def _warn(response: web.Response, warnings: list[str]) -> web.Response:
    for warning in warnings:
        # RFC 7234 warn-code 299, as the API server sends each warning.
        response.headers.add("Warning", '299 - "' + warning.replace('"', '\\"') + '"')
    return response


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


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")
