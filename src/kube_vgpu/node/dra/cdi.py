"""CDI (Container Device Interface) spec files: kube-vgpu's one spec per claim, written atomically, and
the NVIDIA Container Toolkit's GPU devices, looked up by UUID or index.

The format follows tags.cncf.io/container-device-interface (`specs-go/config.go`: `cdiVersion`, `kind`,
`devices[].name`, `containerEdits.{env, mounts, deviceNodes}`), its name rules (`pkg/parser`) and its
producer's file naming (`pkg/cdi/producer/generate-names.go`: `<vendor>-<class>_<id>` for a transient
spec). A runtime reads every `*.json` / `*.yaml` file of its spec folders, so a spec is written to a
hidden temporary name (which no runtime reads), synced and renamed into place: it is never seen half
written.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NotRequired, TypedDict

import yaml

from kube_vgpu.contract.yamltext import safe_load, yaml_problem
from kube_vgpu.node.dra.limits import Edits

log = logging.getLogger("kube_vgpu.node.dra")

# 0.5.0 is what containerd 1.7's CDI library reads; env, mounts and device nodes need no later version.
CDI_VERSION: Final = "0.5.0"
CLAIM_KIND: Final = "vgpu.kube-vgpu.io/claim"
DEFAULT_GPU_KIND: Final = "nvidia.com/gpu"
# The mount options the NVIDIA Container Toolkit writes for the files it bind-mounts.
_RO: Final = ["ro", "nosuid", "nodev", "bind"]
_RW: Final = ["rw", "nosuid", "nodev", "bind"]
_TEMP_SUFFIX: Final = ".tmp"
# A spec file larger than this is not a GPU spec (nvidia-ctk's for 8 GPUs is tens of KiB).
MAX_SPEC_BYTES: Final = 4 * 1024 * 1024

# tags.cncf.io/container-device-interface/pkg/parser: vendor and class names, device names.
_VENDOR = re.compile(r"[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?")
_CLASS = re.compile(r"[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?")
_DEVICE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?")


class CdiError(Exception):
    """A spec that cannot be written or read, or a GPU with no CDI device; the message says which."""


class CdiMount(TypedDict):
    hostPath: str
    containerPath: str
    options: NotRequired[list[str]]


class CdiDeviceNode(TypedDict):
    path: str
    hostPath: NotRequired[str]


class ContainerEdits(TypedDict, total=False):
    env: list[str]
    mounts: list[CdiMount]
    deviceNodes: list[CdiDeviceNode]


class CdiDevice(TypedDict):
    name: str
    containerEdits: ContainerEdits


class Spec(TypedDict):
    cdiVersion: str
    kind: str
    devices: list[CdiDevice]
    containerEdits: NotRequired[ContainerEdits]


def split_kind(kind: str) -> tuple[str, str]:
    """(vendor, class) of a kind `vendor/class`; CdiError when it is not one."""
    vendor, sep, klass = kind.partition("/")
    if not sep or not _VENDOR.fullmatch(vendor) or not _CLASS.fullmatch(klass):
        raise CdiError(f"CDI kind {kind!r} is not vendor/class (letters, digits, '_', '-', '.')")
    return vendor, klass


def qualified(kind: str, name: str) -> str:
    """The CDI device ID a runtime is handed: `vendor/class=name`."""
    split_kind(kind)
    if not _DEVICE.fullmatch(name):
        raise CdiError(f"CDI device name {name!r} has characters CDI does not allow")
    return f"{kind}={name}"


def device_name(claim_uid: str, request: str) -> str:
    """kube-vgpu's CDI device for one request of one claim. The claim UID is never reused, so a
    runtime's cache never serves an older claim's limits; `/` (a `firstAvailable` sub-request) is not
    allowed in a CDI name and becomes `_`, which no request name contains."""
    return f"{claim_uid}_{request.replace('/', '_')}"


def own_spec_prefix(kind: str = CLAIM_KIND) -> str:
    """How the names of kube-vgpu's own claim spec files (`spec_file_name`) begin."""
    vendor, klass = split_kind(kind)
    return f"{vendor}-{klass}_"


def spec_file_name(claim_uid: str, kind: str = CLAIM_KIND) -> str:
    """The spec file of one claim, named as the CDI producer names a transient spec."""
    return f"{own_spec_prefix(kind)}{claim_uid}.json"


def _mount(host: str, container: str, read_only: bool) -> CdiMount:
    return {"hostPath": host, "containerPath": container, "options": list(_RO if read_only else _RW)}


def encode_spec(claim_uid: str, edits: Mapping[str, Edits], kind: str = CLAIM_KIND) -> Spec:
    """The spec of one claim: one device per request, carrying that request's limits and mounts."""
    return {
        "cdiVersion": CDI_VERSION,
        "kind": kind,
        "devices": [
            {
                "name": device_name(claim_uid, request),
                "containerEdits": {
                    "env": list(e.env),
                    "mounts": [_mount(m.host_path, m.container_path, m.read_only) for m in e.mounts],
                },
            }
            for request, e in edits.items()
        ],
    }


def parse_spec(data: object, where: str) -> Spec:
    """Check the shape a runtime requires of a spec document and return it typed; CdiError naming
    `where` and the field otherwise."""
    if not isinstance(data, Mapping):
        raise CdiError(f"{where}: a CDI spec is a mapping, got {type(data).__name__}")
    for key in ("cdiVersion", "kind"):
        if not isinstance(data.get(key), str):
            raise CdiError(f"{where}: {key} is missing or not a string")
    split_kind(data["kind"])
    devices = data.get("devices")
    if not isinstance(devices, list) or not devices:
        raise CdiError(f"{where}: devices is missing, empty or not a list")
    seen: set[str] = set()
    for i, device in enumerate(devices):
        if not isinstance(device, Mapping) or not isinstance(device.get("name"), str):
            raise CdiError(f"{where}: devices[{i}] has no name")
        if not _DEVICE.fullmatch(device["name"]):
            raise CdiError(f"{where}: devices[{i}] name {device['name']!r} has characters CDI does not allow")
        if device["name"] in seen:
            raise CdiError(f"{where}: device {device['name']!r} is defined twice")
        seen.add(device["name"])
        _check_edits(device.get("containerEdits"), f"{where}: device {device['name']!r}")
    if "containerEdits" in data:
        _check_edits(data["containerEdits"], f"{where}: containerEdits")
    return data  # type: ignore[return-value]


def _check_edits(edits: object, where: str) -> None:
    if not isinstance(edits, Mapping):
        raise CdiError(f"{where}: containerEdits is missing or not a mapping")
    env = edits.get("env", [])
    if not isinstance(env, list) or not all(isinstance(e, str) and e.find("=") > 0 for e in env):
        raise CdiError(f"{where}: env must be a list of NAME=VALUE")
    for mount in edits.get("mounts", []) or []:
        if not isinstance(mount, Mapping) or not mount.get("hostPath") or not mount.get("containerPath"):
            raise CdiError(f"{where}: a mount needs hostPath and containerPath")
    for node in edits.get("deviceNodes", []) or []:
        if not isinstance(node, Mapping) or not node.get("path"):
            raise CdiError(f"{where}: a device node needs a path")


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that a reader sees the old file or the whole new one, never a part:
    a hidden temporary file in the same folder, synced, renamed over `path`, the folder synced."""
    temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}{_TEMP_SUFFIX}")
    try:
        with open(temp, "xb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    _fsync_dir(path.parent)


class SpecDir:
    """kube-vgpu's claim specs in one CDI spec folder."""

    def __init__(self, folder: Path, kind: str = CLAIM_KIND) -> None:
        split_kind(kind)
        self.folder = folder
        self.kind = kind

    def path(self, claim_uid: str) -> Path:
        """Where a claim's spec lives."""
        return self.folder / spec_file_name(claim_uid, self.kind)

    def write(self, claim_uid: str, edits: Mapping[str, Edits]) -> Path:
        """Write (or rewrite, identically) a claim's spec."""
        self.folder.mkdir(parents=True, exist_ok=True)
        spec = encode_spec(claim_uid, edits, self.kind)
        parse_spec(spec, "spec being written")
        path = self.path(claim_uid)
        data = json.dumps(spec, indent=2, sort_keys=True).encode() + b"\n"
        # A repeated prepare finds its own spec, already durable: nothing to write.
        with contextlib.suppress(OSError):
            if path.read_bytes() == data:
                return path
        write_atomic(path, data)
        return path

    def remove(self, claim_uid: str) -> bool:
        """Remove a claim's spec; whether there was one."""
        try:
            os.unlink(self.path(claim_uid))
        except FileNotFoundError:
            return False
        _fsync_dir(self.folder)
        return True

    def claim_uids(self) -> set[str]:
        """The claims that have a spec here."""
        prefix, suffix = own_spec_prefix(self.kind), ".json"
        if not self.folder.is_dir():
            return set()
        return {
            p.name[len(prefix) : -len(suffix)]
            for p in self.folder.iterdir()
            if p.name.startswith(prefix) and p.name.endswith(suffix)
        }

    def remove_leftovers(self) -> list[Path]:
        """Remove temporary files a write cut short (a crash between write and rename) left behind."""
        vendor, klass = split_kind(self.kind)
        removed = []
        if self.folder.is_dir():
            for p in self.folder.iterdir():
                if p.name.startswith(f".{vendor}-{klass}_") and p.name.endswith(_TEMP_SUFFIX):
                    with contextlib.suppress(FileNotFoundError):
                        p.unlink()
                    removed.append(p)
        return removed


def read_spec_file(path: Path) -> Spec:
    """Read one spec file (JSON or YAML); CdiError naming the file when it cannot be used."""
    try:
        with open(path, "rb") as file:
            raw = file.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        raise CdiError(f"{path}: cannot read: {exc.strerror}") from None
    if len(raw) > MAX_SPEC_BYTES:
        raise CdiError(f"{path}: larger than {MAX_SPEC_BYTES} bytes")
    try:
        text = raw.decode()
        data: Any = json.loads(text) if path.suffix == ".json" else safe_load(text)
    except yaml.YAMLError as exc:
        raise CdiError(f"{path}: {yaml_problem(exc)}") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise CdiError(f"{path}: not valid {path.suffix[1:].upper()}: {exc}") from None
    return parse_spec(data, str(path))


def spec_files(folders: Iterable[Path], *, skip_prefix: str | None = None) -> list[Path]:
    """The spec files a runtime reads in `folders` (`*.json`, `*.yaml`), in name order per folder,
    leaving out those whose names begin with `skip_prefix`."""
    files: list[Path] = []
    for folder in folders:
        if folder.is_dir():
            files += sorted(
                p
                for p in folder.iterdir()
                if p.suffix in (".json", ".yaml")
                and not (skip_prefix and p.name.startswith(skip_prefix))
                and p.is_file()
            )
    return files


@dataclass(frozen=True)
class _Cached:
    stamp: tuple[int, int, int]
    names: frozenset[str]


class GpuDevices:
    """The GPUs' own CDI devices, from the specs of one kind (default `nvidia.com/gpu`, the NVIDIA
    Container Toolkit's) in the CDI folders. `nvidia-ctk cdi generate` names each GPU by index and by
    UUID unless `--device-name-strategy` picks one naming (`index`, `uuid`, or `type-index`: `gpu0`),
    so the names are read, not assumed. Files are re-read only when they change.

    kube-vgpu's own claim specs (kind `own_kind`) are not read: they usually share the folder
    (`/var/run/cdi`), one per prepared claim, and never hold a GPU's own device, so reading them
    would make every prepare cost more the more claims the node holds."""

    def __init__(
        self, folders: Sequence[Path], kind: str = DEFAULT_GPU_KIND, own_kind: str = CLAIM_KIND
    ) -> None:
        split_kind(kind)
        self.folders = tuple(folders)
        self.kind = kind
        self._skip = own_spec_prefix(own_kind)
        self._cache: dict[Path, _Cached] = {}

    def _names(self) -> tuple[set[str], list[str]]:
        names: set[str] = set()
        problems: list[str] = []
        files = spec_files(self.folders, skip_prefix=self._skip)
        for gone in set(self._cache) - set(files):
            del self._cache[gone]
        for path in files:
            try:
                st = path.stat()
            except OSError:
                continue
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            cached = self._cache.get(path)
            if cached is None or cached.stamp != stamp:
                try:
                    spec = read_spec_file(path)
                except CdiError as exc:
                    problems.append(str(exc))
                    continue
                found = (
                    frozenset(d["name"] for d in spec["devices"])
                    if spec["kind"] == self.kind
                    else frozenset()
                )
                cached = _Cached(stamp, found)
                self._cache[path] = cached
            names |= cached.names
        return names, problems

    def device_id(self, uuid: str, index: int) -> str:
        """The CDI device ID of one GPU: by its UUID when the spec names it so, else by its index."""
        names, problems = self._names()
        # nvidia-ctk's naming strategies (pkg/nvcdi, DeviceNamer): uuid, index, type-index (`gpu0`).
        for name in (uuid, str(index), f"gpu{index}"):
            if name in names:
                return qualified(self.kind, name)
        where = ", ".join(str(f) for f in self.folders)
        shown = ", ".join(sorted(names)[:8]) or "none"
        broken = f"; unreadable specs: {'; '.join(problems)}" if problems else ""
        raise CdiError(
            f"no CDI device of kind {self.kind} for GPU {uuid} (index {index}) in {where} (devices "
            f"found: {shown}){broken}; generate the GPUs' spec with `nvidia-ctk cdi generate` or set the "
            "GPU CDI kind"
        )
