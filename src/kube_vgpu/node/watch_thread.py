"""The stop switch shared by the node plugin's blocking watches, each run on a thread of its own.

A watch blocks on a silent stream, so stopping it means interrupting the stream it is reading; the
switch hands each round of list-then-watch a fresh `WatchInterrupt` and, on `stop`, fires the one in
use, from any thread.
"""

from __future__ import annotations

import threading

from kube_vgpu.kubeapi.client import WatchInterrupt


class WatchSwitch:
    """`next_round()` before each list-then-watch; `stop()` from anywhere ends the loop."""

    def __init__(self) -> None:
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._interrupt: WatchInterrupt | None = None

    @property
    def stopping(self) -> bool:
        """Whether `stop` was called."""
        return self._stopping.is_set()

    def next_round(self) -> WatchInterrupt | None:
        """The interrupt for the next round, or None once stopping."""
        interrupt = WatchInterrupt()
        with self._lock:
            if self._stopping.is_set():
                return None
            self._interrupt = interrupt
        return interrupt

    def pause(self, seconds: float) -> None:
        """Wait before retrying; returns early when stopped."""
        self._stopping.wait(seconds)

    def stop(self) -> None:
        """End the loop (from any thread): the watch in progress is interrupted."""
        self._stopping.set()
        with self._lock:
            if self._interrupt is not None:
                self._interrupt.interrupt()
