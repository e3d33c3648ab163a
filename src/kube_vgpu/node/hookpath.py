"""HAMi-core's files in the node's `hookPath`: whether they can serve a container, and the watch that
keeps the plugin's hami-core offer in step with them.

A hami-core container gets `<hookPath>/libvgpu.so` and `<hookPath>/ld.so.preload` bind-mounted by
Allocate; without them the container either fails on a missing mount source or, worse, starts with
no memory or core limit at all. `inspect_hook_path` reads the two files (read-only, the same check
`kube-vgpu node check` reports); `HookPathWatch` repeats it and reports every change.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass

from kube_vgpu.contract.container_paths import LIBRARY_IN_CONTAINER

log = logging.getLogger("kube_vgpu.node.hookpath")

LIBRARY = "libvgpu.so"
PRELOAD = "ld.so.preload"
# The chart value that installs HAMi-core into hookPath on every node (an initContainer).
INSTALLER_VALUE = "node.hamiCoreInstaller.enabled"
# What a shared library starts with; an empty or truncated copy is ignored by ld.so with a warning
# on stderr, and the container then runs without limits.
_ELF_MAGIC = b"\x7fELF"
# ld.so.preload is a short list of paths; reading more than this says nothing more.
_PRELOAD_READ_LIMIT = 64 * 1024


@dataclass(frozen=True)
class HookFile:
    """One of HAMi-core's files as found on the node."""

    name: str
    path: str
    present: bool
    size: int | None  # bytes; None when absent or not a regular file
    readable: bool  # every user can read it (containers run as any user), and it reads back
    problem: str | None  # why a container could not use it; None when it can

    def to_json(self) -> dict[str, object]:
        """Plain data for `node check -o json`."""
        return {
            "name": self.name,
            "path": self.path,
            "present": self.present,
            "size": self.size,
            "readable": self.readable,
            "problem": self.problem,
        }


@dataclass(frozen=True)
class HookPathState:
    """HAMi-core's files in one folder."""

    folder: str
    files: tuple[HookFile, ...]

    @property
    def ready(self) -> bool:
        """Both files can serve a container."""
        return all(f.problem is None for f in self.files)

    @property
    def problem(self) -> str | None:
        """One line naming what is wrong, or None when ready."""
        problems = [f"{f.path}: {f.problem}" for f in self.files if f.problem is not None]
        return "; ".join(problems) if problems else None


def _inspect_file(folder: str, name: str, check_content: Callable[[bytes], str | None]) -> HookFile:
    path = os.path.join(folder, name)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return HookFile(name, path, False, None, False, "missing")
    except OSError as exc:
        return HookFile(name, path, False, None, False, f"cannot be examined: {exc.strerror or exc}")
    if not stat.S_ISREG(info.st_mode):
        return HookFile(name, path, True, None, False, "not a regular file")
    size = info.st_size
    if not info.st_mode & stat.S_IROTH:
        # The plugin runs as root and could read it; the container's user (any uid) could not.
        mode = stat.S_IMODE(info.st_mode)
        return HookFile(name, path, True, size, False, f"not readable by every user (mode {mode:04o})")
    try:
        # O_NONBLOCK: a file swapped for a FIFO after the stat above must not block the check; what
        # was opened is checked again, since the stat and the open are not one step.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
        with open(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return HookFile(name, path, True, size, False, "not a regular file")
            head = handle.read(_PRELOAD_READ_LIMIT)
    except OSError as exc:
        return HookFile(name, path, True, size, False, f"cannot be read: {exc.strerror or exc}")
    return HookFile(name, path, True, size, True, check_content(head))


def _library_content(head: bytes) -> str | None:
    if not head.startswith(_ELF_MAGIC):
        return "not a shared library (no ELF header)" if head else "empty"
    return None


def _preload_content(head: bytes) -> str | None:
    # ld.so reads the file as paths separated by white space or colons (ld.so(8)).
    entries = head.decode("utf-8", "replace").replace(":", " ").split()
    if LIBRARY_IN_CONTAINER not in entries:
        return f"does not name {LIBRARY_IN_CONTAINER}, where containers get the library"
    return None


def inspect_hook_path(folder: str) -> HookPathState:
    """Read HAMi-core's two files in `folder` (changes nothing)."""
    return HookPathState(
        folder,
        (
            _inspect_file(folder, LIBRARY, _library_content),
            _inspect_file(folder, PRELOAD, _preload_content),
        ),
    )


def missing_message(state: HookPathState, node_name: str) -> str:
    """What an operator reads on the node while HAMi-core cannot serve containers."""
    return (
        f"HAMi-core is not usable in {state.folder} on {node_name}: {state.problem}. Without it a "
        "hami-core container would run with no GPU memory or core limit, so this node offers no "
        f"hami-core capacity until it is. Install it: helm upgrade with {INSTALLER_VALUE}=true (the "
        f"chart's default), or copy {LIBRARY} and {PRELOAD} (world-readable) into {state.folder}. "
        "Capacity returns by itself once the files are there; `kube-vgpu node check` shows what is found."
    )


def found_message(state: HookPathState, node_name: str) -> str:
    """What an operator reads on the node once HAMi-core is usable (again)."""
    return (
        f"HAMi-core found in {state.folder} on {node_name}: the node's hami-core capacity is "
        "advertised again."
    )


# Called on the event loop with the new state whenever readiness (or the problem) changes.
OnChange = Callable[[HookPathState], None]


def hold_while_missing(
    state: HookPathState,
    node_name: str,
    *,
    set_hold: Callable[[str | None], bool],
    announce: Callable[[bool, str], None],
    while_missing: str,
) -> None:
    """Hold the node's GPUs while HAMi-core is unusable and release them once it is, logging and
    announcing (a node Event) each change; `while_missing` says what the hold means for this API."""
    if state.ready:
        log.info("event=hami_core_ready node=%s folder=%s", node_name, state.folder)
        if set_hold(None):
            announce(True, found_message(state, node_name))
        return
    log.warning(
        "event=hami_core_missing node=%s folder=%s problem=%r: %s",
        node_name,
        state.folder,
        state.problem,
        while_missing,
    )
    set_hold(f"HAMi-core not usable in {state.folder}: {state.problem}")
    announce(False, missing_message(state, node_name))


class HookPathWatch:
    """Checks the folder every `interval` seconds; `on_change` hears every change of the verdict,
    and, while HAMi-core stays unusable, the same verdict again every `remind_seconds`: the API
    server drops Events after an hour (its default --event-ttl), and the Warning must stay visible
    on the node for as long as the problem lasts."""

    def __init__(
        self,
        folder: str,
        on_change: OnChange,
        *,
        interval: float,
        remind_seconds: float = 1800.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.folder = folder
        self._on_change = on_change
        self._interval = interval
        self._remind = remind_seconds
        self._clock = clock
        self._reported_at = 0.0
        self.state: HookPathState | None = None

    async def check(self) -> HookPathState:
        """Check once (on a worker thread: the folder is a host mount) and report a change."""
        state = await asyncio.to_thread(inspect_hook_path, self.folder)
        previous = self.state
        self.state = state
        now = self._clock()
        changed = previous is None or (previous.ready, previous.problem) != (state.ready, state.problem)
        if changed or (not state.ready and now - self._reported_at >= self._remind):
            self._reported_at = now
            self._on_change(state)
        return state

    async def run(self) -> None:
        """Check every interval, forever (cancel to stop)."""
        while True:
            await asyncio.sleep(self._interval)
            await self.check()
