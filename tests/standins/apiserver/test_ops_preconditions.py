"""The stand-in honours optimistic concurrency on ConfigMaps as kube-apiserver does (the shared quota
reservations rely on it), each behaviour pinned against the real server's code:

* create of an existing name: 409 AlreadyExists (`staging/src/k8s.io/apiserver/pkg/registry/generic/
  registry/store.go`, `Create`: `storage.NewKeyExistsError` -> `errors.NewAlreadyExists`);
* PUT with a stale `metadata.resourceVersion`: 409 Conflict, "the object has been modified; please
  apply your changes to the latest version and try again" (store.go `Update`, via
  `GuaranteedUpdate`'s precondition -> `errors.NewConflict(..., errObjectModified)`);
* PUT without a resourceVersion: an unconditional update, since the ConfigMap strategy's
  `AllowUnconditionalUpdate()` returns true (`pkg/registry/core/configmap/strategy.go`; store.go
  refuses such a PUT only when the strategy says false);
* merge and strategic merge patches that carry `metadata.resourceVersion`: the patched object carries
  it, so the update is conditional on it and a stale one is 409 Conflict (`staging/src/k8s.io/
  apiserver/pkg/endpoints/handlers/patch.go`: the patch is applied to the current object and the
  result goes through the same conditional update);
* a JSON patch whose `test` operation fails: 422 Invalid, nothing written (patch.go, `jsonPatcher`:
  a failed test is `errors.NewInvalid`-class, `StatusUnprocessableEntity`).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client

from kube_vgpu.kubeapi.client import ApiError, Kube, PatchType
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from tests.support.official_client import body, status_of

STALE = (
    'Operation cannot be fulfilled on configmaps "cm": the object has been modified; '
    "please apply your changes to the latest version and try again"
)


@pytest.fixture
def core(apiserver: ApiServerStandin) -> Iterator[client.CoreV1Api]:
    with apiserver.api_client() as api:
        yield client.CoreV1Api(api)


@pytest.fixture
def kube(apiserver: ApiServerStandin) -> Iterator[Kube]:
    k = Kube(apiserver.api_client())
    yield k
    k.close()


def make(core: client.CoreV1Api) -> str:
    created = core.create_namespaced_config_map(
        "default", body({"metadata": {"name": "cm"}, "data": {"a": "1"}})
    )
    return str(created.metadata.resource_version)


def test_creating_an_existing_configmap_is_already_exists(core: client.CoreV1Api) -> None:
    make(core)
    with pytest.raises(client.ApiException) as caught:
        core.create_namespaced_config_map("default", body({"metadata": {"name": "cm"}, "data": {"b": "2"}}))
    assert caught.value.status == 409 and status_of(caught.value)["reason"] == "AlreadyExists"
    assert core.read_namespaced_config_map("cm", "default").data == {"a": "1"}


def test_put_with_the_current_version_wins_and_a_stale_one_conflicts(core: client.CoreV1Api) -> None:
    rv = make(core)
    replacement = {"metadata": {"name": "cm", "resourceVersion": rv}, "data": {"a": "2"}}
    written = core.replace_namespaced_config_map("cm", "default", body(replacement))
    assert written.data == {"a": "2"} and written.metadata.resource_version != rv
    with pytest.raises(client.ApiException) as caught:
        core.replace_namespaced_config_map("cm", "default", body({**replacement, "data": {"a": "3"}}))
    assert caught.value.status == 409 and status_of(caught.value)["reason"] == "Conflict"
    assert status_of(caught.value)["message"] == STALE
    assert core.read_namespaced_config_map("cm", "default").data == {"a": "2"}


def test_put_without_a_version_is_unconditional_for_configmaps(core: client.CoreV1Api) -> None:
    make(core)
    core.patch_namespaced_config_map("cm", "default", {"data": {"a": "9"}})  # someone else wrote
    replacement = {"metadata": {"name": "cm"}, "data": {"b": "1"}}
    assert core.replace_namespaced_config_map("cm", "default", body(replacement)).data == {"b": "1"}


@pytest.mark.parametrize("patch_type", ["merge", "strategic"])
def test_a_patch_carrying_a_stale_version_conflicts(
    core: client.CoreV1Api, kube: Kube, patch_type: PatchType
) -> None:
    rv = make(core)
    core.patch_namespaced_config_map("cm", "default", {"data": {"a": "2"}})
    patch = {"metadata": {"resourceVersion": rv}, "data": {"a": "3"}}
    with pytest.raises(ApiError) as caught:
        kube.patch("configmap", "cm", patch, namespace="default", patch_type=patch_type)
    assert (caught.value.status, caught.value.reason, caught.value.message) == (409, "Conflict", STALE)
    current = core.read_namespaced_config_map("cm", "default")
    assert current.data == {"a": "2"}
    fresh = {"metadata": {"resourceVersion": current.metadata.resource_version}, "data": {"a": "4"}}
    assert kube.patch("configmap", "cm", fresh, namespace="default", patch_type=patch_type)["data"] == {
        "a": "4"
    }


def test_a_failed_json_patch_test_is_422_and_writes_nothing(core: client.CoreV1Api, kube: Kube) -> None:
    rv = make(core)
    ops = [
        {"op": "test", "path": "/data/a", "value": "0"},
        {"op": "replace", "path": "/data/a", "value": "5"},
    ]
    with pytest.raises(ApiError) as caught:
        kube.patch("configmap", "cm", ops, namespace="default", patch_type="json")
    assert (caught.value.status, caught.value.reason) == (422, "Invalid")
    current = core.read_namespaced_config_map("cm", "default")
    assert current.data == {"a": "1"} and current.metadata.resource_version == rv
