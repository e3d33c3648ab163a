"""Ways out of the HAMi-core limits that a pod spec can ask for, refused at admission (SPEC §2.2 step 3).

Pure: a pod dict and the configuration in, the first escape found (or None) out. The node plugin hands
a vGPU container its limits through environment variables and bind mounts; a container that sets
those variables itself (or through an `envFrom` prefix), mounts over those paths (or, with a volume
the kubelet rewrites by swapping symlinks, above them), or reaches the plugin's host folders through
a hostPath volume could replace the limits or switch HAMi-core off. Which variables, and why each,
is `contract.container_env`. Every container of a vGPU pod is
checked, not just the ones that ask for a vGPU: with the NVIDIA runtime as the node's default, a
sidecar that sets `NVIDIA_VISIBLE_DEVICES=all` is handed every GPU of the node with no limits at all.

The in-container paths are fixed (`contract.container_paths`, which the node plugin mounts from);
the configured hook path is a HOST folder, so it only widens the hostPath check. Both are normalised
once per configuration (a small LRU cache keyed by the hook path itself, which never goes stale);
each mount path of a review is normalised once and tested against every protected path at once (a
set and a prefix tuple).
"""

from __future__ import annotations

import functools
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from kube_vgpu.contract.config import Config
from kube_vgpu.contract.container_env import (
    RESERVED_ENV,
    RESERVED_ENV_PREFIXES,
    reachable_by_prefix,
    reserved,
)
from kube_vgpu.contract.container_paths import (
    DEFAULT_LOCK_HOST_DIR,
    NVIDIA_DEVICE_LIST_ROOT,
    PLUGIN_CONTAINER_PATHS,
)

# The names tested inline per env entry (a set lookup and one prefix test); why each is refused is
# in `contract.container_env`.
_RESERVED_NAMES: Final = frozenset(RESERVED_ENV)
_RESERVED_PREFIXES: Final = tuple(RESERVED_ENV_PREFIXES)

# In-container paths no volume of a vGPU pod may cover: what the node plugin mounts for HAMi-core,
# and the NVIDIA runtime's device-list root (matched by plain prefix, as the runtime matches it).
PROTECTED_CONTAINER_PATHS: Final[tuple[str, ...]] = (*PLUGIN_CONTAINER_PATHS, NVIDIA_DEVICE_LIST_ROOT)
# Host folders the node plugin serves from, besides the configured hook path; and host folders that
# reach every file of the node (through /proc/<pid>/, or /sys) or the kubelet's device plugin sockets.
PLUGIN_HOST_PATHS: Final[tuple[str, ...]] = (
    DEFAULT_LOCK_HOST_DIR,
    "/var/lib/kubelet/device-plugins",
    "/proc",
    "/sys",
)


@dataclass(frozen=True)
class Escape:
    """One way out of the limits: what the pod wrote, and what to write instead."""

    what: str
    instead: str

    def message(self) -> str:
        """The denial text a user sees."""
        return f"{self.what}: {self.instead}"


def normalize(path: str) -> str:
    """An absolute, `..`-free, single-slash form of a mount path, as the runtime resolves it.

    `posixpath.normpath` keeps a leading `//` (POSIX lets it mean something else), which the
    container runtime does not: `//etc/ld.so.preload` is `/etc/ld.so.preload` to runc.
    """
    if path.startswith("/") and "//" not in path and "/." not in path and not path.endswith("/"):
        # Already absolute, single-slashed and free of `.`, `..` and a trailing slash (what nearly
        # every mount path is): normpath would hand it back unchanged.
        return path
    joined = posixpath.normpath("/" + path)
    return "/" + joined.lstrip("/")


def covers(mount: str, protected: str) -> bool:
    """Whether a mount at `mount` would replace `protected` or something inside it.

    A mount on a parent folder (`/tmp`, `/etc`) is harmless for volumes written in place: the
    plugin's own bind mounts are deeper and land on top of it (atomic-writer volumes are the
    exception, see `ATOMIC_WRITER_VOLUMES`). Segments are compared, so `/tmp/vgpufoo` is not `/tmp/vgpu`.
    """
    mount, protected = normalize(mount), normalize(protected)
    return mount == protected or mount.startswith(protected.rstrip("/") + "/")


def host_overlaps(host: str, folder: str) -> bool:
    """Whether a hostPath volume of `host` reaches `folder` (it is the folder, inside it, or above it)."""
    host, folder = normalize(host), normalize(folder)
    return covers(host, folder) or covers(folder, host)


_CONTAINER_GROUPS: Final = ("initContainers", "containers", "ephemeralContainers")


def grouped_containers(pod: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(group, container) for every init, app and ephemeral container, without naming each one: the
    `group[name]` text is only needed for a denial, and building it per container cost every review."""
    spec = pod.get("spec") or {}
    return [
        (key, container)
        for key in _CONTAINER_GROUPS
        for container in spec.get(key) or ()
        # Values come from JSON, so a mapping is a `dict` (a far cheaper check than the Mapping ABC).
        if isinstance(container, dict)
    ]


def _where(key: str, container: Mapping[str, Any]) -> str:
    return f"{key}[{container.get('name', '?')}]"


def _env_escape(key: str, container: Mapping[str, Any]) -> Escape | None:
    for entry in container.get("env") or ():
        name = entry.get("name") if isinstance(entry, dict) else None
        # Tested inline: a function call per env entry of every container cost more than the test.
        # A `valueFrom` entry is named like any other, so it is caught by its name too.
        if isinstance(name, str) and (name in _RESERVED_NAMES or name.startswith(_RESERVED_PREFIXES)):
            why = reserved(name)  # never None here: the test above is the same lists
            if why is not None:
                return Escape(
                    f"{_where(key, container)}: env {name} {why.why}", f"remove it from env; {why.instead}"
                )
    for entry in container.get("envFrom") or ():
        prefix = entry.get("prefix") if isinstance(entry, dict) else None
        reached = reachable_by_prefix(prefix) if isinstance(prefix, str) else None
        if reached is not None:
            return Escape(
                f"{_where(key, container)}: envFrom prefix {prefix!r} can produce {reached}, which a vGPU "
                "pod may not set",
                "use a prefix no reserved variable starts with (for example APP_)",
            )
    return None


@dataclass(frozen=True)
class _Protected:
    """A protected path as written (for messages), normalised once, and the prefix of what is inside it."""

    path: str
    normal: str
    inside: str

    def covered_by(self, mount: str) -> bool:
        """Whether a mount path, already normalised, is this path or inside it."""
        return mount == self.normal or mount.startswith(self.inside)


@dataclass(frozen=True)
class _Guards:
    """What one hook path protects, prepared once per configuration (see `_guards`)."""

    # The container paths as written, for messages, and normalised, for matching.
    written: tuple[str, ...]
    protected: tuple[_Protected, ...]
    # Every normal form, and every inside-prefix: a mount is tested against all paths at once.
    normals: frozenset[str]
    insides: tuple[str, ...]
    host_folders: tuple[str, ...]
    # The paths the node plugin bind-mounts, normalised: what an atomic-writer volume may not be
    # mounted above either (see `ATOMIC_WRITER_VOLUMES`).
    mounted: tuple[str, ...]


def _inside(path: str) -> str:
    """The prefix of what is inside `path`: by segment, except the NVIDIA runtime's root, which the
    runtime itself matches by plain prefix (`/var/run/nvidia-container-devicesX` counts too)."""
    normal = normalize(path)  # never ends in "/": none of the protected paths is "/" itself
    return normal if normal == NVIDIA_DEVICE_LIST_ROOT else normal + "/"


@functools.lru_cache(maxsize=16)
def _guards(hook: str) -> _Guards:
    """The paths protected under a hook path, normalised once per configuration (a handful of
    entries), not once per mount and path of every review. Keyed by the path itself, so never stale.

    The hook path is where HAMi-core lives on the HOST: it is refused as a hostPath, while the paths
    refused inside the container are the fixed ones the node plugin mounts, whatever the hook path.
    """
    written = PROTECTED_CONTAINER_PATHS
    protected = tuple(_Protected(p, normalize(p), _inside(p)) for p in written)
    return _Guards(
        written=written,
        protected=protected,
        normals=frozenset(p.normal for p in protected),
        insides=tuple(p.inside for p in protected),
        host_folders=(hook, *PLUGIN_HOST_PATHS),
        mounted=tuple(normalize(p) for p in PLUGIN_CONTAINER_PATHS),
    )


# Volume types the kubelet fills through its atomic writer (pkg/volume/util/atomic_writer.go): each
# file is a symlink through `..data`, which the kubelet swaps to a new timestamped folder on every
# update. A bind mount the node plugin lands on such a file is left behind on the old folder, and the
# path then shows the volume's new file: mounted on a parent of a protected path (`/etc` with an item
# `ld.so.preload`), the volume replaces what the plugin mounted there. Other volume types are written
# in place, and the plugin's deeper bind mounts stay on top of them.
ATOMIC_WRITER_VOLUMES: Final = ("configMap", "secret", "projected", "downwardAPI")


def atomic_writer_volumes(pod: Mapping[str, Any]) -> frozenset[str]:
    """The names of the pod's volumes the kubelet writes through its atomic writer."""
    return frozenset(
        volume["name"]
        for volume in (pod.get("spec") or {}).get("volumes") or ()
        if isinstance(volume, dict)
        and isinstance(volume.get("name"), str)
        and any(volume.get(kind) is not None for kind in ATOMIC_WRITER_VOLUMES)
    )


def _above(mount: str, mounted: tuple[str, ...]) -> str | None:
    """The first of `mounted` that lies strictly under the (normalised) `mount`, or None."""
    parent = mount if mount == "/" else mount + "/"
    return next((path for path in mounted if path.startswith(parent)), None)


def _mount_escape(
    key: str, container: Mapping[str, Any], guards: _Guards, swapped: frozenset[str] = frozenset()
) -> Escape | None:
    mounts = container.get("volumeMounts")
    devices = container.get("volumeDevices")
    if not mounts and not devices:
        return None
    normals, insides = guards.normals, guards.insides
    for field, path_key, entries in (
        ("volumeMounts", "mountPath", mounts),
        ("volumeDevices", "devicePath", devices),
    ):
        for entry in entries or ():
            path = entry.get(path_key) if isinstance(entry, dict) else None
            if not isinstance(path, str):
                continue
            mount = normalize(path)
            if mount in normals or mount.startswith(insides):
                return _mount_denial(key, container, guards, field=field, path=path, mount=mount)
            # else it covers no protected path (one set lookup and one prefix test, not one per path)
            if swapped and entry.get("name") in swapped:
                below = _above(mount, guards.mounted)
                if below is not None:
                    return Escape(
                        f"{_where(key, container)}: {field} path {path!r} of {entry.get('name')!r}, a "
                        f"volume the kubelet updates by swapping symlinks, lies above {below}, which the "
                        "node plugin mounts to enforce the vGPU limits (an update would replace it)",
                        "mount the volume at a folder that holds none of "
                        f"{', '.join(PLUGIN_CONTAINER_PATHS)} (for example /etc/app, not /etc)",
                    )
    return None


def _mount_denial(
    key: str, container: Mapping[str, Any], guards: _Guards, *, field: str, path: str, mount: str
) -> Escape:
    """The escape of a mount path that covers a protected path."""
    # One of them covers it (the test above says so); no default, so a broken invariant is a
    # loud internal error, which denies the pod, rather than a mount let through.
    hit = next(p.path for p in guards.protected if p.covered_by(mount))
    why = (
        "where the NVIDIA container runtime reads which GPUs to hand out (a mount there can "
        "ask for every GPU of the node)"
        if hit == NVIDIA_DEVICE_LIST_ROOT
        else "which the node plugin mounts to enforce the vGPU limits"
    )
    return Escape(
        f"{_where(key, container)}: {field} path {path!r} covers {hit}, {why}",
        f"mount the volume elsewhere (not at or under {', '.join(guards.written)})",
    )


def _host_path_escape(pod: Mapping[str, Any], folders: tuple[str, ...]) -> Escape | None:
    for volume in (pod.get("spec") or {}).get("volumes") or ():
        host = volume.get("hostPath") if isinstance(volume, dict) else None
        path = host.get("path") if isinstance(host, dict) else None
        if not isinstance(path, str):
            continue
        hit = next((f for f in folders if host_overlaps(path, f)), None)
        if hit is not None:
            return Escape(
                f"volume {volume.get('name', '?')!r}: hostPath {path!r} reaches {hit}, a node plugin's "
                "host folder or one that reaches it, where HAMi-core and every container's limits live",
                "use an emptyDir or another volume type instead",
            )
    return None


def find_escape(
    pod: Mapping[str, Any],
    config: Config,
    containers: list[tuple[str, dict[str, Any]]] | None = None,
) -> Escape | None:
    """The first way the pod would escape its vGPU limits, or None. `containers` is
    `grouped_containers(pod)` when the caller has it already (the pod's list is not built twice)."""
    guards = _guards(config.node.hook_path)
    swapped = atomic_writer_volumes(pod)
    for key, container in grouped_containers(pod) if containers is None else containers:
        escape = _env_escape(key, container) or _mount_escape(key, container, guards, swapped)
        if escape is not None:
            return escape
    return _host_path_escape(pod, guards.host_folders)
