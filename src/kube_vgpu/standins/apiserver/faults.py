"""Failure modes the stand-in API server can be told to show, and the log of requests it received.

Tests switch these from their own thread while the server runs on its loop, so every piece of state
here is guarded by a lock, and waking a hung request goes through its loop's thread-safe scheduling.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from dataclasses import dataclass, field
from typing import Any

ALL = "*"


@dataclass
class RequestRecord:
    """One request as it arrived (`status` is filled in once it is answered; None while hung)."""

    method: str
    path: str
    query: dict[str, str]
    content_type: str
    body: bytes
    status: int | None = None

    def json(self) -> Any:
        """The body parsed as JSON (None when empty)."""
        return json.loads(self.body) if self.body else None


@dataclass(frozen=True)
class DenyRule:
    """Refuse `verb` on `resource` (`pods`, `nodes/status`, or `*`), in one namespace or everywhere."""

    verb: str
    resource: str
    namespace: str | None = None

    def matches(self, verb: str, resource: str, namespace: str | None) -> bool:
        """Whether a request with these attributes is refused by this rule."""
        return (
            self.verb in (ALL, verb)
            and self.resource in (ALL, resource)
            and (self.namespace is None or self.namespace == namespace)
        )


@dataclass
class _Waiter:
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[bool] = field(repr=False)


class Faults:
    """Deny rules, the hang switch, and the request log."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._deny: list[DenyRule] = []
        self._hang_paths: tuple[str, ...] | None = None
        self._hanging = False
        self._waiters: list[_Waiter] = []
        self._records: list[RequestRecord] = []

    # -- RBAC ---------------------------------------------------------------------------------------

    def deny(self, verb: str, resource: str, namespace: str | None = None) -> None:
        """Add a rule that makes matching requests answer 403 Forbidden."""
        with self._lock:
            self._deny.append(DenyRule(verb, resource, namespace))

    def allow_all(self) -> None:
        """Drop every deny rule."""
        with self._lock:
            self._deny.clear()

    def denied(self, verb: str, resource: str, namespace: str | None) -> bool:
        """Whether some rule refuses this request."""
        with self._lock:
            return any(rule.matches(verb, resource, namespace) for rule in self._deny)

    # -- hang ---------------------------------------------------------------------------------------

    def set_hang(self, hanging: bool, paths: list[str] | tuple[str, ...] | None = None) -> None:
        """Make requests whose path starts with one of `paths` (all when None) wait unanswered; lifting
        the hang lets the waiting ones proceed."""
        with self._lock:
            self._hanging = hanging
            self._hang_paths = tuple(paths) if paths is not None else None
            if not hanging:
                self._wake_locked(True)

    def hangs(self, path: str) -> bool:
        """Whether a request for `path` must wait now."""
        with self._lock:
            if not self._hanging:
                return False
            return self._hang_paths is None or any(path.startswith(p) for p in self._hang_paths)

    async def wait_released(self, path: str) -> bool:
        """Wait while `path` hangs: True when the hang is lifted, False when the server drops the request."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if not self._hanging or not (
                self._hang_paths is None or any(path.startswith(p) for p in self._hang_paths)
            ):
                return True
            waiter = _Waiter(loop, loop.create_future())
            self._waiters.append(waiter)
        try:
            return await waiter.future
        finally:
            with self._lock:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)

    def drop_hung(self) -> None:
        """Release every hung request with the order to drop its connection (server stop or outage)."""
        with self._lock:
            self._wake_locked(False)

    def _wake_locked(self, proceed: bool) -> None:
        for waiter in self._waiters:
            # A closed loop has nothing waiting on it any more.
            with contextlib.suppress(RuntimeError):
                waiter.loop.call_soon_threadsafe(_resolve, waiter.future, proceed)
        self._waiters.clear()

    # -- request log --------------------------------------------------------------------------------

    def record(self, record: RequestRecord) -> None:
        """Append a request to the log."""
        with self._lock:
            self._records.append(record)

    def records(self) -> list[RequestRecord]:
        """The requests received so far, oldest first."""
        with self._lock:
            return list(self._records)

    def clear_records(self) -> None:
        """Forget the requests received so far."""
        with self._lock:
            self._records.clear()


def _resolve(future: asyncio.Future[bool], value: bool) -> None:
    if not future.done():
        future.set_result(value)
