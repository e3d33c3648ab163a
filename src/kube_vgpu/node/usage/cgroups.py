"""Which pod and container a process belongs to, read from its `/proc/<pid>/cgroup` text.

The kubelet names a pod's cgroup after its UID and the runtime names the container's after its ID,
so the text holds both, in one of these shapes (cgroup v1 lines `N:controllers:/path`, v2 `0::/path`):

- systemd driver: `.../kubepods-burstable-pod<uid with _>.slice/cri-containerd-<id>.scope`
  (`docker-<id>.scope`, `crio-<id>.scope`)
- cgroupfs driver: `.../kubepods/burstable/pod<uid with ->/<id>` (CRI-O: `crio-<id>`)

Paths may be relative to the reader's cgroup namespace (`/../../kubepods...`); only the segments
matter. The text comes from another process and may be anything, so the parse is bounded and never
raises. Pure: text in, identifiers out; `read_proc_cgroup` is the one reader of the real file.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# Enough for every controller line of a real process (a v1 host has about a dozen lines of ~200
# characters); anything longer is not a cgroup file and only its start is looked at.
MAX_CGROUP_TEXT = 16 * 1024
_MAX_LINES = 64
_UUID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
_POD_SEGMENT = re.compile(rf"(?:kubepods-(?:besteffort-|burstable-)?)?pod({_UUID})(?:\.slice)?")
# Container runtimes' scope prefixes; `crio-conmon-<id>` (CRI-O's monitor) does not match.
_RUNTIME_PREFIXES = ("cri-containerd-", "docker-", "crio-")
_CONTAINER_ID = re.compile(r"[0-9a-f]{64}")

# Reads a process's cgroup text; None when the process is gone or unreadable.
CgroupReader = Callable[[int], str | None]


@dataclass(frozen=True)
class CgroupIds:
    """A process's pod UID (with `-`, as the API writes it) and its container ID."""

    pod_uid: str
    container_id: str


def _container_id(segment: str) -> str | None:
    name = segment.removesuffix(".scope")
    for prefix in _RUNTIME_PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    return name if _CONTAINER_ID.fullmatch(name) else None


def _ids_in_path(path: str) -> CgroupIds | None:
    segments = path.split("/")
    for position, segment in enumerate(segments):
        pod = _POD_SEGMENT.fullmatch(segment)
        if pod is None:
            continue
        # The container's cgroup is the pod's direct child.
        if position + 1 < len(segments):
            container = _container_id(segments[position + 1])
            if container is not None:
                return CgroupIds(pod.group(1).replace("_", "-"), container)
        return None
    return None


def parse_cgroup(text: str) -> CgroupIds | None:
    """The pod UID and container ID in a cgroup text, or None when it names no pod container."""
    for line in text[:MAX_CGROUP_TEXT].splitlines()[:_MAX_LINES]:
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        found = _ids_in_path(fields[2].strip().lower())
        if found is not None:
            return found
    return None


def read_proc_cgroup(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The cgroup text of a host process (the DaemonSet runs with hostPID, so its PIDs are NVML's)."""
    try:
        with (proc / str(int(pid)) / "cgroup").open("rb") as file:
            return file.read(MAX_CGROUP_TEXT).decode("utf-8", "replace")
    except (OSError, ValueError):
        return None
