"""Fair turns between namespaces for the reviews that cost the most: one namespace's
flood of large reviews cannot hold another namespace's reviews past the webhook's timeout.

The bounds of `webhook.admission.bounds` keep what a review walks small, but decoding the body is
paid before anything can be refused, and it grows with the body (tens of milliseconds for a 2 MiB
pod): two dozen connections sending such bodies at full speed kept every other review waiting
behind all of them, first come first served. So a review whose body is larger than `large_bytes`
waits for a turn: turns go round the namespaces that have one waiting, one review per namespace
per round, one review at a time, and the next turn is given on a later pass of the event loop, so
the connections' I/O (and every small review, which never waits) is served between two large
reviews. A review therefore waits for at most one large review of each other namespace that has
one waiting, not for all of them. A large review holds its turn until it is answered (a quota
write through the API included), so large reviews are answered one at a time.

The namespace is read from the body's first `"namespace":"..."` before the body is decoded: in
what the API server sends, that is `request.namespace`, which it writes before the object. A caller
that writes another one only chooses the queue its own review waits in; the decision later reads
the decoded review.
"""

from __future__ import annotations

import asyncio
import re
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar, TypeVarTuple

# Everyday pods are a few kB; a review this large waits for its namespace's turn.
DEFAULT_LARGE_BYTES: Final = 64 * 1024
_NAMESPACE = re.compile(rb'"namespace"\s*:\s*"([^"\\]{0,253})"')

_Answer = TypeVar("_Answer")
_Args = TypeVarTuple("_Args")


def namespace_of(body: bytes) -> str:
    """The first namespace a review body names ("" when it names none), read without decoding it."""
    found = _NAMESPACE.search(body)
    return found.group(1).decode("utf-8", "replace") if found else ""


class FairTurns:
    """Round-robin turns between namespaces for large reviews; small ones run at once.

    One large review holds the turn at a time, from its start to its answer; the next turn is given
    on a later pass of the loop, so what arrived meanwhile (I/O, small reviews and the tasks they
    start) is served between two large reviews.
    """

    def __init__(self, large_bytes: int = DEFAULT_LARGE_BYTES) -> None:
        if large_bytes < 0:
            raise ValueError(f"large_bytes must not be negative, got {large_bytes}")
        self.large_bytes = large_bytes
        # Namespaces with a review waiting, in the order their turns come; each with its waiters.
        self._waiting: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()
        self._held = False
        self._grant_scheduled = False

    @property
    def waiting(self) -> int:
        """Reviews waiting for a turn now."""
        return sum(len(queue) for queue in self._waiting.values())

    def run(
        self,
        body: bytes,
        answer: Callable[[*_Args], _Answer | Awaitable[_Answer]],
        *args: *_Args,
    ) -> _Answer | Awaitable[_Answer]:
        """`answer(*args)` at once for a small body; for a large one, an awaitable that runs it once
        its namespace's turn has come."""
        if len(body) <= self.large_bytes:
            return answer(*args)
        return self._after_turn(namespace_of(body), answer, *args)

    async def _after_turn(
        self,
        namespace: str,
        answer: Callable[[*_Args], _Answer | Awaitable[_Answer]],
        *args: *_Args,
    ) -> _Answer:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(namespace, deque()).append(waiter)
        self._schedule_grant()
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release()  # given the turn just as its connection went away
            raise
        try:
            result = answer(*args)
            if isinstance(result, Awaitable):
                return await result
            return result
        finally:
            self._release()

    def _schedule_grant(self) -> None:
        if not self._grant_scheduled and not self._held and self._waiting:
            self._grant_scheduled = True
            asyncio.get_running_loop().call_soon(self._grant)

    def _grant(self) -> None:
        """Give the turn to the next namespace in the round."""
        self._grant_scheduled = False
        while self._waiting and not self._held:
            namespace, queue = self._waiting.popitem(last=False)
            waiter = queue.popleft()
            if queue:
                self._waiting[namespace] = queue  # back of the round
            if not waiter.done():  # a waiter whose connection went away is skipped
                self._held = True
                waiter.set_result(None)

    def _release(self) -> None:
        self._held = False
        self._schedule_grant()
