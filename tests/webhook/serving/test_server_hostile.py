"""Hostile and broken bodies over real HTTPS: every one gets a 4xx with a JSON reason or a denial naming
the field, never a 5xx, an "internal error" or a traceback; `/metrics` renders after odd names;
per-namespace state goes with its namespace.
"""

from __future__ import annotations

import copy
import gzip
import json
import logging
import socket
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kube_vgpu.contract.names import QUOTA_NUMBER_LABEL
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.webhook.admission.review import MAX_NESTING
from kube_vgpu.webhook.metrics import WebhookMetrics
from kube_vgpu.webhook.placement.selectors import AFFINITY_MARKER
from kube_vgpu.webhook.quota.gate import NamespaceQuota
from kube_vgpu.webhook.quota.metrics import QuotaMetrics
from tests.support.webhook import (
    A100,
    ThreadedWebhook,
    container,
    gpu_node,
    pod,
    post,
    review,
    write_tls,
)
from tests.support.webhook_quota import make_gate

LIMIT = 3 * 1024 * 1024


@pytest.fixture
def webhook(apiserver: ApiServerStandin, tmp_path: Path) -> Iterator[ThreadedWebhook]:
    apiserver.put(gpu_node("n1", "hami-core", [(A100, 40960)]))
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    with ThreadedWebhook(kubeconfig, write_tls(tmp_path / "tls")) as running:
        yield running


def _valid() -> dict[str, Any]:
    return review(pod(container(memory=1000)))


def _envelope(request: Any) -> bytes:
    return json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    ).encode()


def _with_request(**fields: Any) -> bytes:
    return _envelope(_valid()["request"] | fields)


def _nested_in_object(depth: int) -> bytes:
    doc = _valid()
    doc["request"]["object"]["spec"]["x"] = json.loads("[" * depth + "]" * depth)
    return json.dumps(doc).encode()


_OK_JSON = json.dumps(_valid()).encode()

# (case, body, extra headers, status, what the JSON reason says)
BAD_BODIES: list[tuple[str, bytes, dict[str, str], int, str]] = [
    ("deep arrays", b"[" * 100_000, {}, 400, "nests 100000 levels"),
    ("deep objects", b'{"a":' * 50_000 + b"1" + b"}" * 50_000, {}, 400, "nests 50000 levels"),
    ("deep inside a review", _nested_in_object(MAX_NESTING + 5), {}, 400, f"at most {MAX_NESTING}"),
    ("brackets in strings do not count", _envelope({"uid": "[" * 5000}), {}, 400, "request.kind"),
    ("garbage gzip", b"\x1f\x8b not really gzip", {"Content-Encoding": "gzip"}, 400, "cannot be read"),
    ("garbage deflate", b"not deflate at all", {"Content-Encoding": "deflate"}, 400, "cannot be read"),
    ("truncated gzip", gzip.compress(_OK_JSON)[:40], {"Content-Encoding": "gzip"}, 400, ""),
    ("gzip bomb", gzip.compress(b" " * (LIMIT * 4)), {"Content-Encoding": "gzip"}, 413, "limit"),
    ("5,000-digit integer", b'{"a": ' + b"9" * 5000 + b"}", {}, 400, "5000 characters"),
    ("30-digit integer in a review", _with_request(dryRun=10**30), {}, 400, "64 bits"),
    ("float overflow", b'{"a": 1e999}', {}, 400, "out of range"),
    ("NaN", b'{"a": NaN}', {}, 400, "NaN"),
    ("Infinity", b'{"a": -Infinity}', {}, 400, "Infinity"),
    ("invalid UTF-8", b'{"a": "\xff\xfe"}', {}, 400, "not UTF-8"),
    ("UTF-16", _OK_JSON.decode().encode("utf-16"), {}, 400, "not UTF-8"),
    ("surrogate encoded in UTF-8", b'{"a": "\xed\xa0\x80"}', {}, 400, "not UTF-8"),
    ("lone surrogate in the uid", _with_request(uid="\ud800"), {}, 400, "request.uid"),
    ("lone surrogate in the namespace", _with_request(namespace="a\udfff"), {}, 400, "request.namespace"),
    ("not a namespace name", _with_request(namespace="Team A\n"), {}, 400, "not a namespace name"),
    ("request is a list", _envelope([]), {}, 400, "request"),
    ("uid is a number", _with_request(uid=5), {}, 400, "request.uid"),
    ("kind is a string", _with_request(kind="Pod"), {}, 400, "request.kind"),
    ("operation is a number", _with_request(operation=1), {}, 400, "request.operation"),
    ("object is a string", _with_request(object="pod"), {}, 400, "request.object"),
    ("dryRun is a string", _with_request(dryRun="true"), {}, 400, "dryRun"),
    ("empty body", b"", {}, 400, "not JSON"),
    ("over the size limit", b" " * (LIMIT + 1), {}, 413, "limit"),
]


def _post_raw(webhook: ThreadedWebhook, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    conn = webhook.connect()
    try:
        conn.request("POST", "/mutate", body=body, headers={"Content-Type": "application/json"} | headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _no_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    noisy = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not noisy, [r.getMessage() for r in noisy]


def test_hostile_bodies_get_a_4xx_with_a_json_reason_and_no_traceback(
    webhook: ThreadedWebhook, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    for case, body, headers, status, reason in BAD_BODIES:
        got, raw = _post_raw(webhook, body, headers)
        assert got == status, (case, raw[:300])
        assert reason in json.loads(raw)["error"], (case, raw[:300])
    _no_tracebacks(caplog)
    conn = webhook.connect()
    assert post(conn, _valid())[1]["response"]["allowed"]  # the server is unharmed


def test_compressed_reviews_are_read(webhook: ThreadedWebhook) -> None:
    for encoding, data in (("gzip", gzip.compress(_OK_JSON)), ("deflate", zlib.compress(_OK_JSON))):
        status, raw = _post_raw(webhook, data, {"Content-Encoding": encoding})
        assert status == 200 and json.loads(raw)["response"]["allowed"], encoding


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
    webhook: ThreadedWebhook, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    conn = webhook.connect()
    for change, field in MISTYPED_PODS:
        doc = _valid()
        change(doc["request"]["object"])
        status, answer = post(conn, doc)
        assert status == 200, (field, answer)
        result = answer["response"]
        assert not result["allowed"], field
        assert field in result["status"]["message"], (field, result["status"]["message"])
        assert "internal error" not in result["status"]["message"]
    text = webhook.metrics()
    assert f'kube_vgpu_webhook_denials_total{{reason="malformed-object"}} {len(MISTYPED_PODS)}.0' in text
    _no_tracebacks(caplog)


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [("POST", "/healthz", 405), ("POST", "/nowhere", 404), ("POST", "/mutate", 400)],
)
def test_a_broken_body_sent_where_no_body_is_read_is_answered_and_the_connection_closed(
    webhook: ThreadedWebhook, caplog: pytest.LogCaptureFixture, method: str, path: str, status: int
) -> None:
    caplog.set_level(logging.INFO)
    conn = webhook.connect()
    conn.request(method, path, body=b"\x1f\x8b garbage" * 100, headers={"Content-Encoding": "gzip"})
    response = conn.getresponse()
    answer = json.loads(response.read())
    # A path that takes no body answers before reading it, a route that reads one refuses the
    # garbage; either way what follows on the connection cannot be framed, so it is closed.
    assert response.status == status and answer["error"], answer
    assert response.getheader("Connection") == "close"
    conn.close()
    _no_tracebacks(caplog)


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_compressed_body_that_ends_wrongly_in_one_packet_gets_a_400_without_traceback(
    webhook: ThreadedWebhook, caplog: pytest.LogCaptureFixture, encoding: str
) -> None:
    caplog.set_level(logging.INFO)
    whole = gzip.compress(_OK_JSON) if encoding == "gzip" else zlib.compress(_OK_JSON)
    # (body, whether it must be refused): a gzip stream missing only its trailer still decodes whole.
    cases = [(whole[:-5], False), (whole[: len(whole) // 2], True), (whole[:3], True)]
    cases.append((b"\x78\x9c" + b"\x00" * 8, True))
    for body, refused in cases:
        raw = socket.create_connection(("127.0.0.1", webhook.port), timeout=10)
        with webhook.tls.client_context().wrap_socket(raw, server_hostname="localhost") as sock:
            head = (
                f"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Encoding: {encoding}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            )
            sock.sendall(head.encode() + body)  # headers and body in one write: parsed at once
            status = int(sock.recv(4096).split(b" ")[1])
        assert (400 <= status < 500) if refused else status < 500, (body, status)
    _no_tracebacks(caplog)


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
    webhook: ThreadedWebhook, marker: str
) -> None:
    doc = review(pod(container(memory=1000), annotations={AFFINITY_MARKER: marker}))
    status, answer = post(webhook.connect(), doc)
    assert status == 200 and answer["response"]["allowed"], answer


def test_metrics_render_whatever_names_the_labels_hold() -> None:
    metrics = WebhookMetrics()
    quota_metrics = QuotaMetrics(make_gate(), metrics.registry)
    odd = ["a\ud800b", 'quo"te', "new\nline", "back\\slash", "\udfff", "ünï"]
    for name in odd:
        metrics.denials.labels(name).inc()
        quota_metrics.denied(name, "vgpu-number")
    text = metrics.exposition().decode("utf-8")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    denied = {s.labels["namespace"] for s in families["kube_vgpu_quota_denied"].samples}
    # Text survives as written; lone surrogates are shown as their escape, not dropped.
    assert {'quo"te', "new\nline", "back\\slash", "ünï", "a\\ud800b", "\\udfff"} <= denied
    reasons = {s.labels["reason"] for s in families["kube_vgpu_webhook_denials"].samples}
    assert "a\\ud800b" in reasons


def _wait(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_metrics_render_after_reviews_with_odd_names(webhook: ThreadedWebhook) -> None:
    conn = webhook.connect()
    for name in ("p\nq", 'p"q', "p\\q", "\ud800"):
        doc = review(pod(container(memory=1000), name=name))
        post(conn, doc)
    doc = copy.deepcopy(_valid())
    doc["request"]["namespace"] = "\ud800"
    assert post(conn, doc)[0] == 400
    assert list(text_string_to_metric_families(webhook.metrics()))


VALIDATE = "/validate"  # quota is decided in the validating phase, on the final object


def with_uid(obj: dict[str, Any]) -> dict[str, Any]:
    """The pod as validation sees it: the API server has given it a uid."""
    obj["metadata"]["uid"] = f"uid-{obj['metadata']['namespace']}-{obj['metadata']['name']}"
    return obj


def test_namespace_state_is_forgotten_with_the_namespace(
    webhook: ThreadedWebhook, apiserver: ApiServerStandin
) -> None:
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}
    ns["metadata"]["labels"] = {QUOTA_NUMBER_LABEL: "1"}  # type: ignore[index]
    apiserver.put(ns)
    cache = webhook.server.cache
    _wait(lambda: webhook.read(lambda: cache.namespace_labels("team-a")) is not None, "the namespace")
    conn = webhook.connect()
    first = review(with_uid(pod(container(number=1, memory=1000), name="a", namespace="team-a")), uid="r1")
    second = review(with_uid(pod(container(number=1, memory=1000), name="b", namespace="team-a")), uid="r2")
    assert post(conn, first, VALIDATE)[1]["response"]["allowed"]
    assert not post(conn, second, VALIDATE)[1]["response"]["allowed"]  # over quota: a denial series
    quota = webhook.server.services.validation.quota
    assert isinstance(quota, NamespaceQuota)
    ledger, shared = quota.ledger, quota.book

    def held() -> set[str]:
        return set(ledger.namespaces()) | set(shared.namespaces())

    assert 'namespace="team-a"' in webhook.metrics()
    assert "team-a" in webhook.read(held)

    apiserver.delete("Namespace", "team-a")
    _wait(lambda: webhook.read(lambda: cache.namespace_labels("team-a")) is None, "the deletion")
    assert 'namespace="team-a"' not in webhook.metrics()
    assert "team-a" not in webhook.read(held)


def test_a_review_for_a_namespace_that_does_not_exist_reserves_nothing(webhook: ThreadedWebhook) -> None:
    conn = webhook.connect()
    for i in range(50):
        doc = review(with_uid(pod(container(memory=1000), namespace=f"forged-{i}")), uid=f"f{i}")
        status, answer = post(conn, doc, VALIDATE)
        assert status == 200 and not answer["response"]["allowed"]
        assert f"namespace 'forged-{i}' is unknown to the webhook" in answer["response"]["status"]["message"]
    quota = webhook.server.services.validation.quota
    assert isinstance(quota, NamespaceQuota)
    assert not [n for n in webhook.read(quota.ledger.namespaces) if n.startswith("forged-")]
    assert not [n for n in quota.last_limits if n.startswith("forged-")]
