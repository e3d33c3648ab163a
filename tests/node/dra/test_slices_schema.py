"""What kube-vgpu publishes and what users write for it validates against Kubernetes 1.36's own
OpenAPI schema (kubernetes-validate, strict: an unknown field is an error)."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from kube_vgpu.node.dra.attributes import GpuFacts
from kube_vgpu.node.dra.slices import (
    DRIVER,
    PoolSpec,
    SliceOptions,
    Unhealthy,
    build_devices,
    build_slices,
)

KUBERNETES = "1.36.0"
FACTS = [
    GpuFacts(
        i,
        i,
        f"GPU-0000000{i}-aaaa",
        "NVIDIA H100 80GB HBM3",
        81559,
        "570.86.15",
        12080,
        (9, 0),
        "hopper",
        True,
    )
    for i in range(2)
]
A100 = f'device.attributes["{DRIVER}"].model.matches("(^|-)a100(-|$)")'
SICK = {"GPU-00000001-aaaa": Unhealthy("XID 79", "2026-01-02T03:04:05Z")}


def valid(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, KUBERNETES, strict=True)


@pytest.mark.parametrize(
    "options",
    [
        SliceOptions(True, True),
        SliceOptions(False, True),
        SliceOptions(True, False),
        SliceOptions(False, False),
    ],
)
def test_published_slices_validate(options: SliceOptions) -> None:
    for slice_ in build_slices(
        PoolSpec("node-a", "8d1c6f0e-0000-4000-8000-000000000001", 3, build_devices(FACTS, SICK, options))
    ):
        valid(slice_)


def test_a_schema_violation_is_caught() -> None:
    (slice_,) = build_slices(PoolSpec("n", "u", 1, build_devices(FACTS[:1], {}, SliceOptions())))
    slice_["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"]["validRange"]["stride"] = "1Mi"
    with pytest.raises(kubernetes_validate.ValidationError):
        valid(slice_)


def test_the_device_class_and_claims_users_write_validate() -> None:
    device_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DRIVER},
        "spec": {
            "selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}],
            "extendedResourceName": "kube-vgpu.io/vgpu",
        },
    }
    slice_of_card = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "a100-20g-30pct", "namespace": "team-a"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": DRIVER,
                                "selectors": [{"cel": {"expression": A100}}],
                                "capacity": {"requests": {"memory": "20Gi", "cores": "30"}},
                            },
                        }
                    ]
                }
            }
        },
    }
    two_distinct = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "two-slices", "namespace": "team-a"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpus",
                        "firstAvailable": [
                            {
                                "name": "h100",
                                "deviceClassName": DRIVER,
                                "count": 2,
                                "capacity": {"requests": {"memory": "10Gi"}},
                            },
                            {"name": "any", "deviceClassName": DRIVER, "count": 2},
                        ],
                    }
                ],
                "constraints": [{"requests": ["gpus"], "distinctAttribute": f"{DRIVER}/uuid"}],
            }
        },
    }
    for obj in (device_class, slice_of_card, two_distinct):
        valid(obj)
