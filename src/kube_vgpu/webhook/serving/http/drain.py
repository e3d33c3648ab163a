"""Requests in flight, so that shutdown can wait for them before closing connections."""

from __future__ import annotations

import asyncio


class Drain:
    """Counts requests from their headers to their answer; once draining, answers close their connection.

    Counting from the headers on (not from the whole body) lets shutdown wait for a review whose body
    is still arriving, which then gets its answer instead of a cut connection.
    """

    def __init__(self) -> None:
        self.in_flight = 0
        self.draining = False
        self._idle = asyncio.Event()
        self._idle.set()

    def begin(self) -> None:
        """A request's headers arrived."""
        self.in_flight += 1
        self._idle.clear()

    def end(self) -> None:
        """A request was answered (or abandoned with its connection)."""
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    async def wait_idle(self) -> None:
        """Switch to draining (answers close their connection) and wait until nothing is in flight."""
        self.draining = True
        await self._idle.wait()
