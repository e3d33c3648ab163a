"""The thin HTTP edge: `POST /mutate` and `/validate`, `GET /healthz`, `/readyz`, `/metrics` (SPEC §2).

The handler reads the body, parses it (`webhook.review`), asks the pure pipeline of the path's
phase (`webhook.admission` for /mutate, `webhook.validation` for /validate), and encodes the
answer. A body that is not an AdmissionReview is HTTP 400
with a JSON reason, a body over the limit is 413; neither is ever a traceback or a 5xx.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Handler

from webhook.admission import Admission
from webhook.body_budget import BodyBudget, body_reservation
from webhook.listener import GuardedConnection
from webhook.metrics import WebhookMetrics
from webhook.review import (
    AdmissionRequest,
    MalformedReview,
    Verdict,
    encode_json,
    encode_response,
    parse_review,
)
from webhook.validation import Validation

log = logging.getLogger("kube_vgpu.webhook.server")

MAX_BODY_BYTES = 3 * 1024 * 1024
# How long a review waits for a cache that has not finished its first list before it is refused.
SYNC_WAIT_SECONDS = 2.0
NOT_READY = "not-ready"
VALIDATE_PATH = "/validate"
INTERNAL_ERROR = "internal-error"


@dataclass(frozen=True)
class Readiness:
    """The cache facts the server needs: synced (first list done), ready (synced and fresh), and a waiter."""

    synced: Callable[[], bool]
    ready: Callable[[], bool]
    wait_synced: Callable[[], Awaitable[None]]


class Drain:
    """Requests in flight, so that shutdown can wait for them before closing connections.

    aiohttp's own graceful shutdown stops reading from a connection at once, so a review whose body
    is still arriving would never finish; counting requests from their headers on avoids that.
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
        """A request was answered."""
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    async def wait_idle(self) -> None:
        """Switch to draining (answers close their connection) and wait until nothing is in flight."""
        self.draining = True
        await self._idle.wait()


def _guard(request: web.Request) -> GuardedConnection | None:
    """The listener's guard of the request's connection (None when served by another listener)."""
    transport = request.transport
    protocol = transport.get_protocol() if transport is not None else None
    return protocol if isinstance(protocol, GuardedConnection) else None


@web.middleware
async def _track(request: web.Request, handler: Handler) -> web.StreamResponse:
    drain = request.app[SERVICES].drain
    guard = _guard(request)
    drain.begin()
    if guard is not None:
        guard.request_started()
    try:
        response = await handler(request)
        if drain.draining:
            response.force_close()  # the client must not send more on this connection
        return response
    finally:
        drain.end()
        if guard is not None:
            guard.request_finished()


@dataclass(frozen=True)
class Services:
    """What the handlers use, stored in the application under `SERVICES`."""

    admission: Admission
    validation: Validation
    readiness: Readiness
    metrics: WebhookMetrics
    max_body_bytes: int = MAX_BODY_BYTES
    drain: Drain = field(default_factory=Drain)
    bodies: BodyBudget = field(default_factory=BodyBudget)


SERVICES = web.AppKey("services", Services)


def _json(document: object, status: int = 200) -> web.Response:
    return web.Response(body=encode_json(document), status=status, content_type="application/json")


def _error(status: int, reason: str) -> web.Response:
    return _json({"error": reason}, status)


async def _answer_and_close(http: web.Request, response: web.Response) -> web.Response:
    """Send `response`, then close the connection: the rest of a broken body cannot be read or skipped.

    Closing before aiohttp's own clean-up keeps it from trying to drain the body (which raises the
    same error again, logged with a traceback); the close still flushes the answer first.
    """
    response.force_close()
    await response.prepare(http)
    await response.write_eof()
    http.protocol.force_close()
    return response


def _pod_name(request: AdmissionRequest) -> str:
    metadata = (request.object or {}).get("metadata")
    if not isinstance(metadata, dict):  # a mistyped pod, denied; its name is whatever it says
        return "?"
    return str(metadata.get("name") or f"{metadata.get('generateName') or ''}*")


class _BadRequestsWithoutTraceback(logging.Filter):
    """aiohttp logs a request it cannot parse (bad framing, a compressed body that ends wrongly, or
    one it fails to skip after an answer that did not read it) with a traceback at ERROR; that is a
    caller's bad input, so it becomes one INFO line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        client_error = isinstance(exc, HttpProcessingError) and 400 <= (exc.code or 0) < 500
        if client_error or isinstance(exc, web.RequestPayloadError):
            remote = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            record.msg, record.args = (
                "event=http_bad_request remote=%s reason=%r",
                (remote, " ".join(str(exc).split())),
            )
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


# The logger aiohttp reports protocol errors on (passed to the server as its `logger`).
http_log = logging.getLogger("kube_vgpu.webhook.http")
http_log.addFilter(_BadRequestsWithoutTraceback())


async def read_review(http: web.Request) -> AdmissionRequest | web.Response:
    """The request's AdmissionReview, or the 4xx answer (JSON reason) for a body that is not one.

    Every admission path reads its body here, so none can answer a caller's input with a 5xx.
    """
    metrics = http.app[SERVICES].metrics
    limit = http.app[SERVICES].max_body_bytes
    if http.content_length is not None and http.content_length > limit:
        metrics.reviews.labels("too_large").inc()
        return _error(413, f"body of {http.content_length} bytes is over the {limit}-byte limit")
    try:
        body = await http.read()
    except ConnectionResetError:
        # The connection closed mid-body (the caller left, or its request deadline passed): no answer.
        log.info("event=review_abandoned remote=%s", http.remote)
        return _error(400, "connection closed before the body arrived")
    except web.HTTPRequestEntityTooLarge:
        metrics.reviews.labels("too_large").inc()
        return _error(413, f"body is over the {limit}-byte limit (after decompression)")
    except web.RequestPayloadError as exc:
        # A body that does not decompress, or whose chunked framing is broken.
        metrics.reviews.labels("malformed").inc()
        reason = " ".join(str(exc).split())
        log.info("event=review_unreadable remote=%s reason=%r", http.remote, reason)
        return await _answer_and_close(http, _error(400, f"body cannot be read: {reason}"))
    try:
        return parse_review(body)
    except MalformedReview as exc:
        metrics.reviews.labels("malformed").inc()
        log.info("event=review_malformed remote=%s reason=%r", http.remote, str(exc))
        return _error(400, str(exc))


async def mutate(http: web.Request) -> web.Response:
    """Answer one AdmissionReview, within the process-wide budget of bodies held at once."""
    services = http.app[SERVICES]
    compressed = http.headers.get("Content-Encoding", "identity").lower() != "identity"
    size = body_reservation(http.content_length, compressed, services.max_body_bytes)
    with services.bodies.holding(size) as held:
        if not held:
            services.metrics.reviews.labels("busy").inc()
            log.info("event=review_refused_busy remote=%s reserved_bytes=%d", http.remote, size)
            return await _answer_and_close(
                http, _error(429, "too many request bodies are being read right now; retry")
            )
        return await _review(http, services)


async def _review(http: web.Request, services: Services) -> web.Response:
    metrics = services.metrics
    started = time.perf_counter()
    request = await read_review(http)
    if isinstance(request, web.Response):
        return request
    validating = http.path == VALIDATE_PATH
    verdict = await _decide(services, request, validating=validating)
    response = encode_response(request.uid, verdict)
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
    return _json(response)


async def _decide(services: Services, request: AdmissionRequest, *, validating: bool) -> Verdict:
    readiness = services.readiness
    if not readiness.synced():
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SYNC_WAIT_SECONDS):
                await readiness.wait_synced()
    try:
        if validating:
            verdict = await services.validation.review(request)  # quota may record through the API
        else:
            verdict = services.admission.review(request)
    except Exception as exc:  # a bug must answer a review, not drop the connection
        log.error("event=review_failed uid=%s error=%r", request.uid, f"{type(exc).__name__}: {exc}")
        return Verdict(
            allowed=False,
            reason=INTERNAL_ERROR,
            message=f"kube-vgpu webhook internal error: {type(exc).__name__}",
        )
    if not readiness.synced() and (not verdict.allowed or verdict.patch):
        # Mutating from an empty cache would resolve against no GPUs and no namespace labels.
        return Verdict(
            allowed=False,
            reason=NOT_READY,
            message="kube-vgpu webhook has not loaded the cluster state yet; retry in a few seconds",
        )
    return verdict


async def healthz(http: web.Request) -> web.Response:
    """Liveness: the process serves HTTP."""
    return _json({"ok": True})


async def readyz(http: web.Request) -> web.Response:
    """Readiness: the cluster cache has synced and heard from the API recently."""
    readiness = http.app[SERVICES].readiness
    ready = readiness.ready()
    return _json({"ready": ready, "synced": readiness.synced()}, 200 if ready else 503)


async def metrics(http: web.Request) -> web.Response:
    """Prometheus text exposition."""
    body = http.app[SERVICES].metrics.exposition()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


def build_app(services: Services) -> web.Application:
    """The aiohttp application (no listener; the caller runs it with TLS)."""
    # Over the limit, `read()` raises and the handler answers 413 in JSON.
    app = web.Application(client_max_size=services.max_body_bytes, middlewares=[_track])
    app[SERVICES] = services
    app.router.add_post("/mutate", mutate)
    # One handler for both phases: parsing, limits and errors are the same; `_decide` picks the phase.
    app.router.add_post(VALIDATE_PATH, mutate)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app
