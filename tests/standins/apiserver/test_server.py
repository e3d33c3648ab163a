"""The stand-in API server's objects, driven only through the official Kubernetes client: create,
replace, the three patch types, the status subresource, binding, deletion, discovery."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from kube_vgpu.standins.apiserver.server import ApiServerStandin
from tests.support.official_client import body, json_object, raw, status_of


@pytest.fixture
def core(apiserver: ApiServerStandin) -> Iterator[client.CoreV1Api]:
    with apiserver.api_client() as api_client:
        yield client.CoreV1Api(api_client)


def pod(name: str, namespace: str = "default", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}], **spec},
    }


def node(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}}}


# -- discovery and metadata ------------------------------------------------------------------------------


def test_version_reports_the_configured_release(apiserver: ApiServerStandin, core: client.CoreV1Api) -> None:
    apiserver.git_version = "v1.29.3"
    info = client.VersionApi(core.api_client).get_code()
    assert (info.git_version, info.major, info.minor) == ("v1.29.3", "1", "29")


def test_discovery_lists_groups_and_resources(core: client.CoreV1Api) -> None:
    groups = client.ApisApi(core.api_client).get_api_versions()
    assert {"admissionregistration.k8s.io", "coordination.k8s.io"} <= {g.name for g in groups.groups}
    resources = {r.name: r for r in core.get_api_resources().resources}
    assert resources["pods"].namespaced and not resources["nodes"].namespaced
    assert resources["pods/binding"].kind == "Binding"


def test_create_sets_server_metadata_and_defaults(core: client.CoreV1Api) -> None:
    created = core.create_namespaced_pod(
        "default",
        body(
            {
                **pod("p1"),
                "spec": {
                    "containers": [
                        {
                            "name": "c",
                            "image": "app",
                            "resources": {"limits": {"volcano.sh/vgpu-number": "2"}},
                        }
                    ]
                },
                "status": {"phase": "Running"},
            }
        ),
    )
    assert created.metadata.uid and created.metadata.creation_timestamp is not None
    assert int(created.metadata.resource_version or "") > 0
    # Requests default to limits; a created pod starts Pending whatever status it was sent with.
    assert created.spec.containers[0].resources.requests == {"volcano.sh/vgpu-number": "2"}
    assert created.spec.scheduler_name == "default-scheduler"
    assert created.status.phase == "Pending"
    namespace = core.read_namespace("default")
    assert (namespace.metadata.labels or {})["kubernetes.io/metadata.name"] == "default"


def test_create_twice_is_already_exists(core: client.CoreV1Api) -> None:
    core.create_namespaced_config_map("default", body({"metadata": {"name": "cm"}, "data": {"a": "1"}}))
    with pytest.raises(client.ApiException) as caught:
        core.create_namespaced_config_map("default", body({"metadata": {"name": "cm"}}))
    assert caught.value.status == 409
    assert status_of(caught.value)["reason"] == "AlreadyExists"
    assert status_of(caught.value)["message"] == 'configmaps "cm" already exists'


def test_generate_name_makes_distinct_names(core: client.CoreV1Api) -> None:
    made = body({"metadata": {"generateName": "job-"}, "data": {}})
    names = {str(core.create_namespaced_config_map("default", made).metadata.name) for _ in range(3)}
    assert len(names) == 3 and all(n.startswith("job-") and len(n) == len("job-") + 5 for n in names)


def test_create_in_a_missing_namespace_is_not_found(core: client.CoreV1Api) -> None:
    with pytest.raises(client.ApiException) as caught:
        core.create_namespaced_pod("nowhere", body(pod("p", namespace="nowhere")))
    assert caught.value.status == 404
    assert status_of(caught.value)["message"] == 'namespaces "nowhere" not found'


def test_invalid_pod_is_refused_with_the_field_named(core: client.CoreV1Api) -> None:
    with pytest.raises(client.ApiException) as caught:
        core.create_namespaced_pod(
            "default", body({"metadata": {"name": "Bad_Name"}, "spec": {"containers": []}})
        )
    assert caught.value.status == 422
    assert status_of(caught.value)["reason"] == "Invalid"
    assert 'metadata.name: Invalid value: "Bad_Name"' in status_of(caught.value)["message"]


def test_secret_string_data_is_stored_as_data(core: client.CoreV1Api) -> None:
    core.create_namespaced_secret(
        "default", body({"metadata": {"name": "s"}, "stringData": {"ca.crt": "PEM"}})
    )
    secret = core.read_namespaced_secret("s", "default")
    assert secret.data == {"ca.crt": "UEVN"} and secret.type == "Opaque"


# -- replace, patch, status, binding ---------------------------------------------------------------------


def test_stale_put_conflicts(apiserver: ApiServerStandin, core: client.CoreV1Api) -> None:
    apiserver.put(node("n1"))
    read = core.read_node("n1")
    core.patch_node("n1", {"metadata": {"labels": {"changed": "yes"}}})
    read.metadata.labels = {"mine": "yes"}
    with pytest.raises(client.ApiException) as caught:
        core.replace_node("n1", read)
    assert caught.value.status == 409
    assert status_of(caught.value)["message"] == (
        'Operation cannot be fulfilled on nodes "n1": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )
    fresh = core.read_node("n1")
    fresh.metadata.labels = {"mine": "yes"}
    assert core.replace_node("n1", fresh).metadata.labels == {"mine": "yes"}


def test_dict_patch_is_sent_as_strategic_merge(apiserver: ApiServerStandin, core: client.CoreV1Api) -> None:
    apiserver.put(
        {
            **pod("p"),
            "status": {
                "conditions": [
                    {"type": "Ready", "status": "False"},
                    {"type": "Initialized", "status": "True"},
                ]
            },
        }
    )
    core.patch_namespaced_pod_status(
        "p", "default", {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    )
    [request] = apiserver.requests("PATCH")
    assert request.content_type == "application/strategic-merge-patch+json"
    # Conditions merge by type: the one patched changes, the other stays.
    conditions = {c.type: c.status for c in core.read_namespaced_pod("p", "default").status.conditions}
    assert conditions == {"Ready": "True", "Initialized": "True"}


def test_merge_patch_replaces_lists_and_deletes_nulls(
    apiserver: ApiServerStandin, core: client.CoreV1Api
) -> None:
    apiserver.put(
        {
            **pod("p"),
            "metadata": {"name": "p", "namespace": "default", "labels": {"a": "1", "b": "2"}},
            "status": {
                "conditions": [
                    {"type": "Ready", "status": "False"},
                    {"type": "Initialized", "status": "True"},
                ]
            },
        }
    )
    core.patch_namespaced_pod(
        "p",
        "default",
        {"metadata": {"labels": {"a": None, "c": "3"}}},
        _content_type="application/merge-patch+json",
    )
    core.patch_namespaced_pod_status(
        "p",
        "default",
        {"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
        _content_type="application/merge-patch+json",
    )
    assert apiserver.requests("PATCH")[0].content_type == "application/merge-patch+json"
    patched = core.read_namespaced_pod("p", "default")
    assert patched.metadata.labels == {"b": "2", "c": "3"}
    assert [(c.type, c.status) for c in patched.status.conditions] == [("Ready", "True")]


def test_list_patch_is_sent_as_json_patch(apiserver: ApiServerStandin, core: client.CoreV1Api) -> None:
    apiserver.put(node("n1", {"keep": "yes"}))
    core.patch_node("n1", [{"op": "add", "path": "/metadata/labels/added", "value": "1"}])
    assert apiserver.requests("PATCH")[0].content_type == "application/json-patch+json"
    assert core.read_node("n1").metadata.labels == {"keep": "yes", "added": "1"}


def test_failed_json_patch_test_is_422_and_changes_nothing(
    apiserver: ApiServerStandin, core: client.CoreV1Api
) -> None:
    before = apiserver.put(node("n1", {"v": "1"}))
    operations = [
        {"op": "replace", "path": "/metadata/labels/v", "value": "2"},
        {"op": "test", "path": "/metadata/labels/v", "value": "1"},
    ]
    with pytest.raises(client.ApiException) as caught:
        core.patch_node("n1", operations)
    assert caught.value.status == 422 and status_of(caught.value)["reason"] == "Invalid"
    after = apiserver.get("Node", "n1")
    assert after is not None and after["metadata"] == before["metadata"]


def test_patch_with_stale_resource_version_conflicts(
    apiserver: ApiServerStandin, core: client.CoreV1Api
) -> None:
    stale = apiserver.put(node("n1"))["metadata"]["resourceVersion"]
    apiserver.patch("nodes", "n1", {"metadata": {"labels": {"x": "1"}}})
    with pytest.raises(client.ApiException) as caught:
        core.patch_node("n1", {"metadata": {"resourceVersion": stale, "labels": {"y": "1"}}})
    assert caught.value.status == 409 and status_of(caught.value)["reason"] == "Conflict"


def test_patch_that_changes_nothing_keeps_the_resource_version(
    apiserver: ApiServerStandin, core: client.CoreV1Api
) -> None:
    apiserver.put(node("n1", {"a": "1"}))
    first = core.patch_node("n1", {"metadata": {"labels": {"a": "2"}}}).metadata.resource_version
    again = core.patch_node("n1", {"metadata": {"labels": {"a": "2"}}}).metadata.resource_version
    assert again == first
    assert int(first or "") == apiserver.store.rv


def test_status_patch_changes_only_status(apiserver: ApiServerStandin, core: client.CoreV1Api) -> None:
    apiserver.put(node("n1", {"a": "1"}))
    core.patch_node_status(
        "n1",
        {
            "metadata": {"labels": {"a": "changed"}},
            "status": {"capacity": {"volcano.sh/vgpu-memory": "81920"}},
        },
    )
    patched = core.read_node("n1")
    assert patched.status.capacity == {"volcano.sh/vgpu-memory": "81920"}
    assert patched.metadata.labels == {"a": "1"}
    # And the main resource leaves status alone.
    core.patch_node("n1", {"metadata": {"labels": {"b": "2"}}, "status": {"capacity": {"cpu": "1"}}})
    patched = core.read_node("n1")
    assert patched.metadata.labels == {"a": "1", "b": "2"}
    assert patched.status.capacity == {"volcano.sh/vgpu-memory": "81920"}


def test_binding_sets_node_and_merges_annotations(
    apiserver: ApiServerStandin, core: client.CoreV1Api
) -> None:
    apiserver.put(
        {**pod("p"), "metadata": {"name": "p", "namespace": "default", "annotations": {"keep": "1"}}}
    )
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "p", "annotations": {"volcano.sh/vgpu-node": "n1", "keep": "2"}},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"},
    }
    # The real server answers a binding with a Status, which the client cannot read as a V1Binding;
    # callers take the raw response, as with a real cluster.
    response = raw(core.create_namespaced_pod_binding("p", "default", body(binding), _preload_content=False))
    assert response.status == 201 and json.loads(response.data)["status"] == "Success"
    bound = core.read_namespaced_pod("p", "default")
    assert bound.spec.node_name == "n1"
    assert bound.metadata.annotations == {"keep": "2", "volcano.sh/vgpu-node": "n1"}
    assert [(c.type, c.status) for c in bound.status.conditions] == [("PodScheduled", "True")]
    with pytest.raises(client.ApiException) as caught:
        core.create_namespaced_pod_binding("p", "default", body(binding), _preload_content=False)
    assert caught.value.status == 409
    assert status_of(caught.value)["message"] == (
        'Operation cannot be fulfilled on pods/binding "p": pod p is already assigned to node "n1"'
    )


def test_delete_answers_pods_with_the_object_and_others_with_a_status(
    apiserver: ApiServerStandin, core: client.CoreV1Api
) -> None:
    apiserver.put(pod("p"))
    apiserver.put(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "namespace": "default"}}
    )
    assert core.delete_namespaced_pod("p", "default").metadata.name == "p"
    answer = json_object(core.delete_namespaced_config_map("cm", "default"))
    assert answer["status"] == "Success" and answer["details"]["name"] == "cm"
    assert apiserver.get("pods", "p") is None and apiserver.get("configmaps", "cm") is None
    with pytest.raises(client.ApiException) as caught:
        core.delete_namespaced_pod("p", "default")
    assert caught.value.status == 404


def test_finalizers_hold_deletion_until_removed(apiserver: ApiServerStandin, core: client.CoreV1Api) -> None:
    apiserver.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "finalizers": ["x/y"]}})
    core.delete_node("n1")
    marked = apiserver.get("nodes", "n1")
    assert marked is not None and marked["metadata"]["deletionTimestamp"]
    core.patch_node("n1", {"metadata": {"finalizers": None}}, _content_type="application/merge-patch+json")
    assert apiserver.get("nodes", "n1") is None


def test_graceful_pod_deletion_waits_for_the_final_delete() -> None:
    with ApiServerStandin(graceful_pod_deletion=True) as api, api.api_client() as api_client:
        core = client.CoreV1Api(api_client)
        api.put(pod("p", nodeName="n1"))
        core.delete_namespaced_pod("p", "default")
        terminating = core.read_namespaced_pod("p", "default")
        assert terminating.metadata.deletion_timestamp is not None
        assert terminating.metadata.deletion_grace_period_seconds == 30
        core.delete_namespaced_pod("p", "default", grace_period_seconds=0)
        assert api.get("pods", "p") is None


def test_deleting_a_namespace_deletes_its_contents(
    apiserver: ApiServerStandin, core: client.CoreV1Api
) -> None:
    core.create_namespace(body({"metadata": {"name": "team"}}))
    core.create_namespaced_pod("team", body(pod("p", namespace="team")))
    apiserver.put(pod("other"))
    core.delete_namespace("team")
    assert apiserver.list("pods", "team") == []
    assert [p["metadata"]["name"] for p in apiserver.list("pods")] == ["other"]


def test_webhook_configuration_round_trip(core: client.CoreV1Api) -> None:
    admission = client.AdmissionregistrationV1Api(core.api_client)
    webhook = {
        "name": "vgpu.kube-vgpu.io",
        "admissionReviewVersions": ["v1"],
        "sideEffects": "NoneOnDryRun",
        "clientConfig": {"service": {"name": "kube-vgpu", "namespace": "kube-vgpu"}},
    }
    admission.create_mutating_webhook_configuration(
        body({"metadata": {"name": "kube-vgpu"}, "webhooks": [webhook]})
    )
    admission.patch_mutating_webhook_configuration(
        "kube-vgpu", [{"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": "Q0E="}]
    )
    read = admission.read_mutating_webhook_configuration("kube-vgpu")
    assert (read.webhooks or [])[0].client_config.ca_bundle == "Q0E="
    assert read.metadata.generation == 2
    with pytest.raises(client.ApiException) as caught:
        admission.read_mutating_webhook_configuration("missing")
    assert status_of(caught.value)["message"] == (
        'mutatingwebhookconfigurations.admissionregistration.k8s.io "missing" not found'
    )
