"""The admission endpoints: `POST /mutate` and `/validate`, `GET /healthz` and `/readyz`.

The handler reads the body within the process-wide body budget, asks the pure pipeline of the
path's phase and encodes the answer. A body that is not an AdmissionReview is HTTP 400 with a JSON
reason; neither it nor a policy refusal is ever a traceback or a 5xx.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from kube_vgpu.httpedge.listener import JSON, arrived, error_response
from kube_vgpu.webhook.admission.mutation import Admission
from kube_vgpu.webhook.admission.review import (
    AdmissionRequest,
    MalformedReview,
    Verdict,
    encode_json,
    encode_response,
    parse_review,
)
from kube_vgpu.webhook.admission.validation import Validation
from kube_vgpu.webhook.fairness import FairTurns
from kube_vgpu.webhook.serving.metrics import WebhookMetrics

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 3 * 1024 * 1024
# The bodies held at once, process-wide (read, being read, or waiting for a fair turn): the
# connection cap alone would allow 500 bodies of 3 MiB (a 3 kB gzip body inflates to 3 MiB).
BODY_BUDGET_BYTES = 64 * 1024 * 1024
# Kept free of large bodies (those that wait for a turn) for the few-kB reviews the API server sends.
SMALL_BODIES_ROOM_BYTES = 4 * 1024 * 1024
# How long a review waits for a cache that has not finished its first list before it is refused.
SYNC_WAIT_SECONDS = 2.0
# What the API server and ordinary clients send; anything else is answered 415 unread.
ENCODINGS = frozenset(("", "identity", "gzip", "deflate"))
# The `reviews` outcome of an answer given to a review that never reached its phase.
_OUTCOMES = {400: "malformed", 413: "too_large", 415: "malformed", 429: "busy"}


class BodyBudget:
    """Bytes reserved by the bodies being read or answered right now (event loop only)."""

    def __init__(self, limit_bytes: int = BODY_BUDGET_BYTES) -> None:
        if limit_bytes <= 0:
            raise ValueError(f"the body budget must be positive, got {limit_bytes}")
        self.limit_bytes, self.held_bytes = limit_bytes, 0

    def hold(self, size: int, keep_free: int = 0) -> bool:
        """Reserve `size` bytes, leaving `keep_free` free; False (nothing reserved) when they do not fit."""
        if self.held_bytes + size > self.limit_bytes - keep_free:
            return False
        self.held_bytes += size
        return True

    def release(self, size: int) -> None:
        self.held_bytes -= size


def body_reservation(content_length: int | None, compressed: bool, limit_bytes: int) -> int:
    """What a body may take once read: its length, or the whole limit when that says nothing about
    the size after decompression (or there is none)."""
    return limit_bytes if content_length is None or compressed else min(content_length, limit_bytes)


@dataclass(frozen=True)
class Readiness:
    """The cache's first list done (synced), synced and fresh (ready), and a wait for the first."""

    synced: Callable[[], bool]
    ready: Callable[[], bool]
    wait_synced: Callable[[], Awaitable[None]]


@dataclass(frozen=True)
class Services:
    admission: Admission
    validation: Validation
    readiness: Readiness
    metrics: WebhookMetrics


class AdmissionApp:
    """The routes of the webhook: `handle` is the aiohttp request handler."""

    def __init__(self, services: Services, *, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self.services, self.max_body_bytes = services, max_body_bytes
        # Large reviews take turns between namespaces (`webhook.fairness`); small ones run at once.
        self.turns = FairTurns()
        self.bodies = BodyBudget()
        # Bodies being read and the bytes each reserved, oldest first: when the budget is full, the one
        # waiting longest is closed to make room (as the connection cap does), so stalled bodies
        # cannot refuse the API server's reviews.
        self._readers: dict[int, tuple[web.BaseRequest, int]] = {}  # by id(): requests are unhashable
        self._gets: dict[str, Callable[[], web.Response]] = {"/healthz": self.healthz, "/readyz": self.readyz}

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """Answer one request (aiohttp calls this once its head has arrived)."""
        started = time.perf_counter()
        method, path = request.method, request.raw_path.partition("?")[0]
        validating = {"/mutate": False, "/validate": True}.get(path)
        if validating is None:
            get = self._gets.get(path)
            if get is None:
                reason = f"no such path {path[:100]!r}; reviews go to /mutate or /validate"
                return error_response(404, reason, close=request.body_exists)
            if method not in ("GET", "HEAD"):
                reason = f"method {method[:16]} is not served at {path}; use GET"
                return error_response(405, reason, close=request.body_exists)
            arrived(request)
            health = get()
            if request.body_exists:  # answered unread: aiohttp would drop the body and keep the connection
                health.force_close()
            return health
        if method != "POST":
            reason = f"method {method[:16]} is not served at {path}; use POST"
            return error_response(405, reason, close=request.body_exists)
        read = await self._read(request)
        arrived(request)
        # Not `isinstance(read, web.StreamResponse)`: a response is a MutableMapping, so that test runs
        # the ABC machinery in Python for every review.
        if not isinstance(read, tuple):
            return read
        body, held = read
        try:
            answer = self.turns.run(body, self.review, request, body, started, validating)
            if type(answer) is web.Response or isinstance(answer, web.StreamResponse):
                return answer
            return await answer
        finally:
            self.bodies.release(held)  # held until answered: a large body may wait for its turn

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
        size = body_reservation(length, encoding not in ("", "identity"), limit)
        keep_free = SMALL_BODIES_ROOM_BYTES if size > self.turns.large_bytes else 0
        if not self._make_room(size, keep_free):
            log.info("event=review_refused_busy remote=%s reserved_bytes=%d", request.remote, size)
            return self._refuse(request, 429, "too many request bodies are being read right now; retry")
        self._readers[id(request)] = (request, size)
        try:
            if request.version >= (1, 1) and request.headers.get("Expect", "").lower() == "100-continue":
                # aiohttp's low-level server leaves this to the handler (its router does it for apps).
                await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            body = await _read_whole(request, limit)
            if self._readers.pop(id(request), None) is None:  # evicted as its last bytes arrived
                return error_response(400, "connection closed to make room for other bodies", close=True)
            return body, size
        except web.HTTPRequestEntityTooLarge:
            return self._refuse(request, 413, f"body is over the {limit}-byte limit (after decompression)")
        except (HttpProcessingError, web.RequestPayloadError) as exc:
            return self._refuse(request, 400, f"body cannot be read: {' '.join(str(exc).split())}")
        except ConnectionError:  # the caller went (or its deadline closed it): nobody reads an answer
            return error_response(400, "connection closed before the body arrived", close=True)
        finally:
            if self._readers.pop(id(request), None) is not None:  # not already given back by `_make_room`
                self.bodies.release(size)

    def _make_room(self, size: int, keep_free: int) -> bool:
        """Hold `size` bytes, closing the bodies waiting longest until they fit; False (none closed)
        when they never would."""
        if size > self.bodies.limit_bytes - keep_free:
            return False
        while not self.bodies.hold(size, keep_free):
            if not self._readers:
                return False
            key, (victim, held) = next(iter(self._readers.items()))
            del self._readers[key]
            self.bodies.release(held)  # its reading task gives up as soon as it runs
            log.info("event=body_evicted remote=%s reserved_bytes=%d", victim.remote, held)
            if victim.transport is not None:
                victim.transport.abort()
        return True

    def _refuse(self, request: web.BaseRequest, status: int, reason: str) -> web.Response:
        """A review that never reaches its phase: counted, logged at INFO, its connection closed (what
        follows an unread or unreadable body cannot be framed)."""
        self.services.metrics.reviews.labels(_OUTCOMES.get(status, "malformed")).inc()
        log.info("event=http_bad_request remote=%s status=%d reason=%r", request.remote, status, reason[:300])
        return error_response(status, reason, close=True)

    def review(
        self, http: web.BaseRequest, body: bytes, started: float, validating: bool
    ) -> web.StreamResponse | Awaitable[web.StreamResponse]:
        """The review of the path's phase: a mutating one is answered at once once the cache has synced;
        a validating one may record a quota reservation through the API."""
        try:
            request = parse_review(body, self.services.admission.bounds)
        except MalformedReview as exc:
            self.services.metrics.reviews.labels("malformed").inc()
            log.info("event=review_malformed remote=%s reason=%r", http.remote, str(exc))
            return error_response(400, str(exc))
        if validating or not self.services.readiness.synced():
            return self._review_when_synced(request, started, validating)
        return self._answer(request, self._mutate(request), started, validating)

    def _mutate(self, request: AdmissionRequest) -> Verdict:
        try:
            return self.services.admission.review(request)
        except Exception as exc:  # a bug must answer a review, not drop the connection
            return _internal_error(request, exc)

    async def _review_when_synced(
        self, request: AdmissionRequest, started: float, validating: bool
    ) -> web.Response:
        readiness = self.services.readiness
        if not readiness.synced():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SYNC_WAIT_SECONDS):
                    await readiness.wait_synced()
        if validating:
            try:
                verdict = await self.services.validation.review(request)
            except Exception as exc:
                verdict = _internal_error(request, exc)
        else:
            verdict = self._mutate(request)
        if not readiness.synced() and (not verdict.allowed or verdict.patch):
            # Mutating from an empty cache would resolve against no GPUs and no namespace labels.
            message = "kube-vgpu webhook has not loaded the cluster state yet; retry in a few seconds"
            verdict = Verdict(allowed=False, reason="not-ready", message=message)
        return self._answer(request, verdict, started, validating)

    def _answer(
        self, request: AdmissionRequest, verdict: Verdict, started: float, validating: bool
    ) -> web.Response:
        metrics = self.services.metrics
        metrics.latency.observe(time.perf_counter() - started)
        if verdict.allowed:
            metrics.allowed.inc()
        else:
            metrics.denied.inc()
            metrics.denials.labels(verdict.reason or "unknown").inc()
        # An ordinary admission is in the metrics; its line is DEBUG. A denial is worth a line at INFO.
        level = logging.DEBUG if verdict.allowed else logging.INFO
        if (request.is_pod_create or (validating and request.is_pod_update)) and log.isEnabledFor(level):
            log.log(
                level,
                "event=review phase=%s operation=%s uid=%s namespace=%s pod=%s allowed=%s reason=%s "
                "patch_ops=%d warnings=%d%s",
                "validate" if validating else "mutate",
                request.operation,
                request.uid,
                request.namespace,
                _pod_name(request),
                verdict.allowed,
                verdict.reason or "-",
                len(verdict.patch),
                len(verdict.warnings),
                "" if verdict.allowed else f" message={verdict.message!r}",
            )
        return web.Response(body=encode_json(encode_response(request.uid, verdict)), content_type=JSON)

    def healthz(self) -> web.Response:
        """Liveness: the process serves HTTP."""
        return web.Response(body=orjson.dumps({"ok": True}), content_type=JSON)

    def readyz(self) -> web.Response:
        """Readiness: the cluster cache has synced and heard from the API recently."""
        ready, synced = self.services.readiness.ready(), self.services.readiness.synced()
        body = orjson.dumps({"ready": ready, "synced": synced})
        return web.Response(status=200 if ready else 503, body=body, content_type=JSON)


def _pod_name(request: AdmissionRequest) -> str:
    metadata = (request.object or {}).get("metadata")
    if not isinstance(metadata, dict):  # a mistyped pod, denied; its name is whatever it says
        return "?"
    return str(metadata.get("name") or f"{metadata.get('generateName') or ''}*")


def _internal_error(request: AdmissionRequest, exc: Exception) -> Verdict:
    log.error("event=review_failed uid=%s error=%r", request.uid, f"{type(exc).__name__}: {exc}")
    message = f"kube-vgpu webhook internal error: {type(exc).__name__}"
    return Verdict(allowed=False, reason="internal-error", message=message)


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
