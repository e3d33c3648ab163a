"""The one place kube-vgpu touches the official `kubernetes` client: raw JSON in, raw JSON out.

Objects stay plain dicts (building the client's typed models takes many times as long as
`json.loads` on large lists), so every call asks the client for its raw response
(`_preload_content=False`). Calls are synchronous (urllib3); async callers run them in a thread.
Every call has a timeout, so a hung API server costs a bounded wait, never a hang.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import logging
import os
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson
import urllib3
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from kube_vgpu.contract.yamltext import safe_load, utf8_problem, yaml_problem
from kube_vgpu.kubeapi.flags import given_as, source_of
from kube_vgpu.kubeapi.permissions import Component, UndeclaredCall, Verb, declared

log = logging.getLogger("kube_vgpu.kubeapi")

Kind = Literal[
    "node",
    "namespace",
    "pod",
    "configmap",
    "secret",
    "event",
    "mutatingwebhookconfiguration",
    "validatingwebhookconfiguration",
    "resourceslice",
    "resourceclaim",
    "resourceclaimtemplate",
    "deviceclass",
]
PatchType = Literal["merge", "strategic", "json"]
ResourceVersionMatch = Literal["NotOlderThan", "Exact"]
_CONTENT_TYPES: dict[PatchType, str] = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
}
# Method suffixes of the generated API classes, per kind: (cluster-scoped, api attribute, suffix).
_KINDS: dict[Kind, tuple[bool, str, str]] = {
    "node": (True, "core", "node"),
    "namespace": (True, "core", "namespace"),
    "pod": (False, "core", "pod"),
    "configmap": (False, "core", "config_map"),
    "secret": (False, "core", "secret"),
    "event": (False, "core", "event"),
    "mutatingwebhookconfiguration": (True, "admission", "mutating_webhook_configuration"),
    "validatingwebhookconfiguration": (True, "admission", "validating_webhook_configuration"),
    "resourceslice": (True, "resource", "resource_slice"),
    "resourceclaim": (False, "resource", "resource_claim"),
    "resourceclaimtemplate": (False, "resource", "resource_claim_template"),
    "deviceclass": (True, "resource", "device_class"),
}
# (API group, RBAC resource) per kind, for checking calls against `kubeapi.permissions`.
_RBAC: dict[Kind, tuple[str, str]] = {
    "node": ("", "nodes"),
    "namespace": ("", "namespaces"),
    "pod": ("", "pods"),
    "configmap": ("", "configmaps"),
    "secret": ("", "secrets"),
    "event": ("", "events"),
    "mutatingwebhookconfiguration": ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"),
    "validatingwebhookconfiguration": ("admissionregistration.k8s.io", "validatingwebhookconfigurations"),
    "resourceslice": ("resource.k8s.io", "resourceslices"),
    "resourceclaim": ("resource.k8s.io", "resourceclaims"),
    "resourceclaimtemplate": ("resource.k8s.io", "resourceclaimtemplates"),
    "deviceclass": ("resource.k8s.io", "deviceclasses"),
}
DEFAULT_TIMEOUT = (5.0, 10.0)  # (connect, read) seconds


class KubeError(Exception):
    """Base of the errors this module raises."""


class ApiUnavailable(KubeError):
    """The API server could not be reached or did not answer in time."""


class KubeConfigError(KubeError):
    """No usable credentials: neither the given kubeconfig nor in-cluster configuration."""


@dataclass
class ApiError(KubeError):
    """The API server answered with an error Status."""

    status: int
    reason: str
    message: str

    def __str__(self) -> str:
        return f"{self.status} {self.reason}: {self.message}"

    @property
    def version_unavailable(self) -> bool:
        """Whether a list or watch at a resourceVersion failed because the server cannot serve that
        version: 410 Expired (compacted away), or 504 "Too large resource version" (a server, or a
        watch cache, that has not reached it yet; k8s.io/apiserver/pkg/storage/errors.go)."""
        return self.status == 410 or (self.status == 504 and "Too large resource version" in self.message)


def kubeconfig_files(
    flag: str | None, environ: Mapping[str, str], home: str
) -> tuple[str, builtins.list[str], builtins.list[str]]:
    """Where kubectl would read a kubeconfig: (the source, its existing files, what was passed over).

    kubectl's order: `--kubeconfig` alone when given (it must exist); else every file `$KUBECONFIG`
    lists (a path list; missing files are skipped) and nothing else; else `~/.kube/config`. No file
    found means the in-cluster service account comes next.
    """
    if flag:
        return source_of(flag, "--kubeconfig"), [flag], []
    listed = [p for p in environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        found = [p for p in listed if os.path.exists(os.path.expanduser(p))]
        return (
            "$KUBECONFIG",
            found,
            ["--kubeconfig (not given)", f"$KUBECONFIG {environ['KUBECONFIG']} (no such file)"],
        )
    default = os.path.join(home, ".kube", "config")
    if os.path.exists(default):
        return "~/.kube/config", [default], []
    return (
        "~/.kube/config",
        [],
        ["--kubeconfig (not given)", "$KUBECONFIG (not set)", f"{default} (no such file)"],
    )


def _documents(paths: builtins.list[str]) -> builtins.list[Mapping[str, Any]]:
    """Each kubeconfig file as a mapping (an empty file as an empty one), or KubeConfigError."""
    documents: builtins.list[Mapping[str, Any]] = []
    for path in paths:
        try:
            with open(os.path.expanduser(path), encoding="utf-8") as stream:
                document = safe_load(stream)
        except OSError as exc:
            raise KubeConfigError(f"cannot read kubeconfig {path}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise KubeConfigError(f"kubeconfig {path}: {yaml_problem(exc)}") from None
        except UnicodeDecodeError as exc:
            raise KubeConfigError(f"kubeconfig {path}: {utf8_problem(exc)}") from None
        if document is not None and not isinstance(document, Mapping):
            kind = "a list" if isinstance(document, list) else type(document).__name__
            raise KubeConfigError(f"kubeconfig {path}: expected a mapping (kind: Config), got {kind}")
        documents.append(document or {})
    return documents


def _current_context(documents: builtins.list[Mapping[str, Any]]) -> str | None:
    # kubectl takes current-context from the first file that sets one; the client's merger would
    # take the last, so the context is chosen here and handed to it.
    for document in documents:
        if document.get("current-context"):
            return str(document["current-context"])
    return None


# A refusal lists at most this many of the kubeconfig's contexts.
_CONTEXTS_LISTED = 10


def _context_names(documents: builtins.list[Mapping[str, Any]]) -> builtins.list[str]:
    """Every context name the kubeconfig files give, once each, in the order kubectl merges them."""
    names: dict[str, None] = {}
    for document in documents:
        entries = document.get("contexts")
        for entry in entries if isinstance(entries, list) else []:
            if isinstance(entry, Mapping) and entry.get("name") is not None:
                names.setdefault(str(entry["name"]), None)
    return list(names)


def _check_context(
    documents: builtins.list[Mapping[str, Any]], context: str | None, chosen: str, where: str
) -> None:
    # The Python client's own refusal is "Invalid kube-config file. Expected object with name NAME
    # in FILE/contexts list", naming neither the contexts there are nor where the name came from.
    names = _context_names(documents)
    if chosen in names:
        return
    named = (
        f"context {chosen!r} (from {source_of(context, '--context')})"
        if context
        else f"current-context {chosen!r}"
    )
    if not names:
        listed = "it has no contexts"
    elif len(names) > _CONTEXTS_LISTED:
        listed = f"its contexts: {', '.join(names[:_CONTEXTS_LISTED])}, … ({len(names)} in all)"
    else:
        listed = f"its contexts: {', '.join(names)}"
    raise KubeConfigError(f"{named} is not in {where}; {listed}")


def _cluster_of(documents: builtins.list[Mapping[str, Any]], context: str | None) -> str:
    """The cluster name `context` points at (kubectl's merge: the first file naming it wins)."""
    for document in documents:
        for entry in document.get("contexts") or []:
            if isinstance(entry, Mapping) and entry.get("name") == context:
                return str((entry.get("context") or {}).get("cluster"))
    return "?"


def _check_server(host: str, where: str, cluster: str) -> None:
    # client-go refuses a cluster without a server before any request ("no server found for
    # cluster"); the Python client would try it and fail in urllib3's words.
    if not host:
        raise KubeConfigError(f"cannot use {where}: its cluster {cluster!r} has no server")
    parts = urllib.parse.urlsplit(host)
    if parts.scheme not in ("https", "http") or not parts.hostname or any(c.isspace() for c in host):
        raise KubeConfigError(
            f"cannot use {where}: its cluster {cluster!r} has server {host!r}, not a URL like https://HOST:PORT"
        )


def load_api_client(
    kubeconfig: str | None, context: str | None = None, *, environ: Mapping[str, str] | None = None
) -> k8s.ApiClient:
    """An ApiClient for the cluster kubectl would talk to: `--kubeconfig`, else `$KUBECONFIG`, else
    `~/.kube/config`, else the in-cluster service account; `context` picks a kubeconfig context.

    Raises KubeConfigError naming every place that was tried when none gives credentials.
    """
    environ = os.environ if environ is None else environ
    configuration = k8s.Configuration()
    source, files, tried = kubeconfig_files(kubeconfig, environ, os.path.expanduser("~"))
    if kubeconfig and not os.path.exists(os.path.expanduser(kubeconfig)):
        raise KubeConfigError(f"{given_as(kubeconfig, '--kubeconfig')}: no such file")
    if files:
        where = f"kubeconfig {os.pathsep.join(files)} (from {source})"
        documents = _documents(files)
        chosen_context = context or _current_context(documents)
        if chosen_context is not None:
            _check_context(documents, context, chosen_context, where)
        try:
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=os.pathsep.join(files),
                context=chosen_context,
                client_configuration=configuration,
                persist_config=False,
            )
        except (ConfigException, OSError, yaml.YAMLError, KeyError, TypeError, AttributeError) as exc:
            chosen = f" context {context!r}:" if context else ""
            raise KubeConfigError(f"cannot use {where}:{chosen} {exc}") from None
        _check_server(configuration.host or "", where, _cluster_of(documents, chosen_context))
    else:
        if context:
            raise KubeConfigError(
                f"{given_as(context, '--context')} needs a kubeconfig, and none was found: "
                f"tried {', '.join(tried)}"
            )
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except (ConfigException, OSError) as exc:
            tried.append(f"in-cluster service account ({exc})")
            raise KubeConfigError(
                f"no cluster to talk to: tried {', '.join(tried)}; pass --kubeconfig FILE or set $KUBECONFIG"
            ) from None
    # Fail fast and let the caller's loop retry: urllib3's own retries would multiply timeouts.
    configuration.retries = False
    return k8s.ApiClient(configuration)


def _api_error(exc: ApiException) -> ApiError:
    body: Any = None
    try:
        body = json.loads(exc.body) if exc.body else None
    except (TypeError, ValueError):
        body = None
    if isinstance(body, Mapping):
        return ApiError(
            int(exc.status or 0), str(body.get("reason", exc.reason)), str(body.get("message", ""))
        )
    return ApiError(int(exc.status or 0), str(exc.reason), str(exc.body or ""))


class WatchInterrupt:
    """Ends a watch from another thread: `interrupt()` shuts the stream's socket down mid-read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._response: Any = None
        self._interrupted = False

    def attach(self, response: Any) -> None:
        """Called by `Kube.watch` with the open stream (shut at once if already interrupted)."""
        with self._lock:
            self._response = response
            if self._interrupted:
                self._shutdown()

    def interrupt(self) -> None:
        """End the watch now (or as soon as it opens); calling it again does nothing."""
        with self._lock:
            if not self._interrupted:
                self._interrupted = True
                self._shutdown()

    def _shutdown(self) -> None:
        if self._response is not None:
            # A stream that already ended (and went back to the pool: RuntimeError) has nothing to shut.
            with contextlib.suppress(ValueError, RuntimeError, OSError):
                self._response.shutdown()


class Kube:
    """Raw-JSON access to the handful of resources kube-vgpu reads and writes.

    With `component`, every call must be declared for it in `kubeapi.permissions.API_CALLS` (the
    table the chart's RBAC is checked against), else it raises `UndeclaredCall` before any I/O.
    """

    def __init__(
        self,
        api_client: k8s.ApiClient,
        *,
        timeout: tuple[float, float] = DEFAULT_TIMEOUT,
        component: Component | None = None,
    ) -> None:
        self.api_client = api_client
        self.timeout = timeout
        self.component = component
        self._apis: dict[str, Any] = {
            "core": k8s.CoreV1Api(api_client),
            "admission": k8s.AdmissionregistrationV1Api(api_client),
            "resource": k8s.ResourceV1Api(api_client),
        }

    def close(self) -> None:
        """Release the client's connection pool."""
        self.api_client.close()  # type: ignore[no-untyped-call]

    def _require(self, verb: Verb, kind: Kind, subresource: str = "") -> None:
        if self.component is None:
            return
        group, resource = _RBAC[kind]
        resource = f"{resource}/{subresource}" if subresource else resource
        if not declared(self.component, verb, resource, group):
            raise UndeclaredCall(
                f"{self.component} calls {verb} on {resource} ({group or 'core'}), which "
                "src/kube_vgpu/kubeapi/permissions.py does not declare for it (so its RBAC would refuse it)"
            )

    def _method(
        self, verb: str, kind: Kind, namespace: str | None, subresource: str = ""
    ) -> Callable[..., Any]:
        cluster, api, suffix = _KINDS[kind]
        if not cluster and verb == "list" and namespace is None:
            return getattr(self._apis[api], f"list_{suffix}_for_all_namespaces")  # type: ignore[no-any-return]
        scope = "" if cluster else "namespaced_"
        sub = f"_{subresource}" if subresource else ""
        return getattr(self._apis[api], f"{verb}_{scope}{suffix}{sub}")  # type: ignore[no-any-return]

    def _call(self, fn: Callable[..., Any], *args: Any, timeout: Any = None, **kwargs: Any) -> Any:
        try:
            return fn(*args, _preload_content=False, _request_timeout=timeout or self.timeout, **kwargs)
        except ApiException as exc:
            raise _api_error(exc) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ApiUnavailable(f"API server unreachable: {exc.__class__.__name__}: {exc}") from None

    def _raw(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> bytes:
        response = self._call(fn, *args, **kwargs)
        try:
            data: bytes = response.data
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ApiUnavailable(f"API server response broke off: {exc}") from None
        return data

    def _json(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        # orjson: a 3 MB page of pods decodes in well under json's time (lists are most of a sync).
        result: dict[str, Any] = orjson.loads(self._raw(fn, *args, **kwargs))
        return result

    @staticmethod
    def _ns(namespace: str | None) -> dict[str, str]:
        return {} if namespace is None else {"namespace": namespace}

    @staticmethod
    def _selectors(field_selector: str | None, label_selector: str | None) -> dict[str, str]:
        return {
            k: v for k, v in (("field_selector", field_selector), ("label_selector", label_selector)) if v
        }

    def list(
        self,
        kind: Kind,
        *,
        namespace: str | None = None,
        field_selector: str | None = None,
        label_selector: str | None = None,
        timeout: float | tuple[float, float] | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
        resource_version: str | None = None,
        resource_version_match: ResourceVersionMatch | None = None,
    ) -> dict[str, Any]:
        """The raw List object (`items`, `metadata.resourceVersion`); with `limit`, one page of it
        (`metadata.continue` names the next page; see `kubeapi.listwatch`).

        Without `resource_version` the list is a consistent read (a quorum read from etcd on servers
        before Kubernetes 1.31). `resource_version="0"` lets the API server answer from its watch
        cache, at any age; a version with `resource_version_match="NotOlderThan"` (and no `limit`)
        from the cache too, never older than that version (see `list_version`)."""
        result: dict[str, Any] = orjson.loads(
            self.list_raw(
                kind,
                namespace=namespace,
                field_selector=field_selector,
                label_selector=label_selector,
                timeout=timeout,
                limit=limit,
                continue_token=continue_token,
                resource_version=resource_version,
                resource_version_match=resource_version_match,
            )
        )
        return result

    def list_raw(
        self,
        kind: Kind,
        *,
        namespace: str | None = None,
        field_selector: str | None = None,
        label_selector: str | None = None,
        timeout: float | tuple[float, float] | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
        resource_version: str | None = None,
        resource_version_match: ResourceVersionMatch | None = None,
    ) -> bytes:
        """`list`'s answer as the API server sent it (JSON bytes), for readers that decode part of it."""
        self._require("list", kind)
        paging: dict[str, Any] = {}
        if limit is not None:
            paging["limit"] = limit
        if continue_token:
            paging["_continue"] = continue_token
        if resource_version:
            paging["resource_version"] = resource_version
        if resource_version_match:
            paging["resource_version_match"] = resource_version_match
        return self._raw(
            self._method("list", kind, namespace),
            timeout=timeout,
            **self._ns(namespace),
            **self._selectors(field_selector, label_selector),
            **paging,
        )

    def watch(
        self,
        kind: Kind,
        resource_version: str,
        *,
        namespace: str | None = None,
        timeout_seconds: int = 300,
        field_selector: str | None = None,
        label_selector: str | None = None,
        interrupt: WatchInterrupt | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Watch events (`{"type": ..., "object": {...}}`) from `resource_version` until the stream ends.

        A 410 Gone arrives as an event of type ERROR whose object is a Status with code 410. With
        `interrupt`, another thread can end a watch blocked on a silent stream (it then raises
        ApiUnavailable, and `interrupt.interrupted` tells the two apart).
        """
        self._require("watch", kind)
        response = self._call(
            self._method("list", kind, namespace),
            watch=True,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout_seconds,
            # The read timeout bounds silence on the stream; the server's own timeout ends it sooner.
            timeout=(self.timeout[0], timeout_seconds + 30.0),
            **self._ns(namespace),
            **self._selectors(field_selector, label_selector),
        )
        if interrupt is not None:
            interrupt.attach(response)
        try:
            buffer = b""
            for chunk in response.stream(amt=65536, decode_content=True):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield orjson.loads(line)
            if buffer.strip():
                yield orjson.loads(buffer)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ApiUnavailable(f"watch stream broke off: {exc}") from None
        finally:
            response.release_conn()

    def get(
        self,
        kind: Kind,
        name: str,
        *,
        namespace: str | None = None,
        timeout: float | tuple[float, float] | None = None,
    ) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        self._require("get", kind)
        try:
            return self._json(
                self._method("read", kind, namespace), name, timeout=timeout, **self._ns(namespace)
            )
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def patch(
        self,
        kind: Kind,
        name: str,
        body: Mapping[str, Any] | builtins.list[dict[str, Any]],
        *,
        namespace: str | None = None,
        patch_type: PatchType = "merge",
        subresource: str = "",
        timeout: float | tuple[float, float] | None = None,
    ) -> dict[str, Any]:
        """Patch an object (or its `status` subresource) and return the result."""
        self._require("patch", kind, subresource)
        return self._json(
            self._method("patch", kind, namespace, subresource),
            # By keyword: namespaced methods take (name, namespace, body), cluster-scoped (name, body).
            name=name,
            body=body,
            timeout=timeout,
            _content_type=_CONTENT_TYPES[patch_type],
            **self._ns(namespace),
        )

    def create(
        self,
        kind: Kind,
        body: Mapping[str, Any],
        *,
        namespace: str | None = None,
        timeout: float | tuple[float, float] | None = None,
    ) -> dict[str, Any]:
        """Create an object and return it as stored."""
        self._require("create", kind)
        return self._json(
            self._method("create", kind, namespace), body=body, timeout=timeout, **self._ns(namespace)
        )

    def replace(
        self,
        kind: Kind,
        name: str,
        body: Mapping[str, Any],
        *,
        namespace: str | None = None,
        timeout: float | tuple[float, float] | None = None,
    ) -> builtins.dict[str, Any]:
        """Replace an object (optimistic concurrency on `metadata.resourceVersion`)."""
        self._require("update", kind)
        return self._json(
            self._method("replace", kind, namespace),
            name=name,
            body=body,
            timeout=timeout,
            **self._ns(namespace),
        )

    def delete(
        self,
        kind: Kind,
        name: str,
        *,
        namespace: str | None = None,
        resource_version: str | None = None,
        timeout: float | tuple[float, float] | None = None,
    ) -> bool:
        """Delete an object; whether it existed. With `resource_version`, only that version of it:
        an object written since raises ApiError 409 (a DeleteOptions precondition) and stays."""
        self._require("delete", kind)
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if resource_version is not None:
            body["preconditions"] = {"resourceVersion": resource_version}
        try:
            self._raw(
                self._method("delete", kind, namespace),
                name=name,
                body=body,
                timeout=timeout,
                **self._ns(namespace),
            )
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def create_binding(self, pod: str, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST a Binding for a pod (used by the local Volcano stand-in, as the real scheduler does)."""
        self._require("create", "pod", "binding")
        return self._json(self._apis["core"].create_namespaced_pod_binding, pod, namespace, body)
