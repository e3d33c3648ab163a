"""Time and events for the simulated NVML: an injectable clock, event sets, the timed schedule.

The clock is injected so tests never sleep: `FakeClock.wait` moves virtual time forward instead
of blocking, so `nvmlEventSetWait_v2(set, 5000)` returns at once with the event due within those
5 virtual seconds, or raises Timeout with the clock 5 seconds later.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from kube_vgpu.standins.nvml.config import EventSpec


class Clock(Protocol):
    """Where the simulator reads time and how it waits for something to happen."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back."""
        ...

    def wait(self, condition: threading.Condition, timeout: float) -> None:
        """Wait on `condition` (held by the caller) until notified or `timeout` seconds pass."""
        ...


class SystemClock:
    """Real time: waits block the calling thread."""

    def monotonic(self) -> float:
        """`time.monotonic()`."""
        return time.monotonic()

    def wait(self, condition: threading.Condition, timeout: float) -> None:
        """Block on the condition for up to `timeout` seconds."""
        condition.wait(timeout)


class FakeClock:
    """Virtual time for tests: nothing sleeps, a wait just moves the clock forward."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        """The virtual time."""
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        """Move virtual time forward."""
        if seconds < 0:
            raise ValueError(f"a clock does not go back ({seconds} seconds)")
        with self._lock:
            self._now += seconds

    def wait(self, condition: threading.Condition, timeout: float) -> None:
        """Let `timeout` virtual seconds pass without blocking."""
        self.advance(max(timeout, 0.0))


@dataclass(frozen=True)
class Event:
    """One occurrence NVML reports through event sets."""

    gpu_index: int
    event_type: int
    data: int
    gpu_instance_id: int
    compute_instance_id: int


@dataclass(eq=False)
class EventSet:
    """An NVML event set: what each GPU registered (and when), and the events not yet read."""

    handle: int = 0
    freed: bool = False
    queue: deque[Event] = field(default_factory=deque)
    # gpu index -> event type bit -> time of registration; NVML reports only what happens after.
    registrations: dict[int, dict[int, float]] = field(default_factory=dict)

    def register(self, gpu_index: int, mask: int, now: float) -> None:
        """Add the event types in `mask` for a GPU, keeping earlier registration times."""
        bits = self.registrations.setdefault(gpu_index, {})
        for bit in range(64):
            if mask >> bit & 1:
                bits.setdefault(1 << bit, now)

    def offer(self, event: Event, happened_at: float) -> None:
        """Queue `event` if its GPU had registered its type by the time it happened."""
        registered_at = self.registrations.get(event.gpu_index, {}).get(event.event_type)
        if not self.freed and registered_at is not None and registered_at <= happened_at:
            self.queue.append(event)


@dataclass(order=True, frozen=True)
class Scheduled:
    """A file event, ordered by when it is due (seconds after the first nvmlInit)."""

    due: float
    sequence: int
    spec: EventSpec = field(compare=False)


class Schedule:
    """The file's events not yet fired, soonest first."""

    def __init__(self, events: tuple[EventSpec, ...]) -> None:
        self._pending = sorted(Scheduled(e.after, i, e) for i, e in enumerate(events))

    def next_due(self) -> float | None:
        """When the next event is due (relative seconds), if any is left."""
        return self._pending[0].due if self._pending else None

    def pop_due(self, elapsed: float) -> list[Scheduled]:
        """Remove and return the events due by `elapsed` seconds, in order."""
        due = [s for s in self._pending if s.due <= elapsed]
        self._pending = self._pending[len(due) :]
        return due
