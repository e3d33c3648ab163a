"""A whole kube-vgpu installation on one machine: the product's real parts around local stand-ins.

Real: the webhook server (HTTPS, certificates minted here), one node plugin per simulated node (its
real code over the simulated NVML), the kube-vgpu codecs. Stand-ins, speaking the wire contracts
only: the Kubernetes API server, a kubelet per node (device-plugin gRPC over unix sockets), and
Volcano's vGPU allocation.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from kube_vgpu.certs.check import CA_CERT, TLS_CERT, TLS_KEY
from kube_vgpu.certs.files import write_material
from kube_vgpu.certs.issue import issue_ca, issue_serving
from kube_vgpu.contract.config import Config
from kube_vgpu.contract.dra import DEVICE_CLASS
from kube_vgpu.contract.mig.geometry import encode_device_config
from kube_vgpu.contract.mig.shipped import device_config_for
from kube_vgpu.contract.names import DEVICE_CONFIG_KEY, HOSTNAME_LABEL
from kube_vgpu.demo.dra import DraNode
from kube_vgpu.demo.examples import NamespaceSpec, NodeSpec
from kube_vgpu.kubeapi.client import Kube
from kube_vgpu.kubeapi.permissions import Component
from kube_vgpu.node.plugin import NodePlugin, PluginSettings
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.standins.hamicore import install_placeholder
from kube_vgpu.standins.kubelet.admission import KubeletAdmission
from kube_vgpu.standins.kubelet.deviceplugin import KubeletStandin
from kube_vgpu.standins.nvml.api import load_simulation
from kube_vgpu.standins.volcano.config import volcano_from_cluster
from kube_vgpu.standins.volcano.scheduler import VolcanoStandin
from kube_vgpu.webhook.service import Options, WebhookServer

log = logging.getLogger("kube_vgpu.demo")


T = TypeVar("T")


class DemoError(RuntimeError):
    """The local installation did not come up; the message says which part."""


async def finish(awaitable: Awaitable[T]) -> T:
    """Await `awaitable` to its end even when the caller is cancelled meanwhile (Ctrl-C), then
    re-raise that cancellation.

    A part cancelled half way through its start or its stop is left running where nothing stops it:
    a gRPC server whose start was cut short is shut down later by its finalizer, on a loop that is
    closing (grpc's `InvalidStateError`), and watch threads of a half-stopped webhook hold
    `asyncio.run`'s final cancellation for ever.
    """
    task = asyncio.ensure_future(awaitable)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.cancelled():
                raise
            cancelled = True  # the caller's: wait for the task all the same
    if cancelled:
        raise asyncio.CancelledError
    return result


@dataclass
class SimulatedNode:
    """One node: its plugin, its kubelet stand-in (device manager and pod admission)."""

    spec: NodeSpec
    kubelet: KubeletStandin
    plugin: NodePlugin
    nvml: Any
    kube: Kube
    admission: KubeletAdmission


@dataclass
class LocalCluster:
    """Everything `up()` started, for `down()` to stop in reverse order."""

    workdir: Path
    config: Config
    apiserver: ApiServerStandin = field(default_factory=ApiServerStandin)
    nodes: dict[str, SimulatedNode] = field(default_factory=dict)
    webhook: WebhookServer | None = None
    volcano: VolcanoStandin | None = None
    # The DRA node group's one node (`demo.dra`), beside the Volcano nodes.
    dra: DraNode | None = None
    ca_pem: bytes = b""
    _kubes: list[Kube] = field(default_factory=list)
    # What `down()` undoes, the last started first: each stop is pushed before its start, so a part
    # whose start failed or was interrupted is stopped too.
    _teardown: contextlib.AsyncExitStack = field(default_factory=contextlib.AsyncExitStack)

    async def _start(self, start: Awaitable[None], stop: Callable[[], Awaitable[None]]) -> None:
        self._teardown.push_async_callback(stop)
        await finish(start)

    def kube(self, component: Component) -> Kube:
        """A fresh API client for one component, as each process in a cluster has its own, held to
        the calls `kubeapi.permissions` declares for it (what its RBAC would allow)."""
        client = Kube(self.apiserver.api_client(), component=component)
        self._kubes.append(client)
        return client

    def outside_kube(self) -> Kube:
        """A client for what is not one of kube-vgpu's components (the scheduler stand-in, a user
        running `kube-vgpu top`): not held to our components' RBAC."""
        client = Kube(self.apiserver.api_client())
        self._kubes.append(client)
        return client

    async def up(self, nodes: Sequence[NodeSpec], namespaces: Sequence[NamespaceSpec]) -> None:
        """Start the API server, seed it, start the node plugins, the webhook and Volcano."""
        await self._start(self.apiserver.start_async(), self.apiserver.stop_async)
        # Pushed after the API server's stop, so run before it: the clients of every part close last.
        self._teardown.push_async_callback(self._close_clients)
        for ns in namespaces:
            self.apiserver.put(
                {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": ns.name, "labels": dict(ns.labels)},
                }
            )
        # Volcano's device ConfigMap names the resources of kube-vgpu's config, as the chart writes
        # it (volcanoDeviceConfig.create); the Volcano stand-in reads its names from it, as Volcano does.
        self.apiserver.put(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": self.config.node.device_config_name,
                    "namespace": self.config.node.device_config_namespace,
                },
                "data": {
                    DEVICE_CONFIG_KEY: encode_device_config(device_config_for(self.config.resource_names))
                },
            }
        )
        for spec in nodes:
            await self._start_node(spec)
        await self._start_webhook()
        # A blocking client call: off the loop, which serves the API server stand-in.
        self.volcano = await finish(
            asyncio.to_thread(
                volcano_from_cluster,
                self.outside_kube(),
                namespace=self.config.node.device_config_namespace,
                name=self.config.node.device_config_name,
                scheduler_name=self.config.webhook.scheduler_name,
            )
        )
        await self._wait_inventory()

    async def _start_node(self, spec: NodeSpec) -> None:
        self.apiserver.put(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": spec.name, "labels": {HOSTNAME_LABEL: spec.name}},
                "status": {
                    "capacity": {"cpu": "32", "memory": "256Gi"},
                    "allocatable": {"cpu": "32", "memory": "256Gi"},
                },
            }
        )
        kubelet_dir = self.workdir / "kubelet" / spec.name
        kubelet = KubeletStandin(kubelet_dir)
        await self._start(kubelet.start(), kubelet.stop)
        nvml = load_simulation(dict(spec.simulation), spec.name)
        nvml.nvmlInit()

        async def shutdown_nvml() -> None:
            with contextlib.suppress(Exception):
                nvml.nvmlShutdown()

        self._teardown.push_async_callback(shutdown_nvml)
        # What the chart's HAMi-core installer leaves on a node (stand-in files: nothing runs CUDA here).
        install_placeholder(Path(self.config.node.hook_path))
        settings = PluginSettings(
            node_name=spec.name,
            mode=spec.mode,
            kubelet_dir=kubelet_dir,
            config=self.config,
            lock_dir=str(self.workdir / "vgpulock"),
            metrics_port=0,
            # The XID wait blocks a thread until it times out; short waits make Ctrl-C quick.
            xid_wait_ms=250,
        )
        kube = self.kube("node")
        plugin = NodePlugin(settings, nvml, kube)
        admission = KubeletAdmission(kubelet, self.apiserver, spec.name, plugin.resource_name)
        node = self.nodes[spec.name] = SimulatedNode(spec, kubelet, plugin, nvml, kube, admission)
        await self._start(plugin.start(), plugin.stop)
        await self._start(admission.start(), admission.stop)
        async with asyncio.timeout(10):
            endpoint = await kubelet.wait_registered(plugin.resource_name)
        await kubelet.wait_devices(plugin.resource_name, bool)
        self._sync_allocatable(node, len([d for d in endpoint.devices if d.health == "Healthy"]))

    def _sync_allocatable(self, node: SimulatedNode, healthy_devices: int) -> None:
        """What the kubelet does with node status: capacity into allocatable, plus device-plugin counts."""
        stored = self.apiserver.get("Node", node.spec.name)
        if stored is None:
            raise DemoError(f"node {node.spec.name} vanished from the API server")
        capacity = dict((stored.get("status") or {}).get("capacity") or {})
        capacity[node.plugin.resource_name] = str(healthy_devices)
        self.apiserver.patch(
            "Node",
            node.spec.name,
            {"status": {"capacity": capacity, "allocatable": capacity}},
            patch_type="merge",
        )

    async def _start_webhook(self) -> None:
        ca = issue_ca("kube-vgpu demo CA", 1)
        serving = issue_serving(ca, ["localhost"], ["127.0.0.1"], 1)
        tls = self.workdir / "tls"
        write_material(tls, {CA_CERT: ca.cert_pem, TLS_CERT: serving.cert_pem, TLS_KEY: serving.key_pem})
        self.ca_pem = ca.cert_pem
        options = Options(
            tls_cert_file=tls / TLS_CERT, tls_key_file=tls / TLS_KEY, port=0, host="127.0.0.1", metrics_port=0
        )
        self.webhook = WebhookServer(options, self.config, kube=self.kube("webhook"))
        await self._start(self.webhook.start(), self.webhook.stop)
        async with asyncio.timeout(15):
            await self.webhook.cache.wait_synced()

    async def _wait_inventory(self, within: float = 15.0) -> None:
        """Until the webhook's cache knows every node's GPUs, as published by the node plugins."""
        assert self.webhook is not None
        deadline = time.monotonic() + within
        while set(self.webhook.cache.inventory.nodes) != set(self.nodes):
            if time.monotonic() > deadline:
                raise DemoError(
                    f"webhook inventory holds {sorted(self.webhook.cache.inventory.nodes)}, "
                    f"expected {sorted(self.nodes)}: node plugins did not publish"
                )
            await asyncio.sleep(0.05)

    async def down(self) -> None:
        """Stop everything that `up()` started (or began to start), the last started first, and the
        DRA node before the rest; a cancellation meanwhile (Ctrl-C) is raised once all of it has
        stopped."""
        try:
            if self.dra is not None:
                await finish(self.dra.stop())
        finally:
            await finish(self._teardown.aclose())

    async def _close_clients(self) -> None:
        for client in self._kubes:
            if client is not (self.webhook.kube if self.webhook else None):  # the webhook closes its own
                client.close()


def demo_config(base: Config, workdir: Path, *, dra: bool = False) -> Config:
    """`base` with host paths moved under `workdir`, so the demo writes nothing outside it; with
    `dra`, the webhook judges the claims of the DRA node group's DeviceClass unless `base` names its
    classes (as the chart configures it with `dra.enabled`)."""
    # The plugin lists its pods every register interval; a short one lets the usage metrics find
    # the demo's containers within a second.
    node = dataclasses.replace(
        base.node, hook_path=str(workdir / "vgpu-hook"), metrics_port=0, register_interval_seconds=1.0
    )
    webhook = base.webhook
    if dra and not webhook.dra_device_classes:
        webhook = dataclasses.replace(webhook, dra_device_classes=(DEVICE_CLASS,))
    return dataclasses.replace(base, node=node, webhook=webhook)
