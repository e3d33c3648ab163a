"""The stand-in serves resource.k8s.io/v1 as kube-apiserver does, driven through the official client.

Pinned against Kubernetes' own code:

* `pkg/registry/resource/resourceslice/strategy.go`: slices are cluster-scoped, selectable by
  `spec.nodeName` and `spec.driver` (`toSelectableFields`), get generation 1 on create and +1 on a
  spec change; `dropDisabledFields` removes `allowMultipleAllocations` and capacity `requestPolicy`
  while DRAConsumableCapacity is off, device `taints` while DRADeviceTaints is off, unless the stored
  slice already uses them;
* `pkg/registry/resource/resourceclaim/strategy.go`: a created claim's status is reset; the spec is
  immutable (`ValidateResourceClaimUpdate`); status is written through `/status`;
* `pkg/apis/resource/v1/defaults.go`: `allocationMode` defaults to ExactCount and `count` to 1;
* `pkg/apis/resource/validation/validation.go`: the checks exercised below, with their messages.
* `pkg/registry/resource/utils.go`: `adminAccess` only in namespaces labelled
  `resource.kubernetes.io/admin-access: "true"`, checked on the spec at create and on new
  allocation results.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from kubernetes import client, watch

from kube_vgpu.standins.apiserver.dra import REQUEST_FIELDS, FeatureGates
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from tests.support.official_client import json_object, status_of

GROUP, VERSION = "resource.k8s.io", "v1"
DRIVER = "vgpu.kube-vgpu.io"


@pytest.fixture
def custom(apiserver: ApiServerStandin) -> Iterator[client.CustomObjectsApi]:
    with apiserver.api_client() as api_client:
        yield client.CustomObjectsApi(api_client)


def a_slice(
    node: str = "n1", *, driver: str = DRIVER, devices: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver.split('.', maxsplit=1)[0]}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices if devices is not None else [shared_gpu("gpu-0")],
        },
    }


def shared_gpu(name: str, *, taint: bool = False) -> dict[str, Any]:
    device: dict[str, Any] = {
        "name": name,
        "attributes": {"productName": {"string": "NVIDIA A100-SXM4-80GB"}, "index": {"int": 0}},
        "allowMultipleAllocations": True,
        "capacity": {
            "memory": {
                "value": "81920Mi",
                "requestPolicy": {
                    "default": "81920Mi",
                    "validRange": {"min": "256Mi", "max": "81920Mi", "step": "1Mi"},
                },
            },
            "cores": {
                "value": "100",
                "requestPolicy": {"default": "100", "validRange": {"min": "1", "step": "1"}},
            },
        },
    }
    if taint:
        device["taints"] = [{"key": f"{DRIVER}/unhealthy", "value": "xid-79", "effect": "NoSchedule"}]
    return device


def create_slice(custom: client.CustomObjectsApi, body: dict[str, Any]) -> dict[str, Any]:
    created: dict[str, Any] = json_object(
        custom.create_cluster_custom_object(GROUP, VERSION, "resourceslices", body)
    )
    return created


def test_discovery_lists_the_four_resources(apiserver: ApiServerStandin) -> None:
    with apiserver.api_client() as api_client:
        found = client.ResourceV1Api(api_client).get_api_resources()
    scopes = {r.name: r.namespaced for r in found.resources}
    assert scopes == {
        "resourceslices": False,
        "deviceclasses": False,
        "resourceclaims": True,
        "resourceclaims/status": True,
        "resourceclaimtemplates": True,
    }


def test_consumable_capacity_fields_are_dropped_while_the_gate_is_off(
    apiserver: ApiServerStandin, custom: client.CustomObjectsApi
) -> None:
    stored = create_slice(custom, a_slice())
    device = stored["spec"]["devices"][0]
    assert "allowMultipleAllocations" not in device
    assert device["capacity"] == {"memory": {"value": "80Gi"}, "cores": {"value": "100"}}


def test_consumable_capacity_fields_are_kept_while_the_gate_is_on(
    apiserver: ApiServerStandin, custom: client.CustomObjectsApi
) -> None:
    apiserver.feature_gates = FeatureGates.of_release(36)
    device = create_slice(custom, a_slice())["spec"]["devices"][0]
    assert device["allowMultipleAllocations"] is True
    assert device["capacity"]["memory"]["requestPolicy"] == {
        "default": "80Gi",
        "validRange": {"min": "256Mi", "max": "80Gi", "step": "1Mi"},
    }


def test_a_stored_slice_keeps_gated_fields_it_already_uses(
    apiserver: ApiServerStandin, custom: client.CustomObjectsApi
) -> None:
    # strategy.go: fields in use in the old object are never dropped on update, gate or not.
    apiserver.feature_gates = FeatureGates(consumable_capacity=True, device_taints=True)
    create_slice(custom, a_slice(devices=[shared_gpu("gpu-0", taint=True)]))
    apiserver.feature_gates = FeatureGates()
    body = a_slice(devices=[shared_gpu("gpu-0", taint=True), shared_gpu("gpu-1")])
    body["spec"]["pool"]["generation"] = 2
    updated = json_object(
        custom.replace_cluster_custom_object(GROUP, VERSION, "resourceslices", "n1-vgpu", body)
    )
    assert [d.get("allowMultipleAllocations") for d in updated["spec"]["devices"]] == [True, True]
    assert updated["spec"]["devices"][0]["taints"][0]["effect"] == "NoSchedule"


def test_taints_are_dropped_while_the_gate_is_off_and_kept_while_on(
    apiserver: ApiServerStandin, custom: client.CustomObjectsApi
) -> None:
    off = create_slice(custom, a_slice("n1", devices=[shared_gpu("gpu-0", taint=True)]))
    assert "taints" not in off["spec"]["devices"][0]
    apiserver.feature_gates = FeatureGates(device_taints=True)
    on = create_slice(custom, a_slice("n2", devices=[shared_gpu("gpu-0", taint=True)]))
    (taint,) = on["spec"]["devices"][0]["taints"]
    # defaults.go (SetDefaults_DeviceTaint): timeAdded is set when the taint is stored without one.
    assert taint.pop("timeAdded").endswith("Z")
    assert taint == {"key": f"{DRIVER}/unhealthy", "value": "xid-79", "effect": "NoSchedule"}


def test_slices_are_selected_by_node_and_by_driver(
    apiserver: ApiServerStandin, custom: client.CustomObjectsApi
) -> None:
    create_slice(custom, a_slice("n1"))
    create_slice(custom, a_slice("n2"))
    create_slice(custom, a_slice("n1", driver="gpu.nvidia.com"))

    def names(selector: str) -> list[str]:
        found = json_object(
            custom.list_cluster_custom_object(GROUP, VERSION, "resourceslices", field_selector=selector)
        )
        return [item["metadata"]["name"] for item in found["items"]]

    assert names("spec.nodeName=n1") == ["n1-gpu", "n1-vgpu"]
    assert names(f"spec.driver={DRIVER}") == ["n1-vgpu", "n2-vgpu"]
    assert names(f"spec.nodeName=n1,spec.driver={DRIVER}") == ["n1-vgpu"]
    with pytest.raises(client.ApiException) as refused:
        names("spec.pool.name=n1")
    assert refused.value.status == 400
    assert "spec.pool.name" in status_of(refused.value)["message"]


def test_slices_are_watched_with_their_field_selector(
    apiserver: ApiServerStandin, custom: client.CustomObjectsApi
) -> None:
    listed = json_object(custom.list_cluster_custom_object(GROUP, VERSION, "resourceslices"))
    create_slice(custom, a_slice("n2"))
    create_slice(custom, a_slice("n1"))
    events = watch.Watch().stream(
        custom.list_cluster_custom_object,
        GROUP,
        VERSION,
        "resourceslices",
        field_selector="spec.nodeName=n1",
        resource_version=listed["metadata"]["resourceVersion"],
        timeout_seconds=5,
    )
    first = next(events)
    assert (first["type"], first["object"]["metadata"]["name"]) == ("ADDED", "n1-vgpu")


def test_slice_generation_follows_spec_changes_only(custom: client.CustomObjectsApi) -> None:
    created = create_slice(custom, a_slice())
    assert created["metadata"]["generation"] == 1
    labelled = json_object(
        custom.patch_cluster_custom_object(
            GROUP, VERSION, "resourceslices", "n1-vgpu", {"metadata": {"labels": {"a": "b"}}}
        )
    )
    assert labelled["metadata"]["generation"] == 1
    bumped = json_object(
        custom.patch_cluster_custom_object(
            GROUP, VERSION, "resourceslices", "n1-vgpu", {"spec": {"pool": {"generation": 2}}}
        )
    )
    assert bumped["metadata"]["generation"] == 2


def test_slice_driver_pool_and_node_are_immutable(custom: client.CustomObjectsApi) -> None:
    create_slice(custom, a_slice())
    with pytest.raises(client.ApiException) as refused:
        custom.patch_cluster_custom_object(
            GROUP, VERSION, "resourceslices", "n1-vgpu", {"spec": {"nodeName": "n2", "pool": {"name": "n2"}}}
        )
    assert refused.value.status == 422
    message = status_of(refused.value)["message"]
    assert "spec.pool.name: Invalid value: field is immutable" in message
    assert "spec.nodeName: Invalid value: field is immutable" in message


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"name": "GPU_0"}, 'spec.devices[0].name: Invalid value: "GPU_0"'),
        ({"name": "g" * 64}, "must be no more than 63 characters"),
        ({"attributes": {"driverVersion": {"version": "550.54"}}}, "must be a string compatible with semver"),
        ({"attributes": {"productName": {"string": "x" * 65}}}, "Too long: may not be more than 64 bytes"),
        ({"attributes": {"both": {"int": 1, "bool": True}}}, "exactly one value must be specified"),
        ({"attributes": {"a" * 33: {"int": 1}}}, "Too long: may not be more than 32 bytes"),
        ({"attributes": {"x/y/z": {"int": 1}}}, "must not contain more than one slash"),
        ({"taints": [{"key": "k", "effect": "PreferNoSchedule"}]}, 'Unsupported value: "PreferNoSchedule"'),
    ],
)
def test_device_validation_names_the_field(
    apiserver: ApiServerStandin, custom: client.CustomObjectsApi, change: dict[str, Any], expected: str
) -> None:
    apiserver.feature_gates = FeatureGates.of_release(36)
    with pytest.raises(client.ApiException) as refused:
        create_slice(custom, a_slice(devices=[{**shared_gpu("gpu-0"), **change}]))
    assert refused.value.status == 422
    assert expected in status_of(refused.value)["message"]


def test_a_request_policy_without_multiple_allocations_is_forbidden(
    apiserver: ApiServerStandin, custom: client.CustomObjectsApi
) -> None:
    apiserver.feature_gates = FeatureGates.of_release(36)
    device = shared_gpu("gpu-0")
    del device["allowMultipleAllocations"]
    with pytest.raises(client.ApiException) as refused:
        create_slice(custom, a_slice(devices=[device]))
    assert (
        "capacity[memory].requestPolicy: Forbidden: allowMultipleAllocations must be true"
        in (status_of(refused.value)["message"])
    )


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ({"default": "100Mi", "validRange": {"min": "256Mi"}}, "default is less than min"),
        ({"default": "80Gi", "validRange": {"min": "81Gi"}}, "min is larger than capacity value"),
        ({"default": "80Gi", "validRange": {"min": "1Mi", "step": "0"}}, "must be greater than zero"),
        ({"default": "1000", "validRange": {"min": "1Mi", "step": "1Mi"}}, "not a multiple of a given step"),
        ({"validRange": {"min": "1Mi"}}, "default: Required value"),
        ({"default": "1Gi", "validValues": ["2Gi", "1Gi"]}, "sorted in ascending order"),
    ],
)
def test_request_policy_validation(
    apiserver: ApiServerStandin, custom: client.CustomObjectsApi, policy: dict[str, Any], expected: str
) -> None:
    apiserver.feature_gates = FeatureGates.of_release(36)
    device = shared_gpu("gpu-0")
    device["capacity"]["memory"]["requestPolicy"] = policy
    with pytest.raises(client.ApiException) as refused:
        create_slice(custom, a_slice(devices=[device]))
    assert expected in status_of(refused.value)["message"]


def test_device_count_limit_on_both_sides(
    apiserver: ApiServerStandin, custom: client.CustomObjectsApi
) -> None:
    many = [{"name": f"gpu-{i}"} for i in range(128)]
    assert len(create_slice(custom, a_slice("n1", devices=many))["spec"]["devices"]) == 128
    with pytest.raises(client.ApiException) as refused:
        create_slice(custom, a_slice("n2", devices=[*many, {"name": "gpu-128"}]))
    assert "spec.devices: Too many: 129: must have at most 128 items" in status_of(refused.value)["message"]
    # With taints (an advanced feature) the limit is 64 (ResourceSliceMaxDevicesWithAdvancedFeatures).
    apiserver.feature_gates = FeatureGates(device_taints=True)
    tainted = [{"name": f"gpu-{i}", "taints": [{"key": "k", "effect": "NoSchedule"}]} for i in range(65)]
    with pytest.raises(client.ApiException) as refused:
        create_slice(custom, a_slice("n3", devices=tainted))
    assert "must have at most 64 items" in status_of(refused.value)["message"]
    assert len(create_slice(custom, a_slice("n4", devices=tainted[:64]))["spec"]["devices"]) == 64


def test_a_capacity_that_is_no_quantity_is_a_bad_request(custom: client.CustomObjectsApi) -> None:
    device = {"name": "gpu-0", "capacity": {"memory": {"value": "eighty gigs"}}}
    with pytest.raises(client.ApiException) as refused:
        create_slice(custom, a_slice(devices=[device]))
    assert refused.value.status == 400
    assert "spec.devices[0].capacity[memory].value" in status_of(refused.value)["message"]


# -- DeviceClass -------------------------------------------------------------------------------------


def device_class(**spec: Any) -> dict[str, Any]:
    selectors = [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DeviceClass",
        "metadata": {"name": DRIVER},
        "spec": {"selectors": selectors, **spec},
    }


def test_device_class_extended_resource_name_follows_its_gate(
    apiserver: ApiServerStandin, custom: client.CustomObjectsApi
) -> None:
    off = json_object(
        custom.create_cluster_custom_object(
            GROUP, VERSION, "deviceclasses", device_class(extendedResourceName="kube-vgpu.io/vgpu")
        )
    )
    assert "extendedResourceName" not in off["spec"]
    assert off["metadata"]["generation"] == 1
    custom.delete_cluster_custom_object(GROUP, VERSION, "deviceclasses", DRIVER)
    apiserver.feature_gates = FeatureGates.of_release(36)
    on = json_object(
        custom.create_cluster_custom_object(
            GROUP, VERSION, "deviceclasses", device_class(extendedResourceName="kube-vgpu.io/vgpu")
        )
    )
    assert on["spec"]["extendedResourceName"] == "kube-vgpu.io/vgpu"


def test_device_class_selector_needs_an_expression(custom: client.CustomObjectsApi) -> None:
    body = device_class()
    body["spec"]["selectors"] = [{"cel": {}}]
    with pytest.raises(client.ApiException) as refused:
        custom.create_cluster_custom_object(GROUP, VERSION, "deviceclasses", body)
    assert "spec.selectors[0].cel.expression: Required value" in status_of(refused.value)["message"]


# -- ResourceClaim and ResourceClaimTemplate --------------------------------------------------------


def claim(name: str = "c1", **request: Any) -> dict[str, Any]:
    exactly = {"deviceClassName": DRIVER, **request}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def create_claim(custom: client.CustomObjectsApi, body: dict[str, Any]) -> dict[str, Any]:
    created: dict[str, Any] = json_object(
        custom.create_namespaced_custom_object(GROUP, VERSION, "default", "resourceclaims", body)
    )
    return created


def test_claim_defaults_and_canonical_capacity(
    apiserver: ApiServerStandin, custom: client.CustomObjectsApi
) -> None:
    apiserver.feature_gates = FeatureGates(consumable_capacity=True)
    body = claim(capacity={"requests": {"memory": "30720Mi", "cores": 30}})
    body["status"] = {"allocation": {"devices": {"results": []}}}
    created = create_claim(custom, body)
    exactly = created["spec"]["devices"]["requests"][0]["exactly"]
    assert exactly["allocationMode"] == "ExactCount"
    assert exactly["count"] == 1
    assert exactly["capacity"]["requests"] == {"memory": "30Gi", "cores": "30"}
    assert "status" not in created  # a created claim's status is reset


@pytest.mark.parametrize("consumable_capacity", [False, True])
def test_claim_capacity_requests_follow_the_consumable_capacity_gate(
    apiserver: ApiServerStandin, custom: client.CustomObjectsApi, consumable_capacity: bool
) -> None:
    """resourceclaimspec.DropDisabledFields: with DRAConsumableCapacity off (1.34 and 1.35 by
    default) a claim or template asking a slice is stored asking a whole device, in `exactly` and
    in every firstAvailable alternative; with it on the amounts are kept."""
    apiserver.feature_gates = FeatureGates(consumable_capacity=consumable_capacity)
    amounts = {"requests": {"memory": "1Gi", "cores": "10"}}
    body = claim(capacity=amounts)
    sub = {"name": "small", "deviceClassName": DRIVER, "capacity": amounts}
    body["spec"]["devices"]["requests"].append({"name": "either", "firstAvailable": [sub]})
    template = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t"},
        "spec": {"spec": body["spec"]},
    }
    stored_claim = create_claim(custom, body)["spec"]
    stored_template = json_object(
        custom.create_namespaced_custom_object(GROUP, VERSION, "default", "resourceclaimtemplates", template)
    )["spec"]["spec"]
    for spec in (stored_claim, stored_template):
        exact, (alternative,) = (r.get("exactly") or r["firstAvailable"] for r in spec["devices"]["requests"])
        assert ("capacity" in exact) is consumable_capacity
        assert ("capacity" in alternative) is consumable_capacity


def constrained(name: str, constraint: dict[str, Any]) -> dict[str, Any]:
    body = claim(name, count=2)
    body["spec"]["devices"]["constraints"] = [{"requests": ["gpu"], **constraint}]
    return body


def test_distinct_attribute_is_dropped_while_consumable_capacity_is_off(
    apiserver: ApiServerStandin, custom: client.CustomObjectsApi
) -> None:
    """resourceclaimspec.DropDisabledFields drops constraints[].distinctAttribute with capacity
    while DRAConsumableCapacity is off; validateDeviceConstraint then finds neither attribute and,
    with the gate off, asks for matchAttribute. Claims and templates alike; matchAttribute passes."""
    distinct = {"distinctAttribute": f"{DRIVER}/uuid"}
    with pytest.raises(client.ApiException) as refused:
        create_claim(custom, constrained("distinct", distinct))
    assert refused.value.status == 422
    assert "spec.devices.constraints[0].matchAttribute: Required value" in status_of(refused.value)["message"]
    template = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t"},
        "spec": {"spec": constrained("t", distinct)["spec"]},
    }
    with pytest.raises(client.ApiException) as refused:
        custom.create_namespaced_custom_object(GROUP, VERSION, "default", "resourceclaimtemplates", template)
    assert (
        "spec.spec.devices.constraints[0].matchAttribute: Required value"
        in (status_of(refused.value)["message"])
    )
    match = create_claim(custom, constrained("match", {"matchAttribute": f"{DRIVER}/productName"}))
    assert match["spec"]["devices"]["constraints"][0]["matchAttribute"] == f"{DRIVER}/productName"


def test_distinct_attribute_is_kept_while_consumable_capacity_is_on(
    apiserver: ApiServerStandin, custom: client.CustomObjectsApi
) -> None:
    apiserver.feature_gates = FeatureGates(consumable_capacity=True)
    stored = create_claim(custom, constrained("distinct", {"distinctAttribute": f"{DRIVER}/uuid"}))
    assert stored["spec"]["devices"]["constraints"] == [
        {"requests": ["gpu"], "distinctAttribute": f"{DRIVER}/uuid"}
    ]
    # With the gate on, a constraint with neither attribute is refused in the gate's own words.
    with pytest.raises(client.ApiException) as refused:
        create_claim(custom, constrained("neither", {}))
    assert (
        'spec.devices.constraints[0]: Required value: exactly one of "matchAttribute" or '
        '"distinctAttribute" is required'
    ) in status_of(refused.value)["message"]


def test_claim_spec_is_immutable(custom: client.CustomObjectsApi) -> None:
    create_claim(custom, claim())
    with pytest.raises(client.ApiException) as refused:
        custom.patch_namespaced_custom_object(
            GROUP, VERSION, "default", "resourceclaims", "c1", {"spec": {"devices": {"requests": []}}}
        )
    assert refused.value.status == 422
    assert "spec: Invalid value: field is immutable" in status_of(refused.value)["message"]
    labelled = json_object(
        custom.patch_namespaced_custom_object(
            GROUP, VERSION, "default", "resourceclaims", "c1", {"metadata": {"labels": {"a": "b"}}}
        )
    )
    assert labelled["metadata"]["labels"] == {"a": "b"}


def test_claim_status_is_written_through_the_status_subresource(custom: client.CustomObjectsApi) -> None:
    create_claim(custom, claim())
    allocation = {
        "devices": {
            "results": [
                {
                    "request": "gpu",
                    "driver": DRIVER,
                    "pool": "n1",
                    "device": "gpu-0",
                    "consumedCapacity": {"memory": "81920Mi"},
                }
            ]
        }
    }
    ignored = json_object(
        custom.patch_namespaced_custom_object(
            GROUP, VERSION, "default", "resourceclaims", "c1", {"status": {"allocation": allocation}}
        )
    )
    assert "status" not in ignored
    written = json_object(
        custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, "default", "resourceclaims", "c1", {"status": {"allocation": allocation}}
        )
    )
    result = written["status"]["allocation"]["devices"]["results"][0]
    assert result["consumedCapacity"] == {"memory": "80Gi"}
    changed = json.loads(json.dumps(allocation))
    changed["devices"]["results"][0]["device"] = "gpu-1"
    with pytest.raises(client.ApiException) as refused:
        custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, "default", "resourceclaims", "c1", {"status": {"allocation": changed}}
        )
    assert "status.allocation: Invalid value: field is immutable" in status_of(refused.value)["message"]


def test_reserved_for_needs_an_allocation(custom: client.CustomObjectsApi) -> None:
    create_claim(custom, claim())
    reserved = [{"resource": "pods", "name": "p", "uid": "u"}]
    with pytest.raises(client.ApiException) as refused:
        custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, "default", "resourceclaims", "c1", {"status": {"reservedFor": reserved}}
        )
    assert "may not be specified when `allocated` is not set" in status_of(refused.value)["message"]


@pytest.mark.parametrize(
    ("request_fields", "expected", "code"),
    [
        ({"count": -3}, "count: Invalid value: -3: must be greater than zero", 422),
        ({"allocationMode": "Some"}, 'allocationMode: Unsupported value: "Some"', 422),
        ({"deviceClassName": "Not_A_Class"}, 'deviceClassName: Invalid value: "Not_A_Class"', 422),
        ({"deviceClassName": "c" * 254}, "deviceClassName: Invalid value", 422),
        ({"capacity": {"requests": {"memory": "lots"}}}, "capacity.requests[memory]", 400),
        ({"capacity": {"requests": {"memory": [1]}}}, "capacity.requests[memory]", 400),
    ],
)
def test_hostile_claims_get_one_clear_error(
    custom: client.CustomObjectsApi, request_fields: dict[str, Any], expected: str, code: int
) -> None:
    with pytest.raises(client.ApiException) as refused:
        create_claim(custom, claim(**request_fields))
    assert refused.value.status == code
    assert expected in status_of(refused.value)["message"]


def test_a_count_of_zero_means_unset_and_defaults_to_one(custom: client.CustomObjectsApi) -> None:
    # Go cannot tell 0 from an absent int64 count: defaults.go sets 1, and -1 is the first refused.
    created = create_claim(custom, claim(count=0))
    assert created["spec"]["devices"]["requests"][0]["exactly"]["count"] == 1
    with pytest.raises(client.ApiException):
        create_claim(custom, claim("c2", count=-1))


def test_claim_name_and_request_limits(custom: client.CustomObjectsApi) -> None:
    with pytest.raises(client.ApiException) as refused:
        create_claim(custom, claim("c" * 254))
    assert refused.value.status == 422
    assert create_claim(custom, claim("c" * 253))["metadata"]["name"] == "c" * 253
    body = claim("many")
    body["spec"]["devices"]["requests"] = [
        {"name": f"r{i}", "exactly": {"deviceClassName": DRIVER}} for i in range(33)
    ]
    with pytest.raises(client.ApiException) as refused:
        create_claim(custom, body)
    assert "requests: Too many: 33: must have at most 32 items" in status_of(refused.value)["message"]
    body["spec"]["devices"]["requests"] = body["spec"]["devices"]["requests"][:32]
    assert len(create_claim(custom, body)["spec"]["devices"]["requests"]) == 32


def test_exactly_and_first_available_are_exclusive(custom: client.CustomObjectsApi) -> None:
    body = claim()
    body["spec"]["devices"]["requests"][0]["firstAvailable"] = [{"name": "a", "deviceClassName": DRIVER}]
    with pytest.raises(client.ApiException) as refused:
        create_claim(custom, body)
    assert (
        "exactly one of `exactly` or `firstAvailable` is required, but multiple fields are set"
        in (status_of(refused.value)["message"])
    )
    del body["spec"]["devices"]["requests"][0]["exactly"]
    created = create_claim(custom, body)
    assert created["spec"]["devices"]["requests"][0]["firstAvailable"][0]["count"] == 1


def test_claim_templates_are_namespaced_and_immutable(custom: client.CustomObjectsApi) -> None:
    template = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t1"},
        "spec": {"spec": claim()["spec"]},
    }
    created = json_object(
        custom.create_namespaced_custom_object(GROUP, VERSION, "default", "resourceclaimtemplates", template)
    )
    assert created["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] == 1
    with pytest.raises(client.ApiException) as refused:
        custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            "default",
            "resourceclaimtemplates",
            "t1",
            {"spec": {"spec": {"devices": {"requests": []}}}},
        )
    assert "spec: Invalid value: field is immutable" in status_of(refused.value)["message"]


# -- unknown fields (fieldValidation) ---------------------------------------------------------------


def test_the_known_request_fields_are_kubernetes_1_36s() -> None:
    schemas = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / "v1.36.0-local-strict"
    for kind, fields in REQUEST_FIELDS.items():
        schema = json.loads((schemas / f"{kind.lower()}-resource-v1.json").read_text())
        assert set(schema["properties"]) == fields, kind


def raw_create(
    apiserver: ApiServerStandin, body: dict[str, Any], query: str = ""
) -> tuple[int, Any, list[str]]:
    url = f"{apiserver.url}/apis/{GROUP}/{VERSION}/namespaces/default/resourceclaims{query}"
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": "Bearer standin-token"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read()), response.headers.get_all("Warning") or []
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), []


def test_unknown_request_fields_are_dropped_with_a_warning(apiserver: ApiServerStandin) -> None:
    apiserver.feature_gates = FeatureGates(consumable_capacity=True)
    body = claim(capacity={"requests": {"memory": "1Gi"}, "limits": {"memory": "2Gi"}})
    body["spec"]["devices"]["requests"][0]["exactly"]["capcity"] = {"requests": {"memory": "1Gi"}}
    code, stored, warnings = raw_create(apiserver, body)
    assert code == 201
    exactly = stored["spec"]["devices"]["requests"][0]["exactly"]
    assert "capcity" not in exactly
    assert exactly["capacity"] == {"requests": {"memory": "1Gi"}}
    assert warnings == [
        '299 - "unknown field \\"spec.devices.requests[0].exactly.capcity\\""',
        '299 - "unknown field \\"spec.devices.requests[0].exactly.capacity.limits\\""',
    ]


def test_unknown_request_fields_are_refused_under_strict_validation(apiserver: ApiServerStandin) -> None:
    body = claim()
    body["spec"]["devices"]["requests"][0]["firstAvailable"] = None
    body["spec"]["devices"]["requests"][0]["priority"] = 1
    code, status, _ = raw_create(apiserver, body, "?fieldValidation=Strict")
    assert code == 400
    assert status["message"] == 'strict decoding error: unknown field "spec.devices.requests[0].priority"'
    assert apiserver.get("ResourceClaim", "c1", "default") is None
    code, status, _ = raw_create(apiserver, claim(), "?fieldValidation=Loose")
    assert code == 400
    assert "fieldValidation must be one of" in status["message"]


# -- admin access (pkg/registry/resource/utils.go: AuthorizedForAdmin, AuthorizedForAdminStatus) ------

ADMIN_LABEL = "resource.kubernetes.io/admin-access"
ADMIN_FORBIDDEN = (
    "Forbidden: admin access to devices requires the `resource.kubernetes.io/admin-access: true` "
    "label on the containing namespace"
)


def namespace(apiserver: ApiServerStandin, name: str, labels: dict[str, str]) -> None:
    with apiserver.api_client() as api_client:
        body = client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels))
        client.CoreV1Api(api_client).create_namespace(body)


def admin_claim(name: str = "monitor") -> dict[str, Any]:
    body = claim(name, adminAccess=True, allocationMode="All")
    body["spec"]["devices"]["requests"].insert(0, {"name": "work", "exactly": {"deviceClassName": DRIVER}})
    return body


@pytest.mark.parametrize(
    ("labels", "admitted"),
    [
        ({ADMIN_LABEL: "true"}, True),
        ({}, False),
        ({ADMIN_LABEL: "false"}, False),
        ({ADMIN_LABEL: "True"}, False),  # the value is compared as written: "true" only
        ({"admin-access": "true"}, False),
    ],
)
def test_admin_access_is_stored_only_in_a_namespace_labelled_for_it(
    apiserver: ApiServerStandin, custom: client.CustomObjectsApi, labels: dict[str, str], admitted: bool
) -> None:
    """A tenant cannot escape its quota with adminAccess: where the namespace lacks the label the
    API server refuses the claim (and a template) before any validating webhook is called, naming
    the first request that asks it."""
    namespace(apiserver, "team-a", labels)
    template = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t"},
        "spec": {"spec": admin_claim()["spec"]},
    }
    for plural, body in (("resourceclaims", admin_claim()), ("resourceclaimtemplates", template)):
        if admitted:
            created = json_object(
                custom.create_namespaced_custom_object(GROUP, VERSION, "team-a", plural, body)
            )
            spec = created["spec"] if plural == "resourceclaims" else created["spec"]["spec"]
            assert spec["devices"]["requests"][1]["exactly"]["adminAccess"] is True
            continue
        with pytest.raises(client.ApiException) as refused:
            custom.create_namespaced_custom_object(GROUP, VERSION, "team-a", plural, body)
        assert refused.value.status == 422
        message = status_of(refused.value)["message"]
        assert f"spec.devices.requests[1].adminAccess: {ADMIN_FORBIDDEN}" in message
        assert apiserver.list(plural, "team-a") == []


def test_admin_access_false_or_absent_needs_no_label(custom: client.CustomObjectsApi) -> None:
    assert create_claim(custom, claim("off", adminAccess=False))["metadata"]["name"] == "off"
    assert create_claim(custom, claim("unset"))["metadata"]["name"] == "unset"


def test_an_admin_access_allocation_needs_the_label_too(
    apiserver: ApiServerStandin, custom: client.CustomObjectsApi
) -> None:
    """The status check: an allocation result with adminAccess written into an unlabelled
    namespace is refused (one already stored is kept on later writes)."""
    namespace(apiserver, "ops", {ADMIN_LABEL: "true"})
    result = {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-0", "adminAccess": True}
    status = {"status": {"allocation": {"devices": {"results": [result]}}}}
    create_claim(custom, claim())
    with pytest.raises(client.ApiException) as refused:
        custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, "default", "resourceclaims", "c1", status
        )
    assert (
        f"status.allocation.devices.results[0].adminAccess: {ADMIN_FORBIDDEN}"
        in status_of(refused.value)["message"]
    )
    custom.create_namespaced_custom_object(GROUP, VERSION, "ops", "resourceclaims", claim())
    written = json_object(
        custom.patch_namespaced_custom_object_status(GROUP, VERSION, "ops", "resourceclaims", "c1", status)
    )
    assert written["status"]["allocation"]["devices"]["results"][0]["adminAccess"] is True
    with apiserver.api_client() as api_client:  # the label goes; the stored allocation stays valid
        client.CoreV1Api(api_client).patch_namespace("ops", {"metadata": {"labels": {ADMIN_LABEL: None}}})
    reserved = {"status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}]}}
    kept = json_object(
        custom.patch_namespaced_custom_object_status(GROUP, VERSION, "ops", "resourceclaims", "c1", reserved)
    )
    assert kept["status"]["reservedFor"][0]["name"] == "p"
