"""Assembling and running the webhook process: API client, cluster cache, quota, pipeline, HTTPS server.

`serve()` runs until SIGTERM/SIGINT (or `stop` is set), then stops accepting, finishes the reviews
in flight, closes keep-alive connections and stops the cache's watch threads.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kube_vgpu.contract.config import Config, NodeConfig
from kube_vgpu.contract.mig.geometry import DeviceConfig, MigGeometryError, parse_device_config
from kube_vgpu.contract.mig.shipped import default_device_config
from kube_vgpu.contract.names import DEVICE_CONFIG_KEY
from kube_vgpu.httpedge.listener import ConnectionLimits, Listener
from kube_vgpu.httpedge.metrics_server import MetricsServer
from kube_vgpu.kubeapi.client import Kube, KubeError, load_api_client
from kube_vgpu.webhook.admission.gates import ClaimQuotaGate, QuotaGate
from kube_vgpu.webhook.admission.mutation import Admission
from kube_vgpu.webhook.admission.validation import Validation
from kube_vgpu.webhook.cache import CachedKind, CacheEvent, ClusterCache
from kube_vgpu.webhook.metrics import WebhookMetrics
from kube_vgpu.webhook.placement.inventory import Inventory
from kube_vgpu.webhook.quota.gate import NamespaceQuota
from kube_vgpu.webhook.quota.metrics import QuotaMetrics, SharedBookMetrics
from kube_vgpu.webhook.quota.shared import NamespaceSnapshot, SharedBook
from kube_vgpu.webhook.quota.shared_store import SharedReservations
from kube_vgpu.webhook.quota.sizing import pod_ledger
from kube_vgpu.webhook.records import ClaimRecord, NamespaceRecord, PodRecord
from kube_vgpu.webhook.reviews import Readiness, Services
from kube_vgpu.webhook.serving.server import AdmissionApp
from kube_vgpu.webhook.serving.tls import CertReloader

log = logging.getLogger("kube_vgpu.webhook")


@dataclass(frozen=True)
class Options:
    """Everything `serve` needs besides the configuration file's content."""

    tls_cert_file: Path
    tls_key_file: Path
    port: int = 8443
    host: str = "0.0.0.0"
    # Plain-HTTP `/metrics`, apart from the admission port (0 picks a free one).
    metrics_port: int = 9395
    kubeconfig: str | None = None
    kube_context: str | None = None
    cert_poll_seconds: float = 10.0
    # From SIGTERM to exit: stop accepting, finish requests in flight, close every connection.
    shutdown_timeout_seconds: float = 20.0
    limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    # Callers must present a client certificate signed by this CA (None: any caller is served).
    client_ca_file: Path | None = None
    # Where the shared quota reservations live (the chart passes the pod's own namespace).
    release_namespace: str = "default"
    # Whether the install put a NetworkPolicy in front of the port (what the chart rendered; the
    # webhook cannot see whether the network enforces it).
    network_policy: bool = False


# Given the ledger's view of one namespace, the shared reservations decided against it.
BookFactory = Callable[[Callable[[str], NamespaceSnapshot]], SharedBook]


def build_quota(
    cache: ClusterCache,
    config: Config,
    metrics: WebhookMetrics,
    book: BookFactory,
    geometry: Callable[[], DeviceConfig] = default_device_config,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> NamespaceQuota:
    """The quota step: namespace quotas fed by the cache's pod events, decided against the
    reservations every replica shares (`book`, given the ledger's `cache_state`). The one place the
    quota is wired."""
    ledger = pod_ledger(
        lambda: cache.inventory,
        geometry,
        config.resource_names,
        config.webhook.default_mode,
        # One setting for both: a reservation outlives no fresh cache, and no fresh cache outlives it.
        pending_seconds=config.webhook.cache_staleness_seconds,
        # The cache's clock: a forged review's reservation goes once the pod watch has passed it.
        clock=clock,
        stream_current_at=cache.quota_streams_current_at,
        claim_classes=frozenset(config.webhook.dra_device_classes),
        largest_claim_gpu=cache.largest_claim_gpu_mib,
    )
    gate = NamespaceQuota(ledger, book(ledger.cache_state))

    def on_pod(event: CacheEvent[PodRecord]) -> None:
        if event.type == "deleted":
            ledger.pod_gone(event.obj)
        else:
            ledger.pod_seen(event.obj)

    nodes_listed = False

    def on_claim(event: CacheEvent[ClaimRecord]) -> None:
        if event.type == "deleted":
            ledger.claim_gone(event.obj)
        else:
            ledger.claim_seen(event.obj)

    def on_gpus(event: object) -> None:
        ledger.resize_claims()

    def on_relist(kind: CachedKind) -> None:
        nonlocal nodes_listed
        if kind in ("resourceslice", "node"):
            ledger.resize_claims()
        if kind == "node" and not nodes_listed:
            nodes_listed = True
            ledger.size_again(cache.objects("pod").values())
        elif kind == "pod":
            ledger.resync(cache.objects("pod").values())
        elif kind == "resourceclaim":
            ledger.resync_claims(cache.objects("resourceclaim").values())
        elif kind == "namespace":
            listed = set(cache.objects("namespace"))
            for name in set(ledger.namespaces()) | set(gate.last_limits) | set(gate.book.namespaces()):
                if name not in listed:
                    gate.forget_namespace(name)
            gate.book.namespaces_listed(lambda name: cache.namespace_labels(name) is not None)

    def on_namespace(event: CacheEvent[NamespaceRecord]) -> None:
        name = (event.obj.get("metadata") or {}).get("name")
        if event.type == "deleted" and isinstance(name, str):
            gate.forget_namespace(name)

    def namespaces() -> Iterator[tuple[str, Mapping[str, str]]]:
        for name in cache.objects("namespace"):
            yield name, cache.namespace_labels(name) or {}

    cache.subscribe("pod", on_pod)
    cache.subscribe("resourceclaim", on_claim)
    if config.webhook.dra_device_classes:
        cache.subscribe("resourceslice", on_gpus)
        cache.subscribe("node", on_gpus)
    cache.subscribe("namespace", on_namespace)
    cache.subscribe_relist(on_relist)
    QuotaMetrics(gate, metrics.registry, namespaces=namespaces)
    return gate


class CacheValidationView:
    """The live cache as the validating phase reads it."""

    def __init__(self, cache: ClusterCache) -> None:
        self._cache = cache

    @property
    def inventory(self) -> Inventory:
        """The GPU nodes."""
        return self._cache.inventory

    def namespace_labels(self, namespace: str) -> Mapping[str, str] | None:
        """The namespace's labels, None when it is not cached."""
        return self._cache.namespace_labels(namespace)

    def fresh(self) -> bool:
        """Synced and heard from within the staleness bound."""
        return self._cache.ready()


def build_services(
    cache: ClusterCache,
    config: Config,
    metrics: WebhookMetrics,
    quota: QuotaGate,
    claims: ClaimQuotaGate | None = None,
) -> Services:
    """The handlers' dependencies, wired to a live cache and the quota step (`build_quota`)."""
    metrics.track_cache(cache)
    admission = Admission(config, cache)
    validation = Validation(
        config,
        CacheValidationView(cache),
        quota,
        claims,
        claim_objects=cache.claim,
        template_objects=cache.claim_template,
        largest_claim_gpu=cache.largest_claim_gpu_mib,
    )
    readiness = Readiness(synced=lambda: cache.synced, ready=cache.ready, wait_synced=cache.wait_synced)
    return Services(admission=admission, validation=validation, readiness=readiness, metrics=metrics)


class WebhookServer:
    """The running parts of one webhook process, startable and stoppable on the current event loop."""

    def __init__(
        self,
        options: Options,
        config: Config,
        *,
        kube: Kube | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.options = options
        self.config = config
        self.reloader = CertReloader(
            options.tls_cert_file,
            options.tls_key_file,
            poll_seconds=options.cert_poll_seconds,
            client_ca_file=options.client_ca_file,
        )
        self.kube = kube or Kube(
            load_api_client(options.kubeconfig, options.kube_context), component="webhook"
        )
        self.cache = ClusterCache(
            self.kube,
            names=config.resource_names,
            staleness_seconds=config.webhook.cache_staleness_seconds,
            clock=clock,
            claim_classes=frozenset(config.webhook.dra_device_classes),
        )
        self.metrics = WebhookMetrics()
        self.metrics.report_caller_protection(
            client_certificate=options.client_ca_file is not None, network_policy=options.network_policy
        )
        # Volcano's MIG geometry, read at start: what a `mig` pod's slot costs against quota.
        self.geometry: DeviceConfig = default_device_config()
        self.reservations: SharedReservations | None = None

        def shared(cache_state: Callable[[str], NamespaceSnapshot]) -> SharedBook:
            book = SharedReservations(
                self.kube,
                options.release_namespace,
                lifetime_seconds=config.webhook.cache_staleness_seconds,
                cache_state=cache_state,
                clock=clock,
            )
            SharedBookMetrics(lambda: dataclasses.asdict(book.stats), self.metrics.registry)
            self.reservations = book
            return book

        quota = build_quota(self.cache, config, self.metrics, shared, lambda: self.geometry, clock=clock)
        self.services = build_services(self.cache, config, self.metrics, quota, quota)
        self.app = AdmissionApp(self.services)
        self.metrics_server = MetricsServer(self._exposition, host=options.host, port=options.metrics_port)
        self.listener: Listener | None = None
        self._stopped = False
        self._reload_task: asyncio.Task[None] | None = None
        self.port = options.port

    async def start(self) -> None:
        """Listen (port 0 picks a free one, see `port`), start the cache and the certificate poller."""
        self.listener = Listener(
            self.app.handle,
            self.reloader.context,
            self.options.limits,
            host=self.options.host,
            port=self.options.port,
            refused=lambda outcome: self.metrics.reviews.labels(outcome).inc(),
        )
        await self.listener.start()
        self.port = self.listener.port
        self.metrics.track_connections(self.listener)
        await self.metrics_server.start()
        await self.cache.start()
        self.geometry = await load_mig_geometry(self.kube, self.config.node)
        self._reload_task = asyncio.create_task(self.reloader.run(), name="tls-reload")
        log.info(
            "event=webhook_started address=%s:%d metrics_port=%d",
            self.options.host,
            self.port,
            self.metrics_server.port,
        )
        log_caller_protection(self.options)

    async def _exposition(self) -> bytes:
        return self.metrics.exposition()

    async def stop(self) -> None:
        """Stop accepting, close idle keep-alive connections, let requests in flight finish, close
        every connection (aborting what is left when the shutdown timeout is up); then stop the cache.
        A second call does nothing."""
        if self._stopped:
            return
        self._stopped = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.shutdown_timeout_seconds
        listener = self.listener
        if listener is not None:
            # Idle keep-alive connections close now, busy ones after their answer (a review whose
            # body is still arriving gets its answer too), with `Connection: close`.
            log.info(
                "event=webhook_draining connections=%d in_flight=%d",
                len(listener.connections),
                listener.in_flight,
            )
            await listener.close(deadline)
        await self.metrics_server.stop()
        if self.reservations is not None:
            await self.reservations.close()
        if self._reload_task is not None:
            self._reload_task.cancel()
            await asyncio.gather(self._reload_task, return_exceptions=True)
            self._reload_task = None
        await self.cache.stop()
        self.kube.close()
        log.info("event=webhook_stopped")


def log_caller_protection(options: Options) -> None:
    """Say at start which protections keep forged reviews out, and warn plainly when none is on."""
    client_certificate = options.client_ca_file is not None
    if client_certificate or options.network_policy:
        log.info(
            "event=webhook_caller_protection client_certificate=%s network_policy=%s",
            "on" if client_certificate else "off",
            "on" if options.network_policy else "off",
        )
        return
    log.warning(
        "event=webhook_caller_protection client_certificate=off network_policy=off detail=%r",
        f"any pod that reaches port {options.port} can send forged reviews: book GPU quota in any "
        "namespace for about a minute per review, and read quota usage and the cluster's GPUs from "
        "the answers; set webhook.networkPolicy or webhook.clientAuth in the chart (docs/security.md)",
    )


async def load_mig_geometry(kube: Kube, node: NodeConfig) -> DeviceConfig:
    """Volcano's device ConfigMap (the one the node plugin and the scheduler read), or the shipped
    default when it is absent or unreadable; like the scheduler, the webhook reads it at start."""
    namespace, name = node.device_config_namespace, node.device_config_name
    try:
        found = await asyncio.to_thread(kube.get, "configmap", name, namespace=namespace)
        text = ((found or {}).get("data") or {}).get(DEVICE_CONFIG_KEY)
        if isinstance(text, str):
            geometry = parse_device_config(text)
            log.info("event=mig_geometry_loaded configmap=%s/%s", namespace, name)
            return geometry
        reason = "absent"
    except (KubeError, MigGeometryError) as exc:
        reason = str(exc)
    log.warning(
        "event=mig_geometry_default configmap=%s/%s reason=%r detail=%s",
        namespace,
        name,
        reason,
        "MIG quota charges use the shipped geometry",
    )
    return default_device_config()


async def serve(options: Options, config: Config, *, stop: asyncio.Event | None = None) -> int:
    """Run the webhook until SIGTERM/SIGINT (or `stop`); returns the exit code."""
    server = WebhookServer(options, config)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        try:
            await server.start()
            await stop.wait()
            log.info("event=webhook_stopping grace_s=%.0f", options.shutdown_timeout_seconds)
        finally:
            await server.stop()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    return 0
