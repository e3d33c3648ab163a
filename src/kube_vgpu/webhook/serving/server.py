"""The admission endpoints: `POST /mutate` and `/validate`, `GET /healthz`, `/readyz`, `/metrics` (SPEC §2).

A handler parses the body (`webhook.review`), asks the pure pipeline of the path's phase
(`webhook.admission` for /mutate, `webhook.validation` for /validate), and encodes the answer. A
body that is not an AdmissionReview is HTTP 400 with a JSON reason; neither it nor a policy refusal
is ever a traceback or a 5xx. Framing, limits and connections are `webhook.http`'s.

/mutate is answered without a coroutine when the cache has synced: the whole review is plain
computation, and a task per review would cost as much as the decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

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
from kube_vgpu.webhook.serving.http.message import Handler, Request, Response, error_response, json_response
from kube_vgpu.webhook.serving.metrics import WebhookMetrics

log = logging.getLogger("kube_vgpu.webhook.server")

MAX_BODY_BYTES = 3 * 1024 * 1024
# How long a review waits for a cache that has not finished its first list before it is refused.
SYNC_WAIT_SECONDS = 2.0
NOT_READY = "not-ready"
MUTATE_PATH = "/mutate"
VALIDATE_PATH = "/validate"
INTERNAL_ERROR = "internal-error"


@dataclass(frozen=True)
class Readiness:
    """The cache facts the server needs: synced (first list done), ready (synced and fresh), and a waiter."""

    synced: Callable[[], bool]
    ready: Callable[[], bool]
    wait_synced: Callable[[], Awaitable[None]]


@dataclass(frozen=True)
class Services:
    """What the handlers use."""

    admission: Admission
    validation: Validation
    readiness: Readiness
    metrics: WebhookMetrics


def _pod_name(request: AdmissionRequest) -> str:
    metadata = (request.object or {}).get("metadata")
    if not isinstance(metadata, dict):  # a mistyped pod, denied; its name is whatever it says
        return "?"
    return str(metadata.get("name") or f"{metadata.get('generateName') or ''}*")


class AdmissionApp:
    """The routes of the webhook, for `webhook.http.connection.HttpConnection`."""

    def __init__(self, services: Services, turns: FairTurns | None = None) -> None:
        self.services = services
        # Large reviews take turns between namespaces (`webhook.fairness`); small ones run at once.
        self.turns = turns or FairTurns()
        self._routes: dict[tuple[str, str], Handler] = {
            ("POST", MUTATE_PATH): lambda http: self.turns.run(http.body, lambda: self.mutate(http)),
            ("POST", VALIDATE_PATH): lambda http: self.turns.run(http.body, lambda: self.validate(http)),
            ("GET", "/healthz"): self.healthz,
            ("GET", "/readyz"): self.readyz,
            ("GET", "/metrics"): self.metrics,
        }
        self._paths = {path for _, path in self._routes}

    def route(self, method: str, path: str) -> Handler | Response:
        """The handler for a request, or the 404/405 answer."""
        handler = self._routes.get((method, path))
        if handler is not None:
            return handler
        if path in self._paths:
            allowed = ", ".join(sorted(m for m, p in self._routes if p == path))
            return error_response(405, f"method {method[:16]} is not served at {path}; use {allowed}")
        return error_response(
            404, f"no such path {path[:100]!r}; reviews go to {MUTATE_PATH} or {VALIDATE_PATH}"
        )

    # -- admission ----------------------------------------------------------------------------

    def mutate(self, http: Request) -> Response | Awaitable[Response]:
        """The mutating phase: answered at once once the cache has synced."""
        started = http.received_at
        request = self._parse(http)
        if isinstance(request, Response):
            return request
        if not self.services.readiness.synced():
            return self._review_when_synced(request, started, validating=False)
        return self._answer(request, self._mutate(request), started, validating=False)

    def validate(self, http: Request) -> Awaitable[Response] | Response:
        """The validating phase (quota may record a reservation through the API)."""
        started = http.received_at
        request = self._parse(http)
        if isinstance(request, Response):
            return request
        return self._review_when_synced(request, started, validating=True)

    def _parse(self, http: Request) -> AdmissionRequest | Response:
        """The request's AdmissionReview, or the 400 answer (JSON reason) for a body that is not one."""
        try:
            return parse_review(http.body, self.services.admission.bounds)
        except MalformedReview as exc:
            self.services.metrics.reviews.labels("malformed").inc()
            log.info("event=review_malformed remote=%s reason=%r", http.remote, str(exc))
            return error_response(400, str(exc))

    def _mutate(self, request: AdmissionRequest) -> Verdict:
        try:
            return self.services.admission.review(request)
        except Exception as exc:  # a bug must answer a review, not drop the connection
            return _internal_error(request, exc)

    async def _review_when_synced(
        self, request: AdmissionRequest, started: float, *, validating: bool
    ) -> Response:
        readiness = self.services.readiness
        if not readiness.synced():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SYNC_WAIT_SECONDS):
                    await readiness.wait_synced()
        if validating:
            try:
                verdict = await self.services.validation.review(request)  # quota may record through the API
            except Exception as exc:
                verdict = _internal_error(request, exc)
        else:
            verdict = self._mutate(request)
        if not readiness.synced() and (not verdict.allowed or verdict.patch):
            # Mutating from an empty cache would resolve against no GPUs and no namespace labels.
            verdict = Verdict(
                allowed=False,
                reason=NOT_READY,
                message="kube-vgpu webhook has not loaded the cluster state yet; retry in a few seconds",
            )
        return self._answer(request, verdict, started, validating=validating)

    def _answer(
        self, request: AdmissionRequest, verdict: Verdict, started: float, *, validating: bool
    ) -> Response:
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
        return Response(200, encode_json(encode_response(request.uid, verdict)))

    # -- operations ---------------------------------------------------------------------------

    def healthz(self, http: Request) -> Response:
        """Liveness: the process serves HTTP."""
        return json_response({"ok": True})

    def readyz(self, http: Request) -> Response:
        """Readiness: the cluster cache has synced and heard from the API recently."""
        readiness = self.services.readiness
        ready = readiness.ready()
        return json_response({"ready": ready, "synced": readiness.synced()}, 200 if ready else 503)

    def metrics(self, http: Request) -> Response:
        """Prometheus text exposition."""
        body = self.services.metrics.exposition()
        return Response(200, body, content_type="text/plain; version=0.0.4; charset=utf-8")


def _internal_error(request: AdmissionRequest, exc: Exception) -> Verdict:
    log.error("event=review_failed uid=%s error=%r", request.uid, f"{type(exc).__name__}: {exc}")
    return Verdict(
        allowed=False,
        reason=INTERNAL_ERROR,
        message=f"kube-vgpu webhook internal error: {type(exc).__name__}",
    )
