"""The in-memory store the quota unit tests run on keeps the contract of the real API (here the
stand-in API server through `Kube`) for every call the shared reservations make: the same answers,
the same refusals, step for step."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kube_vgpu.kubeapi.client import ApiError, Kube
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.webhook.quota.shared_store import ObjectApi
from tests.support.memory_store import MemoryStore

NS = "kube-vgpu"
OTHER = "team-a"


@pytest.fixture(params=["memory", "apiserver"])
def api(request: pytest.FixtureRequest) -> Iterator[ObjectApi]:
    if request.param == "memory":
        yield MemoryStore()
        return
    apiserver: ApiServerStandin = request.getfixturevalue("apiserver")
    for name in (NS, OTHER):
        apiserver.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    kube = Kube(apiserver.api_client(), component="webhook")
    try:
        yield kube
    finally:
        kube.close()


def configmap(
    name: str, data: dict[str, str], rv: str | None = None, namespace: str = NS, **labels: str
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels}
    if rv is not None:
        metadata["resourceVersion"] = rv
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}


def status(call: Callable[[], object]) -> int:
    with pytest.raises(ApiError) as refused:
        call()
    return refused.value.status


def rv(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["resourceVersion"])


def test_writes_carry_a_new_version_and_a_stale_one_is_refused(api: ObjectApi) -> None:
    assert api.get("configmap", "a", namespace=NS) is None
    first = api.create("configmap", configmap("a", {"u1": "1"}), namespace=NS)
    assert status(lambda: api.create("configmap", configmap("a", {}), namespace=NS)) == 409
    second = api.replace("configmap", "a", configmap("a", {"u2": "2"}, rv(first)), namespace=NS)
    assert rv(second) != rv(first)
    stored = api.get("configmap", "a", namespace=NS)
    assert stored is not None and stored["data"] == {"u2": "2"} and rv(stored) == rv(second)
    # The version it was decided on is gone: refused, and the stored object is unchanged.
    stale = configmap("a", {"u3": "3"}, rv(first))
    assert status(lambda: api.replace("configmap", "a", stale, namespace=NS)) == 409
    assert (api.get("configmap", "a", namespace=NS) or {})["data"] == {"u2": "2"}
    assert status(lambda: api.replace("configmap", "b", configmap("b", {}, rv(first)), namespace=NS)) == 404


def test_a_delete_with_a_stale_version_is_refused_and_a_missing_object_answers_false(api: ObjectApi) -> None:
    first = api.create("configmap", configmap("a", {}), namespace=NS)
    second = api.replace("configmap", "a", configmap("a", {"u": "1"}, rv(first)), namespace=NS)
    assert status(lambda: api.delete("configmap", "a", namespace=NS, resource_version=rv(first))) == 409
    assert api.delete("configmap", "a", namespace=NS, resource_version=rv(second)) is True
    assert api.get("configmap", "a", namespace=NS) is None
    assert api.delete("configmap", "a", namespace=NS) is False


def test_a_list_pages_through_the_labelled_objects_of_one_namespace(api: ObjectApi) -> None:
    for name in ("c", "a", "b"):
        api.create("configmap", configmap(name, {}, component="quota"), namespace=NS)
    api.create("configmap", configmap("other", {}, component="else"), namespace=NS)
    misplaced = configmap("elsewhere", {}, component="quota")
    assert status(lambda: api.create("configmap", misplaced, namespace=OTHER)) == 400
    api.create("configmap", configmap("elsewhere", {}, namespace=OTHER, component="quota"), namespace=OTHER)
    names: list[str] = []
    token: str | None = None
    for _ in range(10):
        page = api.list(
            "configmap",
            namespace=NS,
            label_selector="component=quota",
            limit=2,
            continue_token=token,
            timeout=None,
        )
        names += [item["metadata"]["name"] for item in page["items"]]
        token = page["metadata"].get("continue") or None
        if token is None:
            break
    assert sorted(names) == ["a", "b", "c"]
