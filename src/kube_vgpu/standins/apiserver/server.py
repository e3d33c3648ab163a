"""A stand-in for kube-apiserver that the official Kubernetes client talks to as if it were real.

`ApiServerStandin` serves the REST wire contract of the resources this project uses (nodes, namespaces,
pods with binding and status, configmaps, secrets, events, leases, webhook configurations, and
resource.k8s.io/v1 ResourceSlices, DeviceClasses, ResourceClaims and ResourceClaimTemplates) over HTTP or
HTTPS on 127.0.0.1, with list/watch, resourceVersions, selectors, pagination and the three patch types;
it injects faults (410 Gone, closed watches, outage, hang, RBAC denial), logs requests, and lets tests
read and write its state directly. Run it on its own thread (`start()`/`stop()`, `with`) for the sync
client, or on the caller's loop (`await start_async()`, `async with`).

    with ApiServerStandin() as api:
        api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
        kubernetes.config.load_kube_config(config_file=str(api.write_kubeconfig(tmp_path / "kubeconfig")))
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import ssl
import threading
from collections.abc import Coroutine, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self

import yaml
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from kube_vgpu.standins.apiserver.defaults import decoded
from kube_vgpu.standins.apiserver.dra import FeatureGates
from kube_vgpu.standins.apiserver.faults import Faults, RequestRecord
from kube_vgpu.standins.apiserver.http import ApiHttp, ServerConfig
from kube_vgpu.standins.apiserver.ops import Operations, with_type
from kube_vgpu.standins.apiserver.patch import JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH
from kube_vgpu.standins.apiserver.resources import ResourceType, lookup, lookup_object
from kube_vgpu.standins.apiserver.selectors import LabelSelector
from kube_vgpu.standins.apiserver.store import Store, encode

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

log = logging.getLogger("standins.apiserver")

# The namespaces every cluster starts with.
SEED_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_PATCH_TYPES = {"json": JSON_PATCH, "merge": MERGE_PATCH, "strategic": STRATEGIC_MERGE_PATCH}


class ApiServerStandin:
    """The stand-in API server: state, HTTP listener, fault switches, and client configuration."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        git_version: str = "v1.30.0",
        token: str | None = "standin-token",
        user: str = "system:serviceaccount:kube-vgpu:kube-vgpu",
        tls_cert_file: str | Path | None = None,
        tls_key_file: str | Path | None = None,
        ca_file: str | Path | None = None,
        history_limit: int = 20_000,
        graceful_pod_deletion: bool = False,
        default_watch_timeout_s: float = 1800.0,
        bookmark_interval_s: float = 60.0,
        seed_namespaces: bool = True,
        feature_gates: FeatureGates | None = None,
    ) -> None:
        if (tls_cert_file is None) != (tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together: give both for HTTPS, or neither")
        self.host = host
        self._port = port
        self._tls = (Path(tls_cert_file), Path(tls_key_file)) if tls_cert_file and tls_key_file else None
        self._ca_file = Path(ca_file) if ca_file else None
        self.store = Store(history_limit)
        self.ops = Operations(
            self.store, graceful_pod_deletion=graceful_pod_deletion, feature_gates=feature_gates
        )
        self.faults = Faults()
        self.config = ServerConfig(
            git_version=git_version,
            token=token,
            user=user,
            default_watch_timeout_s=default_watch_timeout_s,
            bookmark_interval_s=bookmark_interval_s,
        )
        self._http = ApiHttp(self.ops, self.faults, self.config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        if seed_namespaces:
            for namespace in SEED_NAMESPACES:
                self.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})

    # -- addresses and client configuration --------------------------------------------------------

    @property
    def port(self) -> int:
        """The TCP port it listens on (known once started)."""
        if self._port == 0:
            raise RuntimeError("the stand-in API server has no port before it is started")
        return self._port

    @property
    def url(self) -> str:
        """Base URL clients use, e.g. `http://127.0.0.1:40123`."""
        scheme = "https" if self._tls else "http"
        return f"{scheme}://{self.host}:{self.port}"

    @property
    def feature_gates(self) -> FeatureGates:
        """The DRA feature gates it imitates (default: Kubernetes 1.34/1.35's, consumable capacity and
        device taints off); assign to change them for later writes."""
        return self.ops.feature_gates

    @feature_gates.setter
    def feature_gates(self, value: FeatureGates) -> None:
        self.ops.feature_gates = value

    @property
    def git_version(self) -> str:
        """The gitVersion `/version` reports; assign to pretend another Kubernetes release."""
        return self.config.git_version

    @git_version.setter
    def git_version(self, value: str) -> None:
        self.config.git_version = value

    def kubeconfig(self, namespace: str = "default") -> dict[str, Any]:
        """A kubeconfig document pointing at this server, with its bearer token."""
        cluster: dict[str, Any] = {"server": self.url}
        if self._tls and self._ca_file:
            cluster["certificate-authority"] = str(self._ca_file)
        elif self._tls:
            cluster["insecure-skip-tls-verify"] = True
        user: dict[str, Any] = {"token": self.config.token} if self.config.token else {}
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "standin", "cluster": cluster}],
            "users": [{"name": "standin", "user": user}],
            "contexts": [
                {
                    "name": "standin",
                    "context": {"cluster": "standin", "user": "standin", "namespace": namespace},
                }
            ],
            "current-context": "standin",
        }

    def write_kubeconfig(self, path: str | Path, namespace: str = "default") -> Path:
        """Write the kubeconfig to `path`, for `kubernetes.config.load_kube_config(config_file=...)`."""
        path = Path(path)
        path.write_text(yaml.safe_dump(self.kubeconfig(namespace), sort_keys=False))
        return path

    def api_client(self) -> ApiClient:
        """A `kubernetes.client.ApiClient` configured from the kubeconfig, as production loads it.
        Close it (or use it as a context manager) when done."""
        from kubernetes import client, config

        configuration = client.Configuration()
        config.load_kube_config_from_dict(self.kubeconfig(), client_configuration=configuration)  # type: ignore[no-untyped-call]
        return client.ApiClient(configuration)

    # -- lifecycle ----------------------------------------------------------------------------------

    async def start_async(self) -> None:
        """Start serving on the running loop."""
        if self._runner is not None:
            raise RuntimeError("the stand-in API server is already running")
        self._loop = asyncio.get_running_loop()
        self._runner = web.AppRunner(self._http.application(), access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        await self._listen()
        log.info("event=apiserver_started url=%s", self.url)

    async def stop_async(self) -> None:
        """Stop serving: end watches, drop hung requests, close connections. State is kept."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        self._end_requests()
        await runner.cleanup()
        self._site = None
        log.info("event=apiserver_stopped url=%s", self.url)

    def start(self) -> None:
        """Start serving on a loop of its own in a background thread."""
        if self._thread is not None:
            raise RuntimeError("the stand-in API server is already running")
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=_run_loop, args=(loop,), name="apiserver-standin", daemon=True)
        thread.start()
        self._thread = thread
        try:
            asyncio.run_coroutine_threadsafe(self.start_async(), loop).result(timeout=30)
        except BaseException:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            self._thread = None
            raise

    def stop(self) -> None:
        """Stop the server started by `start()` and join its thread."""
        thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            if self._runner is not None:
                raise RuntimeError("started with start_async(): stop it with await stop_async()")
            return
        try:
            asyncio.run_coroutine_threadsafe(self.stop_async(), loop).result(timeout=30)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            self._thread = None
            self._loop = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        await self.start_async()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop_async()

    async def _listen(self) -> None:
        assert self._runner is not None
        ssl_context = None
        if self._tls:
            ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ssl_context.load_cert_chain(*self._tls)
        site = web.TCPSite(self._runner, self.host, self._port, ssl_context=ssl_context)
        await site.start()
        if self._port == 0:
            self._port = int(self._runner.addresses[0][1])
        self.config.address = f"{self.host}:{self._port}"
        self._site = site

    def _end_requests(self) -> None:
        self.close_watches()
        self.faults.drop_hung()

    def _run(self, coroutine: Coroutine[Any, Any, None]) -> None:
        loop = self._loop
        if loop is None:
            coroutine.close()
            raise RuntimeError("the stand-in API server is not running")
        if self._thread is None or threading.current_thread() is self._thread:
            coroutine.close()
            raise RuntimeError("on the server's own loop, await the *_async method instead")
        asyncio.run_coroutine_threadsafe(coroutine, loop).result(timeout=30)

    # -- fault injection ----------------------------------------------------------------------------

    def expire_history(self) -> None:
        """Forget the change history: the next watch from an older resourceVersion gets 410 Expired."""
        self.store.expire_history()

    def close_watches(self) -> None:
        """End every open watch stream cleanly, as the server does when a watch times out."""
        for subscription in self.store.subscriptions():
            subscription.push(None)

    def send_bookmarks(self) -> None:
        """Send a BOOKMARK now on every watch that asked for bookmarks."""
        for subscription in self.store.subscriptions():
            self.store.bookmark(subscription)

    def set_outage(self, down: bool) -> None:
        """Take the server down (connections refused, open ones dropped; state kept) or bring it back on
        the same port. From the server's own loop use `set_outage_async`."""
        self._run(self.set_outage_async(down))

    async def set_outage_async(self, down: bool) -> None:
        """`set_outage`, awaited on the loop the server runs on."""
        if self._runner is None:
            raise RuntimeError("the stand-in API server is not running")
        if down and self._site is not None:
            site, self._site = self._site, None
            await site.stop()
            self._end_requests()
            server = self._runner.server
            if server is not None:
                # Close idle keep-alive connections too, so clients see the outage at once. Not
                # `server.shutdown`: it forgets, unclosed, a connection that finishes opening while the
                # others are shut down (one accepted just before the listening socket closed); so shut
                # them down in rounds until none is new.
                server.pre_shutdown()
                shut: set[RequestHandler] = set()
                while opened := [handler for handler in server.connections if handler not in shut]:
                    shut.update(opened)
                    await asyncio.gather(*(handler.shutdown(0.5) for handler in opened))
            log.info("event=apiserver_outage url=%s", self.url)
        elif not down and self._site is None:
            await self._listen()
            log.info("event=apiserver_restored url=%s", self.url)

    def set_hang(self, hanging: bool, paths: list[str] | tuple[str, ...] | None = None) -> None:
        """Make requests whose path starts with one of `paths` (all when None) wait without an answer
        until the hang is lifted or the server stops."""
        self.faults.set_hang(hanging, paths)

    def deny(self, verb: str, resource: str, namespace: str | None = None) -> None:
        """Answer matching requests 403 Forbidden, as RBAC would. `verb` is an RBAC verb (get, list,
        watch, create, update, patch, delete) or `*`; `resource` is `pods`, `nodes/status`, ... or `*`."""
        if resource != "*":
            lookup(resource.split("/", 1)[0])  # raises LookupError naming the resources served
        self.faults.deny(verb, resource, namespace)

    def allow_all(self) -> None:
        """Drop every deny rule."""
        self.faults.allow_all()

    def requests(self, method: str | None = None, path_prefix: str | None = None) -> list[RequestRecord]:
        """Requests received so far, oldest first, optionally of one method and under a path."""
        return [
            r
            for r in self.faults.records()
            if (method is None or r.method == method.upper())
            and (path_prefix is None or r.path.startswith(path_prefix))
        ]

    def clear_requests(self) -> None:
        """Forget the requests received so far."""
        self.faults.clear_records()

    # -- direct state access ------------------------------------------------------------------------

    def put(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Create or replace a whole object (status included); watches see ADDED or MODIFIED."""
        stored = self.ops.put(obj)
        return with_type(lookup_object(obj), stored.copy())

    def load_compact(self, kind: str, objects: Iterable[dict[str, Any]]) -> int:
        """Store many objects of one kind (bare: no apiVersion/kind) as compact JSON, with no watch
        event or history (benchmark fill: 150,000 realistic pods held as dicts would cost
        gigabytes). Each object carries its final metadata (uid, creationTimestamp); returns the count."""
        return self.store.load_compact(lookup(kind), objects)

    def decode(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """A create body as mutating admission sees it: decoded,
        quantities in canonical form, defaulted, nothing stored and no system metadata yet (a
        `generateName` pod has no name). Raises the 400 the real server answers for a bad quantity."""
        return decoded(obj)

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """An object by kind (`Pod`, `pods`, ...) and name, or None; namespaced kinds default to `default`."""
        rt = lookup(kind)
        stored = self.store.get(rt, _namespace(rt, namespace), name)
        return with_type(rt, stored.copy()) if stored is not None else None

    def list(
        self, kind: str, namespace: str | None = None, label_selector: str = ""
    ) -> builtins.list[dict[str, Any]]:
        """Objects of a kind, in one namespace or all, in the order a list answers them."""
        rt = lookup(kind)
        labels = LabelSelector.parse(label_selector)
        page = self.ops.list(rt, namespace, labels=labels)
        return [with_type(rt, stored.copy()) for stored in page.items]

    def patch(
        self,
        kind: str,
        name: str,
        patch: Mapping[str, Any] | builtins.list[Any],
        namespace: str | None = None,
        patch_type: Literal["strategic", "merge", "json"] = "strategic",
    ) -> dict[str, Any]:
        """Patch a whole object, status included; raises StatusError (404, 409, 422) as the API would."""
        rt = lookup(kind)
        if patch_type not in _PATCH_TYPES:
            raise ValueError(f"patch_type must be one of {sorted(_PATCH_TYPES)}, got {patch_type!r}")
        stored = self.ops.patch(
            rt, _namespace(rt, namespace), name, _PATCH_TYPES[patch_type], encode(patch), scope="all"
        )
        return with_type(rt, stored.copy())

    def delete(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """Remove an object now, ignoring finalizers and grace periods (the kubelet's final delete);
        returns its last state, or None when there was none."""
        rt = lookup(kind)
        ns = _namespace(rt, namespace)
        with self.store.lock:
            stored = self.store.get(rt, ns, name)
            if stored is None:
                return None
            if rt.plural == "namespaces":
                return with_type(rt, self.ops.delete(rt, ns, name).stored.copy())
            return with_type(rt, self.store.commit(rt, "DELETED", stored.copy(), stored).copy())


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()


def _namespace(rt: ResourceType, namespace: str | None) -> str:
    if not rt.namespaced:
        return ""
    return namespace or "default"


__all__ = ["ApiServerStandin", "RequestRecord"]
