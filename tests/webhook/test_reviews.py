"""Answering a parsed review (`webhook.reviews.answer`), without HTTP: a mistyped pod is denied naming
the field (never an internal error or a traceback) and counted; a damaged marker annotation is
ignored; odd pod names leave `/metrics` rendering.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kube_vgpu.contract.config import Config
from kube_vgpu.webhook import reviews
from kube_vgpu.webhook.admission.mutation import Admission
from kube_vgpu.webhook.admission.review import MalformedReview, parse_review
from kube_vgpu.webhook.admission.validation import Validation
from kube_vgpu.webhook.metrics import WebhookMetrics
from kube_vgpu.webhook.placement.inventory import Inventory
from kube_vgpu.webhook.placement.selectors import AFFINITY_MARKER
from tests.support.admission_view import AllowAllQuota, StaticView
from tests.support.webhook import A100, container, gpu_node, no_tracebacks, pod, review


async def _synced() -> None:
    return None


@pytest.fixture
def services() -> reviews.Services:
    """What a synced webhook with one A100 node answers with (every pod fits its quota)."""
    inventory = Inventory()
    inventory.upsert(gpu_node("n1", "hami-core", [(A100, 40960)]))
    view = StaticView(inventory, {"default": {}})
    config = Config()
    readiness = reviews.Readiness(synced=lambda: True, ready=lambda: True, wait_synced=_synced)
    return reviews.Services(
        admission=Admission(config, view),
        validation=Validation(config, view, AllowAllQuota()),
        readiness=readiness,
        metrics=WebhookMetrics(),
    )


def _mutate(services: reviews.Services, doc: dict[str, Any]) -> dict[str, Any]:
    """The `response` of the mutating phase's answer to `doc`."""
    request = parse_review(json.dumps(doc).encode(), services.admission.bounds)
    answer = reviews.answer(services, request, time.perf_counter(), validating=False)
    assert isinstance(answer, bytes)  # a synced webhook answers a mutating review at once
    response: dict[str, Any] = json.loads(answer)["response"]
    return response


def _valid() -> dict[str, Any]:
    return review(pod(container(memory=1000)))


def _set(*path: str | int, value: Any) -> Callable[[dict[str, Any]], None]:
    """A change of the pod: set the item at `path` (keys and list indexes) to `value`."""

    def change(obj: dict[str, Any]) -> None:
        node: Any = obj
        for part in path[:-1]:
            node = node[part] if isinstance(part, int) else node.setdefault(part, {})
        node[path[-1]] = value

    return change


MEMORY = "volcano.sh/vgpu-memory"
LIMITS = ("spec", "containers", 0, "resources", "limits")
# (the change, what the denial must name)
MISTYPED_PODS: list[tuple[Callable[[dict[str, Any]], None], str]] = [
    (_set("metadata", value=[1]), "metadata must be an object, got a list"),
    (_set("spec", value=None), "spec must be an object, got null"),
    (_set("spec", "containers", 0, "resources", value=None), "resources must be an object, got null"),
    (_set(*LIMITS, value=None), "limits must be an object, got null"),
    (_set("metadata", "name", value=5), "metadata.name must be a string, got a number"),
    (_set("metadata", "annotations", value=["a"]), "metadata.annotations must be an object, got a list"),
    (_set("metadata", "labels", value={"a": None}), "metadata.labels['a'] must be a string, got null"),
    (_set("metadata", "namespace", value="Not_A_Namespace"), "not a namespace name"),
    (_set("metadata", "annotations", value={"x": "\ud83d"}), "lone UTF-16 surrogate"),
    (_set("spec", "schedulerName", value=["volcano"]), "spec.schedulerName must be a string"),
    (_set("spec", "nodeName", value={"n": 1}), "spec.nodeName must be a string"),
    (_set("spec", "containers", value={}), "spec.containers must be a list"),
    (_set("spec", "containers", 0, value="main"), "spec.containers[0] must be an object"),
    (_set("spec", "containers", 0, "name", value={"a": 1}), "spec.containers[0].name must be a string"),
    (_set("spec", "containers", 0, "resources", value=[]), "spec.containers[0].resources must be an object"),
    (_set(*LIMITS, MEMORY, value=1000), f"limits['{MEMORY}'] must be a string"),
    (_set(*LIMITS, MEMORY, value="9" * 5000), "5000 characters"),
    (
        _set("spec", "containers", 0, "securityContext", value={"privileged": "true"}),
        "privileged must be true or false",
    ),
    (
        _set("spec", "containers", 0, "env", value=["LD_PRELOAD=x"]),
        "spec.containers[0].env[0] must be an object",
    ),
    (_set("spec", "initContainers", value=[{"name": 1}]), "spec.initContainers[0].name must be a string"),
    (_set("spec", "volumes", value=[{"name": "v", "hostPath": "/"}]), "hostPath must be an object"),
    (
        _set(
            "spec", "affinity", value={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": []}}
        ),
        "requiredDuringSchedulingIgnoredDuringExecution must be an object",
    ),
    (
        _set(
            "spec",
            "affinity",
            value={
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "values": [1]}]}]
                    }
                }
            },
        ),
        "matchExpressions[0].values[0] must be a string",
    ),
]


def test_a_mistyped_pod_is_denied_naming_the_field(
    services: reviews.Services, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    for change, field in MISTYPED_PODS:
        doc = _valid()
        change(doc["request"]["object"])
        result = _mutate(services, doc)
        assert not result["allowed"], field
        assert field in result["status"]["message"], (field, result["status"]["message"])
        assert "internal error" not in result["status"]["message"]
    text = services.metrics.exposition().decode()
    assert f'kube_vgpu_webhook_denials_total{{reason="malformed-object"}} {len(MISTYPED_PODS)}.0' in text
    no_tracebacks(caplog)


@pytest.mark.parametrize(
    "marker",
    [
        "[" * 5000 + "]" * 5000,  # deeper than the decoder's recursion limit
        "[" * 500 + "]" * 500,  # decodes, then nothing in it is a requirement
        json.dumps([{"key": json.loads("[" * 300 + "]" * 300), "operator": "Exists"}]),
        json.dumps([{"key": "k", "operator": "In", "values": [{"deep": {}}]}]),
        "{not json",
    ],
)
def test_a_damaged_or_deeply_nested_marker_annotation_is_ignored(
    services: reviews.Services, marker: str
) -> None:
    doc = review(pod(container(memory=1000), annotations={AFFINITY_MARKER: marker}))
    assert _mutate(services, doc)["allowed"]


def test_metrics_render_after_reviews_with_odd_names(services: reviews.Services) -> None:
    for name in ("p\nq", 'p"q', "p\\q"):
        assert _mutate(services, review(pod(container(memory=1000), name=name)))["allowed"]
    # A lone surrogate in the review's name or namespace is refused before any phase (HTTP 400).
    lone_name = review(pod(container(memory=1000), name="\ud800"))
    lone_namespace = _valid()
    lone_namespace["request"]["namespace"] = "\ud800"
    for doc in (lone_name, lone_namespace):
        with pytest.raises(MalformedReview):
            parse_review(json.dumps(doc).encode(), services.admission.bounds)
    assert list(text_string_to_metric_families(services.metrics.exposition().decode()))
