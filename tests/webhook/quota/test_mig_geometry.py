"""The webhook charges `mig` pods by the geometry in Volcano's device ConfigMap, read at start, and falls
back to the shipped geometry (with a warning) when the ConfigMap is absent or unreadable."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from kube_vgpu.contract.mig.shipped import DEFAULT_DEVICE_CONFIG_YAML
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from tests.support.webhook_bypass import Cluster, gpu_pod, start

# The shipped geometry with H100 80GB's 1g slot made 12000 MiB, so the charge tells which was read.
CUSTOM = DEFAULT_DEVICE_CONFIG_YAML.replace("memory: 9984", "memory: 12000")


def device_config(text: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "volcano-vgpu-device-config", "namespace": "kube-system"},
        "data": {"device-config.yaml": text},
    }


def tiny_mig_pod(name: str) -> dict[str, Any]:
    obj = gpu_pod("mem-15000", name, memory=1)
    obj["metadata"]["annotations"] = {"volcano.sh/vgpu-mode": "mig"}
    return obj


def charged_slot(cluster: Cluster) -> str:
    assert cluster.create(tiny_mig_pod("a"))["allowed"]
    answer = cluster.create(tiny_mig_pod("b"))
    assert not answer["allowed"]
    message: str = answer["status"]["message"]
    return message


def test_the_configmaps_geometry_is_used(apiserver: ApiServerStandin, tmp_path: Path) -> None:
    assert "memory: 9984" in DEFAULT_DEVICE_CONFIG_YAML  # the replacement above changes something
    apiserver.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kube-system"}})
    apiserver.put(device_config(CUSTOM))
    made = start(apiserver, tmp_path)
    with made.webhook:
        assert "requested 12000 MiB" in charged_slot(made)


def test_an_unreadable_configmap_falls_back_to_the_shipped_geometry(
    apiserver: ApiServerStandin, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    apiserver.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kube-system"}})
    apiserver.put(device_config("nvidia: [not, a, mapping]"))
    made = start(apiserver, tmp_path)
    with caplog.at_level(logging.WARNING, logger="kube_vgpu.webhook"), made.webhook:
        assert "requested 9984 MiB" in charged_slot(made)
    assert any("mig_geometry_default" in r.getMessage() for r in caplog.records)
