"""The stand-in API server refuses the core v1 Events the real one refuses (kubernetes
`pkg/apis/core/validation/events.go`, `legacyValidateEvent`): an event's namespace must match its
involved object's, a cluster-scoped object's legacy event lives in `default`, and an event with
`eventTime` names its reporting component and instance."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kube_vgpu.kubeapi.client import ApiError, Kube
from kube_vgpu.standins.apiserver.server import ApiServerStandin


@pytest.fixture
def kube(apiserver: ApiServerStandin) -> Iterator[Kube]:
    apiserver.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}})
    client = Kube(apiserver.api_client())
    yield client
    client.close()


def event(name: str, involved: dict[str, str], **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name},
        "involvedObject": involved,
        "reason": "Test",
        "message": "m",
        **extra,
    }


POD = {"kind": "Pod", "namespace": "team-a", "name": "p", "uid": "u"}
NODE = {"kind": "Node", "name": "n1", "uid": "n1"}


def test_events_in_the_right_namespace_are_stored(kube: Kube) -> None:
    assert kube.create("event", event("p.1", POD), namespace="team-a")["involvedObject"]["name"] == "p"
    assert (
        kube.create("event", event("n1.1", NODE), namespace="default")["metadata"]["namespace"] == "default"
    )
    with_time = event(
        "n1.2", NODE, eventTime="2026-11-24T05:00:00.000000Z", reportingComponent="kube-vgpu.io/node",
        reportingInstance="n1",
    )  # fmt: skip
    assert kube.create("event", with_time, namespace="kube-system")["reason"] == "Test"


@pytest.mark.parametrize(
    ("body", "namespace", "cause"),
    [
        (event("p.2", POD), "default", "involvedObject.namespace"),
        (event("n1.3", NODE), "team-a", "involvedObject.namespace"),
        (event("n1.4", NODE, eventTime="2026-11-24T05:00:00.000000Z", reportingInstance="n1"), "default",
         "reportingComponent: Required value"),
        (event("n1.5", NODE, eventTime="2026-11-24T05:00:00.000000Z", reportingComponent="x"), "default",
         "reportingInstance: Required value"),
        (event("n1.6", NODE, reason="R" * 129), "default", "reason"),
    ],
)  # fmt: skip
def test_events_the_real_server_refuses_are_refused(
    kube: Kube, body: dict[str, Any], namespace: str, cause: str
) -> None:
    with pytest.raises(ApiError) as info:
        kube.create("event", body, namespace=namespace)
    assert info.value.status == 422 and cause in info.value.message
