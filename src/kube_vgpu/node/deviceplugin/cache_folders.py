"""HAMi-core's per-container host folders, `<hookPath>/vgpu/containers/<pod UID>_<container>`: made
at Allocate, removed once their pod has been gone from the node for a grace period.

Each hami-core container gets its own folder, mounted as HAMi-core's cache folder, where HAMi-core
creates the shared-region file named by CUDA_DEVICE_MEMORY_SHARED_CACHE. A pod's folders are kept
while the pod is bound to the node in any phase, and for `grace_seconds` after it is last seen
(a force-deleted pod's containers may still be exiting and mapping the file). A container owns
what is inside its folder and may put symlinks there: removal never follows one.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

# HAMi-core creates its files with open(path, O_RDWR | O_CREAT, 0666) after umask(0)
# (HAMi-core src/multiprocess/multiprocess_memory_limit.c for the shared cache, src/utils.c for
# /tmp/vgpulock/lock) as whatever user the container runs as: the image's USER, the pod's
# runAsUser, an arbitrary UID the platform assigns, or one an entrypoint switches to, none of
# which the plugin can know at Allocate. So any UID must be able to create a file in the folder
# (write and search for others). It opens the files by name and never lists them, so others get
# no read (listing) bit. No sticky bit: with fs.protected_regular set (systemd's default), an
# O_CREAT open of a file in a world-writable sticky folder fails unless the opener or the folder's
# owner owns the file (Linux Documentation/admin-guide/sysctl/fs.rst, protected_regular), so a
# second UID could not open the lock or cache file a first one created; and HAMi-core's first
# releases take the lock by creating it with O_EXCL and release it by removing it, a waiter
# removing a stale one (src/utils.c in its initial commit), which a sticky bit forbids across UIDs.
FOLDER_MODE = 0o733
# How long a folder outlives its pod's last sighting by default (the node plugin's setting).
DEFAULT_GRACE_SECONDS = 600.0

# `<pod UID>_<container name>`: a UID as the API writes it and a DNS-1123 label. Anything else in
# the folder is not ours and is left alone.
_FOLDER_NAME = re.compile(
    r"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})_[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
)


def make_folder(path: str) -> None:
    """Create `path` (and its parents) and give it FOLDER_MODE (an existing one is kept as it is)."""
    os.makedirs(path, exist_ok=True)
    os.chmod(path, FOLDER_MODE)


def pod_uid_of(name: str) -> str | None:
    """The pod UID a folder name carries, or None for a name not of the `<UID>_<container>` layout."""
    match = _FOLDER_NAME.fullmatch(name)
    return match.group(1) if match else None


@dataclass(frozen=True)
class SweepPlan:
    """What one sweep removes, and since when each absent pod has been missed."""

    remove: tuple[str, ...]
    gone_since: dict[str, float]


def plan_sweep(
    names: Iterable[str],
    live_uids: Collection[str],
    gone_since: Mapping[str, float],
    now: float,
    grace_seconds: float,
) -> SweepPlan:
    """Which folder names to remove now. A pod not in `live_uids` is missed from `now` on (or from
    when it was first missed); its folders go once it has been missed for `grace_seconds`. A pod
    seen again is forgotten, and so is one whose folders are all gone."""
    remove: list[str] = []
    missed: dict[str, float] = {}
    for name in sorted(names):
        uid = pod_uid_of(name)
        if uid is None or uid in live_uids:
            continue
        since = missed.setdefault(uid, gone_since.get(uid, now))
        if now - since >= grace_seconds:
            remove.append(name)
    return SweepPlan(tuple(remove), missed)


class CacheFolders:
    """The per-container folders under one hookPath; `sweep(live pod UIDs)` removes the stale ones.

    Blocking (file system calls): the plugin runs `sweep` in a thread.
    """

    def __init__(
        self,
        hook_path: str,
        node_name: str,
        *,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        on_removed: Callable[[], None] = lambda: None,
    ) -> None:
        self.root = os.path.join(hook_path, "vgpu", "containers")
        self._node = node_name
        self._grace = grace_seconds
        self._clock = clock
        self._on_removed = on_removed
        self._gone_since: dict[str, float] = {}

    def sweep(self, live_uids: Collection[str]) -> list[str]:
        """Remove the folders of pods missed for the grace period; returns the names removed."""
        try:
            with os.scandir(self.root) as listing:
                entries = {entry.name: entry for entry in listing}
        except FileNotFoundError:
            self._gone_since.clear()
            return []
        except OSError as exc:
            log.warning(
                "event=cache_folder_sweep_failed node=%s folder=%r error=%r", self._node, self.root, str(exc)
            )
            return []
        now = self._clock()
        plan = plan_sweep(entries, live_uids, self._gone_since, now, self._grace)
        self._gone_since = plan.gone_since
        removed: list[str] = []
        for name in plan.remove:
            entry = entries[name]
            try:
                _remove(entry)
            except OSError as exc:
                log.warning(
                    "event=cache_folder_remove_failed node=%s folder=%r error=%r",
                    self._node,
                    entry.path,
                    str(exc),
                )
                continue
            removed.append(name)
            self._on_removed()
            uid = pod_uid_of(name) or ""
            log.info(
                "event=cache_folder_removed node=%s pod_uid=%s folder=%r missed_seconds=%.0f",
                self._node,
                uid,
                entry.path,
                now - plan.gone_since[uid],
            )
        return removed


def _remove(entry: os.DirEntry[str]) -> None:
    """Remove one entry without following a symlink: a link is removed itself, never its target."""
    if entry.is_symlink() or not entry.is_dir(follow_symlinks=False):
        os.unlink(entry.path)
        return
    if not shutil.rmtree.avoids_symlink_attacks:
        # Only the fd-based rmtree (Linux) is safe against a container swapping a folder for a link
        # while it is removed; elsewhere the folder stays.
        raise OSError(f"not removed: this platform's rmtree can follow symlinks in {entry.path}")
    shutil.rmtree(entry.path)
