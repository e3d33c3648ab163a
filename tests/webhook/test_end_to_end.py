"""The webhook end to end (`webhook.service.WebhookServer`) over real HTTPS, fed by the stand-in API
server through the real client: every rule's trigger and non-trigger, patches applied and
re-admitted, health/readiness/metrics wired, the request path making no API calls, and the quota step
wired (through the validating phase, forgetting a deleted namespace, reserving nothing for a missing
one).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from kube_vgpu.contract.config import Config, WebhookConfig
from kube_vgpu.contract.names import QUOTA_NUMBER_LABEL
from kube_vgpu.contract.register import decode_register
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.webhook.admission.review import decode_patch
from kube_vgpu.webhook.quota.gate import NamespaceQuota
from tests.support.webhook import (
    A10,
    A100,
    H100,
    NUMBER,
    ThreadedWebhook,
    apply,
    container,
    get,
    gpu_node,
    gpu_uuid,
    pod,
    post,
    review,
    volcano_type_allows,
    wait_for,
    write_tls,
)

MIXED = gpu_node("mixed", "hami-core", [(A10, 24576), (A100, 40960)])
H100_MIG = gpu_node("h100", "mig", [(H100, 81920)])


class Clock:
    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def start_webhook(
    apiserver: ApiServerStandin,
    tmp_path: Path,
    config: Config | None = None,
    clock: Callable[[], float] | None = None,
) -> ThreadedWebhook:
    apiserver.put(MIXED)
    apiserver.put(H100_MIG)
    apiserver.put(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": "optout", "labels": {"kube-vgpu.io/webhook": "ignore"}},
        }
    )
    apiserver.put(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": "small", "labels": {"quota.kube-vgpu.io/vgpu-number": "1"}},
        }
    )
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    return ThreadedWebhook(kubeconfig, write_tls(tmp_path / "tls"), config, clock=clock or time.monotonic)


@pytest.fixture
def webhook(apiserver: ApiServerStandin, tmp_path: Path, clock: Clock) -> Iterator[ThreadedWebhook]:
    with start_webhook(apiserver, tmp_path, clock=clock) as running:
        yield running


def admit_over_https(
    webhook: ThreadedWebhook, obj: Mapping[str, Any], uid: str = "u"
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Send a review; return the response body and the pod after its patch (checking idempotence)."""
    with contextlib.closing(webhook.connect()) as conn:
        status, answer = post(conn, review(obj, uid=uid))
        assert status == 200 and answer["response"]["uid"] == uid
        patched = apply(obj, decode_patch(answer))
        if answer["response"]["allowed"]:
            status, again = post(conn, review(patched, uid=uid + "-again"))
            assert status == 200 and again["response"]["allowed"] and "patch" not in again["response"], again
        return answer["response"], patched


def _annotations(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict(obj["metadata"].get("annotations") or {})


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    pod: dict[str, Any]
    allowed: bool
    check: Callable[[dict[str, Any], dict[str, Any]], bool]


def _volcano_types(obj: Mapping[str, Any]) -> set[str]:
    records = decode_register(MIXED["metadata"]["annotations"]["volcano.sh/node-vgpu-register"])
    return {r.type for r in records if volcano_type_allows(_annotations(obj), r.type)}


CASES = [
    Case("no-vgpu", pod(container("cpu")), True, lambda r, p: "patch" not in r),
    Case(
        "default-number",
        pod(container(cores=20)),
        True,
        lambda r, p: p["spec"]["containers"][0]["resources"]["requests"][NUMBER] == "1",
    ),
    Case(
        "number-kept",
        pod(container(number=2)),
        True,
        lambda r, p: "requests" not in p["spec"]["containers"][0]["resources"],
    ),
    Case(
        "scheduler-set", pod(container(memory=10)), True, lambda r, p: p["spec"]["schedulerName"] == "volcano"
    ),
    Case(
        "scheduler-other",
        pod(container(memory=10), schedulerName="mine"),
        True,
        lambda r, p: p["spec"]["schedulerName"] == "mine",
    ),
    Case(
        "mode-unknown",
        pod(container(memory=10), annotations={"volcano.sh/vgpu-mode": "mps"}),
        False,
        lambda r, p: "hami-core, mig" in r["status"]["message"],
    ),
    Case(
        "mode-resolved-mig",
        pod(container(memory=60000)),
        True,
        lambda r, p: _annotations(p)["volcano.sh/vgpu-mode"] == "mig",
    ),
    Case(
        "mode-default",
        pod(container(memory=10)),
        True,
        lambda r, p: _annotations(p)["volcano.sh/vgpu-mode"] == "hami-core",
    ),
    Case(
        "type-a10",
        pod(container(memory=10), annotations={"nvidia.com/use-gputype": "A10"}),
        True,
        lambda r, p: _volcano_types(p) == {f"NVIDIA-[{A10}]"},
    ),
    Case(
        "type-a100",
        pod(container(memory=10), annotations={"nvidia.com/use-gputype": "A100"}),
        True,
        lambda r, p: _volcano_types(p) == {f"NVIDIA-[{A100}]"},
    ),
    Case(
        "type-none",
        pod(container(memory=10), annotations={"nvidia.com/use-gputype": "V100"}),
        True,
        lambda r, p: "V100" in r["warnings"][0],
    ),
    Case(
        "uuid",
        pod(container(memory=10), annotations={"nvidia.com/use-gpuuuid": gpu_uuid("h100", 0)}),
        True,
        lambda r, p: _annotations(p)["volcano.sh/vgpu-use-gpuuuid"] == gpu_uuid("h100", 0),
    ),
    Case(
        "nouse-uuid-host",
        pod(container(memory=10), annotations={"volcano.sh/vgpu-nouse-gpuuuid": gpu_uuid("h100", 0)}),
        True,
        lambda r, p: '"NotIn"' in json.dumps(p["spec"]["affinity"]),
    ),
    Case(
        "forged",
        pod(container(memory=10), annotations={"volcano.sh/bind-phase": "success"}),
        False,
        lambda r, p: "bind-phase" in r["status"]["message"],
    ),
    Case(
        "privileged",
        pod(container(memory=10) | {"securityContext": {"privileged": True}}),
        False,
        lambda r, p: "privileged" in r["status"]["message"],
    ),
    Case(
        "malformed",
        pod(container("t", memory="3Gi")),
        False,
        lambda r, p: "write 3072" in r["status"]["message"] and "'t'" in r["status"]["message"],
    ),
    Case(
        # A pod's labels are its author's: the namespace's opt-out label on a pod exempts nothing.
        "opt-out-label-on-pod-exempts-nothing",
        pod(container(memory="3Gi"), labels={"kube-vgpu.io/webhook": "ignore"}),
        False,
        lambda r, p: "write 3072" in r["status"]["message"],
    ),
    Case(
        "opt-out-namespace",
        pod(container(memory=10), namespace="optout"),
        True,
        lambda r, p: "patch" not in r,
    ),
]


def test_every_rule_over_https(webhook: ThreadedWebhook) -> None:
    failures = []
    for case in CASES:
        response, patched = admit_over_https(webhook, case.pod, uid=case.name)
        if response["allowed"] != case.allowed or not case.check(response, patched):
            failures.append((case.name, response))
    assert failures == []


def test_strict_selectors_and_other_scheduler_denial_come_from_the_config_file(
    apiserver: ApiServerStandin, tmp_path: Path
) -> None:
    config = Config(webhook=WebhookConfig(strict_selectors=True, other_schedulers="deny"))
    with start_webhook(apiserver, tmp_path, config) as webhook:
        response, _ = admit_over_https(
            webhook, pod(container(memory=10), annotations={"nvidia.com/use-gputype": "V100"})
        )
        assert not response["allowed"] and "V100" in response["status"]["message"]
        response, _ = admit_over_https(webhook, pod(container(memory=10), schedulerName="mine"))
        assert not response["allowed"] and "mine" in response["status"]["message"]


def test_non_pod_and_non_create_reviews_pass(webhook: ThreadedWebhook) -> None:
    conn = webhook.connect()
    for body in (
        review(pod(container(memory=10)), operation="UPDATE"),
        review({"metadata": {"name": "c"}}, kind="ConfigMap"),
    ):
        status, answer = post(conn, body)
        assert status == 200 and answer["response"]["allowed"] and "patch" not in answer["response"]
    conn.close()


def test_health_readiness_and_metrics(
    webhook: ThreadedWebhook, apiserver: ApiServerStandin, clock: Clock
) -> None:
    conn = webhook.connect()
    assert get(conn, "/healthz")[0] == 200
    assert get(conn, "/readyz")[0] == 200
    post(conn, review(pod(container(memory="3Gi"))))
    post(conn, review(pod(container(memory=10))))
    body = webhook.metrics()
    # Metrics live on a port of their own: the admission port does not serve them.
    assert get(conn, "/metrics")[0] == 404
    assert 'kube_vgpu_webhook_reviews_total{outcome="denied"} 1.0' in body
    assert 'kube_vgpu_webhook_reviews_total{outcome="allowed"} 1.0' in body
    assert 'kube_vgpu_webhook_denials_total{reason="malformed-value"} 1.0' in body
    assert "kube_vgpu_webhook_review_duration_seconds_count 2.0" in body
    assert 'kube_vgpu_webhook_cache_objects{kind="gpu-node"} 2.0' in body
    assert 'kube_vgpu_webhook_cache_api_errors_total{kind="pod"} 0.0' in body
    assert "kube_vgpu_quota_used" in body  # the quota ledger's metrics share the registry
    # Outage: still serving from the last state; not ready once the staleness window passes.
    apiserver.set_outage(True)
    # Once every watch has failed to reconnect, whatever contact the outage's stream ends reported is in.
    cache = webhook.server.cache
    before = webhook.read(lambda: dict(cache.failures))
    wait_for(
        lambda: all(webhook.read(lambda: dict(cache.failures))[k] > before[k] for k in before),
        "every watch to fail to reconnect",
    )
    assert get(conn, "/readyz")[0] == 200  # within the staleness window
    clock.now += 121
    assert get(conn, "/readyz")[0] == 503
    status, answer = post(conn, review(pod(container(memory=60000))))
    assert status == 200 and answer["response"]["allowed"]
    conn.close()


def test_request_path_makes_no_api_calls(webhook: ThreadedWebhook, apiserver: ApiServerStandin) -> None:
    conn = webhook.connect()
    post(conn, review(pod(container(memory=10))))  # warm up
    apiserver.clear_requests()
    for i in range(40):
        status, _ = post(
            conn,
            review(pod(container(memory=10), annotations={"nvidia.com/use-gputype": "A100"}), uid=f"r{i}"),
        )
        assert status == 200
    conn.close()
    assert apiserver.requests() == []


def test_namespace_quota_is_enforced_by_the_validating_phase(webhook: ThreadedWebhook) -> None:
    def validate(name: str) -> dict[str, Any]:
        _, mutated = admit_over_https(webhook, pod(container(number=1), namespace="small", name=name))
        mutated["metadata"]["uid"] = f"uid-{name}"
        with contextlib.closing(webhook.connect()) as conn:
            status, answer = post(conn, review(mutated, uid=f"v-{name}"), path="/validate")
        assert status == 200 and "patch" not in answer["response"]
        response: dict[str, Any] = answer["response"]
        return response

    # Mutation books nothing, however often it is called: quota is the validating phase's.
    for again in range(3):
        assert admit_over_https(webhook, pod(container(number=1), namespace="small"), uid=f"m{again}")[0][
            "allowed"
        ]
    assert validate("a")["allowed"]
    second = validate("b")
    assert not second["allowed"] and "small" in second["status"]["message"]


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
    wait_for(lambda: webhook.read(lambda: cache.namespace_labels("team-a")) is not None, "the namespace")
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
    wait_for(lambda: webhook.read(lambda: cache.namespace_labels("team-a")) is None, "the deletion")
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
