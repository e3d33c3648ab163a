"""Answering a parsed AdmissionReview: the path's phase decides, the verdict is counted and logged,
and the answer is encoded. Nothing here knows of HTTP: `webhook.serving.server` reads the body and
sends the bytes this returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from kube_vgpu.webhook.admission.mutation import Admission
from kube_vgpu.webhook.admission.review import AdmissionRequest, Verdict, encode_json, encode_response
from kube_vgpu.webhook.admission.validation import Validation
from kube_vgpu.webhook.metrics import WebhookMetrics

log = logging.getLogger(__name__)

# How long a review waits for a cache that has not finished its first list before it is refused.
SYNC_WAIT_SECONDS = 2.0


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


def answer(
    services: Services, request: AdmissionRequest, started: float, validating: bool
) -> bytes | Awaitable[bytes]:
    """The encoded AdmissionReview answering `request` (`started`: `time.perf_counter()` when its
    head arrived). A mutating review is answered at once once the cache has synced; a validating one
    may record a quota reservation through the API, so it is awaited."""
    if validating or not services.readiness.synced():
        return _answer_when_synced(services, request, started, validating)
    return _encode(services, request, _mutate(services, request), started, validating)


def _mutate(services: Services, request: AdmissionRequest) -> Verdict:
    try:
        return services.admission.review(request)
    except Exception as exc:  # a bug must answer a review, not drop the connection
        return _internal_error(request, exc)


async def _answer_when_synced(
    services: Services, request: AdmissionRequest, started: float, validating: bool
) -> bytes:
    readiness = services.readiness
    if not readiness.synced():
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SYNC_WAIT_SECONDS):
                await readiness.wait_synced()
    if validating:
        try:
            verdict = await services.validation.review(request)
        except Exception as exc:
            verdict = _internal_error(request, exc)
    else:
        verdict = _mutate(services, request)
    if not readiness.synced() and (not verdict.allowed or verdict.patch):
        # Mutating from an empty cache would resolve against no GPUs and no namespace labels.
        message = "kube-vgpu webhook has not loaded the cluster state yet; retry in a few seconds"
        verdict = Verdict(allowed=False, reason="not-ready", message=message)
    return _encode(services, request, verdict, started, validating)


def _encode(
    services: Services, request: AdmissionRequest, verdict: Verdict, started: float, validating: bool
) -> bytes:
    metrics = services.metrics
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
    return encode_json(encode_response(request.uid, verdict))


def _pod_name(request: AdmissionRequest) -> str:
    metadata = (request.object or {}).get("metadata")
    if not isinstance(metadata, dict):  # a mistyped pod, denied; its name is whatever it says
        return "?"
    return str(metadata.get("name") or f"{metadata.get('generateName') or ''}*")


def _internal_error(request: AdmissionRequest, exc: Exception) -> Verdict:
    log.error("event=review_failed uid=%s error=%r", request.uid, f"{type(exc).__name__}: {exc}")
    message = f"kube-vgpu webhook internal error: {type(exc).__name__}"
    return Verdict(allowed=False, reason="internal-error", message=message)
