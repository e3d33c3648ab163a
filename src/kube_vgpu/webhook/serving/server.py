"""The admission endpoints over HTTP: `POST /mutate` and `/validate`, `GET /healthz` and `/readyz`.

A review's body is read within the process-wide body budget, parsed, and answered by
`webhook.reviews` in its namespace's fair turn. A body that is not an AdmissionReview is HTTP 4xx
with a JSON reason, never a traceback or a 5xx.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from kube_vgpu.httpedge.listener import JSON, arrived, error_response
from kube_vgpu.webhook import reviews
from kube_vgpu.webhook.admission.review import MalformedReview, parse_review
from kube_vgpu.webhook.fairness import FairTurns

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 3 * 1024 * 1024
# The bodies held at once, process-wide (being read, or waiting for a fair turn): the connection cap
# alone would allow 500 bodies of 3 MiB (a 3 kB gzip body inflates to 3 MiB).
BODY_BUDGET_BYTES = 64 * 1024 * 1024
# Kept free of large bodies (those that wait for a turn) for the few-kB reviews the API server sends.
SMALL_BODIES_ROOM_BYTES = 4 * 1024 * 1024
# What the API server and ordinary clients send; anything else is answered 415 unread.
ENCODINGS = frozenset(("", "identity", "gzip", "deflate"))
# The `reviews` outcome of an answer given to a review that never reached its phase.
_OUTCOMES = {400: "malformed", 413: "too_large", 415: "malformed", 429: "busy"}
_PHASES = {"/mutate": False, "/validate": True}  # path: whether it is the validating phase


class AdmissionApp:
    """The routes of the webhook: `handle` is the aiohttp request handler."""

    def __init__(self, services: reviews.Services, *, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self.services, self.max_body_bytes = services, max_body_bytes
        # Large reviews take turns between namespaces (`webhook.fairness`); small ones run at once.
        self.turns = FairTurns()
        self.budget_bytes, self.held_bytes = BODY_BUDGET_BYTES, 0
        # Bodies being read and the bytes each holds, oldest first: when the budget is full, the one
        # waiting longest is closed to make room (as the connection cap does), so stalled bodies
        # cannot refuse the API server's reviews.
        self.readers: dict[int, tuple[web.BaseRequest, int]] = {}  # by id(): requests are unhashable

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """Answer one request (aiohttp calls this once its head has arrived)."""
        started = time.perf_counter()
        method, path = request.method, request.raw_path.partition("?")[0]
        validating = _PHASES.get(path)
        if validating is None or method != "POST":
            return self._not_a_review(request, method, path)
        read = await self._read(request)
        arrived(request)
        # Not `isinstance(read, web.StreamResponse)`: a response is a MutableMapping, so that test runs
        # the ABC machinery in Python for every review.
        if not isinstance(read, tuple):
            return read
        body, held = read
        try:
            answer = self.turns.run(body, self._answer, request, body, started, validating)
            if type(answer) is web.Response or isinstance(answer, web.StreamResponse):
                return answer
            return await answer
        finally:
            self.held_bytes -= held  # held until answered: a large body may wait for its turn

    def _not_a_review(self, request: web.BaseRequest, method: str, path: str) -> web.Response:
        """Health, readiness, or the 404/405 of anything else; a body sent along is never read, so the
        answer closes its connection."""
        close = request.body_exists
        if path not in ("/healthz", "/readyz"):
            if path in _PHASES:
                return error_response(
                    405, f"method {method[:16]} is not served at {path}; use POST", close=close
                )
            reason = f"no such path {path[:100]!r}; reviews go to /mutate or /validate"
            return error_response(404, reason, close=close)
        if method not in ("GET", "HEAD"):
            return error_response(405, f"method {method[:16]} is not served at {path}; use GET", close=close)
        arrived(request)
        # Liveness: the process serves HTTP. Readiness: the cache has synced and heard from the API lately.
        readiness = self.services.readiness
        ready = path == "/healthz" or readiness.ready()
        state = {"ok": True} if path == "/healthz" else {"ready": ready, "synced": readiness.synced()}
        response = web.Response(status=200 if ready else 503, body=orjson.dumps(state), content_type=JSON)
        if close:
            response.force_close()
        return response

    async def _read(self, request: web.BaseRequest) -> tuple[bytes, int] | web.StreamResponse:
        """The body, decoded, and the bytes it holds of the budget (given back once answered); or the 4xx."""
        encoding = request.headers.get("Content-Encoding", "").strip().lower()
        if encoding not in ENCODINGS:
            reason = f"content encoding {encoding[:40]!r} is not served; send gzip, deflate or none"
            return self._refuse(request, 415, reason)
        length, limit = request.content_length, self.max_body_bytes
        if length is not None and length > limit:
            return self._refuse(request, 413, f"body of {length} bytes is over the {limit}-byte limit")
        if not request.body_exists:
            return b"", 0
        # A compressed body's length says nothing of its size once inflated: it may take the limit.
        size = limit if length is None or encoding not in ("", "identity") else length
        if not self._make_room(size, SMALL_BODIES_ROOM_BYTES if size > self.turns.large_bytes else 0):
            log.info("event=review_refused_busy remote=%s reserved_bytes=%d", request.remote, size)
            return self._refuse(request, 429, "too many request bodies are being read right now; retry")
        self.readers[id(request)] = (request, size)
        try:
            if request.version >= (1, 1) and request.headers.get("Expect", "").lower() == "100-continue":
                # aiohttp's low-level server leaves this to the handler (its router does it for apps).
                await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            body = await _read_whole(request, limit)
            if self.readers.pop(id(request), None) is None:  # evicted as its last bytes arrived
                return error_response(400, "connection closed to make room for other bodies", close=True)
            return body, size
        except web.HTTPRequestEntityTooLarge:
            return self._refuse(request, 413, f"body is over the {limit}-byte limit (after decompression)")
        except (HttpProcessingError, web.RequestPayloadError) as exc:
            return self._refuse(request, 400, f"body cannot be read: {' '.join(str(exc).split())}")
        except ConnectionError:  # the caller went (or its deadline closed it): nobody reads an answer
            return error_response(400, "connection closed before the body arrived", close=True)
        finally:
            if self.readers.pop(id(request), None) is not None:  # not read, nor given back by `_make_room`
                self.held_bytes -= size

    def _make_room(self, size: int, keep_free: int) -> bool:
        """Hold `size` bytes, closing the bodies waiting longest until they fit, `keep_free` bytes left
        free; False (none closed) when they never would."""
        if size > self.budget_bytes - keep_free:
            return False
        while self.held_bytes + size > self.budget_bytes - keep_free:
            if not self.readers:
                return False
            victim, held = self.readers.pop(next(iter(self.readers)))
            self.held_bytes -= held  # its reading task gives up as soon as it runs
            log.info("event=body_evicted remote=%s reserved_bytes=%d", victim.remote, held)
            if victim.transport is not None:
                victim.transport.abort()
        self.held_bytes += size
        return True

    def _refuse(self, request: web.BaseRequest, status: int, reason: str) -> web.Response:
        """A review that never reaches its phase: counted, logged at INFO, its connection closed (what
        follows an unread or unreadable body cannot be framed)."""
        self.services.metrics.reviews.labels(_OUTCOMES.get(status, "malformed")).inc()
        log.info("event=http_bad_request remote=%s status=%d reason=%r", request.remote, status, reason[:300])
        return error_response(status, reason, close=True)

    def _answer(
        self, http: web.BaseRequest, body: bytes, started: float, validating: bool
    ) -> web.Response | Awaitable[web.Response]:
        try:
            request = parse_review(body, self.services.admission.bounds)
        except MalformedReview as exc:  # read whole, so the connection stays framed and is kept
            self.services.metrics.reviews.labels("malformed").inc()
            log.info("event=review_malformed remote=%s reason=%r", http.remote, str(exc))
            return error_response(400, str(exc))
        answer = reviews.answer(self.services, request, started, validating)
        if isinstance(answer, bytes):
            return web.Response(body=answer, content_type=JSON)
        return _respond(answer)


async def _respond(answer: Awaitable[bytes]) -> web.Response:
    return web.Response(body=await answer, content_type=JSON)


async def _read_whole(request: web.BaseRequest, limit: int) -> bytes:
    """The whole body, decoded, bounded by `limit` after decompression (aiohttp inflates in bounded
    pieces). Not `read()`, which keeps it on the request: aiohttp holds a connection's last request
    until the next one arrives, so an idle keep-alive connection held its last body."""
    body = bytearray()
    while chunk := await request.content.readany():
        body.extend(chunk)
        if len(body) > limit:
            raise web.HTTPRequestEntityTooLarge(limit, len(body))
    return bytes(body)
