"""`kubeapi.permissions`: a client built for a component refuses calls the table does not declare,
before any request leaves; one built without a component (the stand-ins' own) is not held to it."""

from __future__ import annotations

import pytest

from kube_vgpu.kubeapi.client import Kube
from kube_vgpu.kubeapi.permissions import API_CALLS, COMPONENTS, Component, UndeclaredCall, declared
from kube_vgpu.standins.apiserver.server import ApiServerStandin


def calls_of(component: Component) -> frozenset[tuple[str, str, str, str | None]]:
    """(group, resource, verb, named) of every call one component makes."""
    return frozenset((c.group, c.resource, c.verb, c.named) for c in API_CALLS if c.component == component)


def test_an_undeclared_call_is_refused_before_any_request(apiserver: ApiServerStandin) -> None:
    kube = Kube(apiserver.api_client(), component="webhook")
    apiserver.clear_requests()
    with pytest.raises(UndeclaredCall, match=r"webhook calls get on pods .*permissions\.py"):
        kube.get("pod", "p", namespace="default")
    with pytest.raises(UndeclaredCall, match="patch on nodes/status"):
        kube.patch("node", "n", {}, subresource="status")
    with pytest.raises(UndeclaredCall, match="create on pods/binding"):
        kube.create_binding("p", "default", {})
    assert apiserver.requests() == []
    kube.close()


def test_a_declared_call_goes_through(apiserver: ApiServerStandin) -> None:
    kube = Kube(apiserver.api_client(), component="webhook")
    assert kube.list("namespace")["items"] is not None
    node = Kube(apiserver.api_client(), component="node")
    assert node.get("configmap", "absent", namespace="kube-system") is None
    kube.close()
    node.close()


def test_a_client_without_a_component_is_not_checked(apiserver: ApiServerStandin) -> None:
    kube = Kube(apiserver.api_client())
    assert kube.get("pod", "absent", namespace="default") is None
    kube.close()


def test_every_component_declares_something_and_calls_are_unique() -> None:
    assert {c.component for c in API_CALLS} == set(COMPONENTS)
    # One verb on two different objects (a named one, and the shared quota ConfigMaps) is two calls.
    keys = [(c.component, c.group, c.resource, c.verb, c.named) for c in API_CALLS]
    assert len(keys) == len(set(keys))
    assert declared("node", "patch", "nodes/status", "")
    assert not declared("webhook", "patch", "pods", "")
    assert ("", "pods", "watch", None) in calls_of("webhook")
