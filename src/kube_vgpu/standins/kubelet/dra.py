"""A stand-in for the kubelet's DRA side: the plugin watcher's registration, the DRA manager's
NodePrepareResources / NodeUnprepareResources calls, and the CDI edits a container runtime applies.

Written from Kubernetes' pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go (the service chosen is the
first of the plugin's `supported_versions` the kubelet serves; a registration naming none, or an
endpoint already registered, is refused and the plugin told so through NotifyRegistrationStatus),
pkg/kubelet/cm/dra/manager.go (a response that leaves out a claim, names an unknown one or carries an
error fails the pod's preparation; a container gets the CDI IDs of the devices of the requests it
uses, a device naming no request serving all of them), and tags.cncf.io/container-device-interface
pkg/cdi (cache.go: spec files of later folders win, two of one folder defining a device make it
unresolvable; container-edits.go: a spec's own edits once per spec used, then each device's, env by
name, mounts and device nodes by path, mounts sorted by depth).
"""

from __future__ import annotations

import json
import posixpath
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml
from grpc import aio

from kube_vgpu.proto import dra_v1_pb2 as v1
from kube_vgpu.proto import dra_v1_pb2_grpc as v1_grpc
from kube_vgpu.proto import dra_v1beta1_pb2 as v1beta1
from kube_vgpu.proto import dra_v1beta1_pb2_grpc as v1beta1_grpc
from kube_vgpu.proto import pluginregistration_v1_pb2 as reg
from kube_vgpu.proto import pluginregistration_v1_pb2_grpc as reg_grpc

# servicesSupportedByKubelet (pkg/kubelet/cm/dra/plugin), newest first.
SERVICES_SUPPORTED_BY_KUBELET: Final = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
DRA_PLUGIN_TYPE: Final = "DRAPlugin"
# defaultClientCallTimeout of the kubelet's DRA plugin client.
CALL_TIMEOUT_SECONDS: Final = 45.0


class DraError(Exception):
    """What the kubelet would report for a pod: a refused registration, a failed prepare."""


@dataclass
class RegisteredPlugin:
    """One DRA plugin as the kubelet knows it."""

    driver: str
    endpoint: str
    service: str
    channel: aio.Channel


@dataclass(frozen=True)
class ClaimId:
    """A claim as the kubelet sends it."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class PreparedDevice:
    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None  # v1 only


def choose_service(supported: Sequence[str], kubelet: Sequence[str] = SERVICES_SUPPORTED_BY_KUBELET) -> str:
    """The kubelet's pick among a plugin's services (validateSupportedServices): the first of the
    plugin's list that the kubelet serves."""
    if not supported:
        raise DraError("empty list of supported gRPC services (aka supported versions)")
    for service in supported:
        if service in kubelet:
            return service
    raise DraError(
        f"none of services supported by the plugin ({list(supported)}) are supported by the kubelet "
        f"({list(kubelet)})"
    )


@dataclass
class DraKubelet:
    """The kubelet's DRA side for tests, benchmarks and the demo."""

    root_dir: Path
    # The services this kubelet serves (an older kubelet knows only v1beta1).
    services: tuple[str, ...] = SERVICES_SUPPORTED_BY_KUBELET
    plugins: dict[str, list[RegisteredPlugin]] = field(default_factory=dict)
    # Every NotifyRegistrationStatus sent: (socket, registered, error).
    notified: list[tuple[str, bool, str]] = field(default_factory=list)

    @property
    def registry(self) -> Path:
        return self.root_dir / "plugins_registry"

    async def register_all(self) -> list[RegisteredPlugin]:
        """Register every plugin socket now in plugins_registry (the plugin watcher skips hidden files
        and anything that is not a socket); returns the ones newly registered."""
        added = []
        for path in sorted(self.registry.iterdir()) if self.registry.is_dir() else []:
            if path.name.startswith(".") or not stat.S_ISSOCK(path.lstat().st_mode):
                continue
            plugin = await self.register(path)
            if plugin is not None:
                added.append(plugin)
        return added

    async def register(self, socket: Path) -> RegisteredPlugin | None:
        """GetInfo, validate, register, notify: the plugin watcher's steps for one socket."""
        async with aio.insecure_channel(f"unix:{socket}") as channel:
            stub = reg_grpc.RegistrationStub(channel)
            info = await stub.GetInfo(reg.InfoRequest(), timeout=10)
            try:
                if info.type != DRA_PLUGIN_TYPE:
                    raise DraError(f"no handler registered for plugin type: {info.type}")
                service = choose_service(list(info.supported_versions), self.services)
                if any(p.endpoint == info.endpoint for p in self.plugins.get(info.name, [])):
                    raise DraError(
                        f"endpoint {info.endpoint} already registered for DRA driver plugin {info.name}"
                    )
            except DraError as exc:
                await stub.NotifyRegistrationStatus(
                    reg.RegistrationStatus(plugin_registered=False, error=str(exc)), timeout=10
                )
                self.notified.append((str(socket), False, str(exc)))
                return None
            plugin = RegisteredPlugin(
                info.name, info.endpoint, service, aio.insecure_channel(f"unix:{info.endpoint}")
            )
            self.plugins.setdefault(info.name, []).append(plugin)
            await stub.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=True), timeout=10)
            self.notified.append((str(socket), True, ""))
            return plugin

    def plugin(self, driver: str) -> RegisteredPlugin:
        """The most recently registered plugin of a driver (the kubelet's heuristic)."""
        plugins = self.plugins.get(driver)
        if not plugins:
            raise DraError(f"DRA driver {driver} is not registered")
        return plugins[-1]

    async def prepare(self, driver: str, claims: Sequence[ClaimId]) -> dict[str, list[PreparedDevice]]:
        """NodePrepareResources for claims of one driver, checked as the DRA manager checks it."""
        plugin = self.plugin(driver)
        request_claims = [(c.namespace, c.uid, c.name) for c in claims]
        if plugin.service == "v1.DRAPlugin":
            v1_response = await v1_grpc.DRAPluginStub(plugin.channel).NodePrepareResources(
                v1.NodePrepareResourcesRequest(
                    claims=[v1.Claim(namespace=n, uid=u, name=m) for n, u, m in request_claims]
                ),
                timeout=CALL_TIMEOUT_SECONDS,
            )
            entries: Mapping[str, Any] = v1_response.claims
        else:
            beta_response = await v1beta1_grpc.DRAPluginStub(plugin.channel).NodePrepareResources(
                v1beta1.NodePrepareResourcesRequest(
                    claims=[v1beta1.Claim(namespace=n, uid=u, name=m) for n, u, m in request_claims]
                ),
                timeout=CALL_TIMEOUT_SECONDS,
            )
            entries = beta_response.claims
        names = {c.uid: c.name for c in claims}
        out: dict[str, list[PreparedDevice]] = {}
        for uid, result in entries.items():
            if uid not in names:
                raise DraError(f"NodePrepareResources returned result for unknown claim UID {uid}")
            if result.error:
                raise DraError(f"NodePrepareResources failed for ResourceClaim {names[uid]}: {result.error}")
            out[uid] = [
                PreparedDevice(
                    tuple(d.request_names),
                    d.pool_name,
                    d.device_name,
                    tuple(d.cdi_device_ids),
                    d.share_id if isinstance(d, v1.Device) and d.HasField("share_id") else None,
                )
                for d in result.devices
            ]
        if len(claims) != len(entries):
            raise DraError(f"NodePrepareResources skipped {len(claims) - len(entries)} ResourceClaims")
        return out

    async def unprepare(self, driver: str, claims: Sequence[ClaimId]) -> None:
        """NodeUnprepareResources, failing as the DRA manager does on an error or a missing entry."""
        plugin = self.plugin(driver)
        if plugin.service == "v1.DRAPlugin":
            response: Any = await v1_grpc.DRAPluginStub(plugin.channel).NodeUnprepareResources(
                v1.NodeUnprepareResourcesRequest(
                    claims=[v1.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]
                ),
                timeout=CALL_TIMEOUT_SECONDS,
            )
        else:
            response = await v1beta1_grpc.DRAPluginStub(plugin.channel).NodeUnprepareResources(
                v1beta1.NodeUnprepareResourcesRequest(
                    claims=[v1beta1.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]
                ),
                timeout=CALL_TIMEOUT_SECONDS,
            )
        names = {c.uid: c.name for c in claims}
        for uid, result in response.claims.items():
            if uid not in names:
                raise DraError(f"NodeUnprepareResources returned result for unknown claim UID {uid}")
            if result.error:
                raise DraError(
                    f"NodeUnprepareResources failed for ResourceClaim {names[uid]}: {result.error}"
                )
        if len(claims) != len(response.claims):
            raise DraError(
                f"NodeUnprepareResources skipped {len(claims) - len(response.claims)} ResourceClaims"
            )

    async def close(self) -> None:
        """Close every plugin connection."""
        for plugins in self.plugins.values():
            for plugin in plugins:
                await plugin.channel.close(None)
        self.plugins.clear()


def cdi_ids_for(devices: Sequence[PreparedDevice], request: str) -> list[str]:
    """The CDI IDs a container using `request` of the claim gets (ClaimInfo.cdiDevicesAsList)."""
    return [i for d in devices if not d.request_names or request in d.request_names for i in d.cdi_device_ids]


@dataclass
class ContainerConfig:
    """The parts of an OCI runtime spec CDI edits: env, mounts (in order), device nodes."""

    env: list[str] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)
    device_nodes: list[dict[str, Any]] = field(default_factory=list)

    @property
    def env_map(self) -> dict[str, str]:
        return dict(e.split("=", 1) for e in self.env)

    def mount_at(self, container_path: str) -> dict[str, Any] | None:
        return next((m for m in self.mounts if m["containerPath"] == container_path), None)


def _load(path: Path) -> dict[str, Any]:
    text = path.read_text()
    data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("kind"), str)
        or not isinstance(data.get("devices"), list)
    ):
        raise DraError(f"failed to load CDI Spec {path}")
    return data


def resolve(cdi_dirs: Sequence[Path], device_ids: Sequence[str]) -> ContainerConfig:
    """Apply the CDI devices `device_ids` to an empty container as a CDI-enabled runtime does; DraError
    naming the devices it cannot resolve (`unresolvable CDI devices ...`)."""
    devices: dict[str, tuple[int, Path, dict[str, Any], dict[str, Any]]] = {}
    conflicts: set[str] = set()
    for priority, folder in enumerate(cdi_dirs):
        files = (
            sorted(p for p in folder.iterdir() if p.suffix in (".json", ".yaml")) if folder.is_dir() else []
        )
        for path in files:
            try:
                spec = _load(path)
            except (DraError, ValueError, yaml.YAMLError, OSError):
                continue  # the CDI cache records the error and skips the file
            for device in spec["devices"]:
                name = f"{spec['kind']}={device['name']}"
                old = devices.get(name)
                if old is not None and old[0] == priority:
                    conflicts.add(name)
                    continue
                devices[name] = (priority, path, spec, device)
    for name in conflicts:
        devices.pop(name, None)
    unresolved = [d for d in device_ids if d not in devices]
    if unresolved:
        raise DraError(f"unresolvable CDI devices {', '.join(unresolved)}")
    edits: list[dict[str, Any]] = []
    seen_specs: set[Path] = set()
    for device_id in device_ids:
        _, path, spec, device = devices[device_id]
        if path not in seen_specs:
            seen_specs.add(path)
            edits.append(spec.get("containerEdits") or {})
        edits.append(device.get("containerEdits") or {})
    config = ContainerConfig()
    for edit in edits:
        for env in edit.get("env") or []:
            # runtime-tools' AddMultipleProcessEnv: a variable already set is replaced where it is.
            key = env.split("=", 1)[0]
            at = next((i for i, e in enumerate(config.env) if e.split("=", 1)[0] == key), None)
            if at is None:
                config.env.append(env)
            else:
                config.env[at] = env
        for node in edit.get("deviceNodes") or []:
            config.device_nodes = [n for n in config.device_nodes if n["path"] != node["path"]] + [node]
        if edit.get("mounts"):
            for mount in edit["mounts"]:
                config.mounts = [m for m in config.mounts if m["containerPath"] != mount["containerPath"]]
                config.mounts.append(mount)
            config.mounts.sort(key=lambda m: posixpath.normpath(m["containerPath"]).count("/"))
    return config
