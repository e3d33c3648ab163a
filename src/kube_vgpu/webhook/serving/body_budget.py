"""A process-wide bound on the request bodies the webhook holds at once.

The connection cap bounds idle connections, but each connection may also hold a body of up to the
body limit (3 MiB after decompression) until its request deadline: about 90 stalled gzip bodies of
3 kB each would have held 3 MiB apiece and pushed the webhook past its memory limit. Before a body is
read, the bytes it may take are reserved here (its Content-Length, or the whole limit when it is
compressed or chunked); when a request does not fit, the server closes the bodies waiting longest
to make room (`webhook.serving.server`), or answers 429 if it never could fit.
Pure bookkeeping: no I/O, used from the event loop only.
"""

from __future__ import annotations

from typing import Final

DEFAULT_BUDGET_BYTES: Final = 64 * 1024 * 1024
# Kept free of large bodies (those that wait for a turn) for the few-kB reviews the API server sends.
SMALL_BODIES_ROOM_BYTES: Final = 4 * 1024 * 1024


class BodyBudget:
    """Bytes reserved by the bodies being read or answered right now."""

    def __init__(self, limit_bytes: int = DEFAULT_BUDGET_BYTES) -> None:
        if limit_bytes <= 0:
            raise ValueError(f"the body budget must be positive, got {limit_bytes}")
        self.limit_bytes = limit_bytes
        self.held_bytes = 0

    def hold(self, size: int, keep_free: int = 0) -> bool:
        """Reserve `size` bytes, leaving `keep_free` unreserved; False (reserving nothing) when they do
        not fit. Give them back with `release` once the body's request is answered or abandoned."""
        if self.held_bytes + size > self.limit_bytes - keep_free:
            return False
        self.held_bytes += size
        return True

    def release(self, size: int) -> None:
        """Give back bytes reserved by `hold`."""
        self.held_bytes -= size


def body_reservation(content_length: int | None, compressed: bool, limit_bytes: int) -> int:
    """What a body may take once read: its declared length, or the whole limit when the length
    says nothing about the size after decompression (or there is none)."""
    if content_length is None or compressed:
        return limit_bytes
    return min(content_length, limit_bytes)
