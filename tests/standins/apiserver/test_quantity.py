"""The stand-in API server decodes quantities as the real one does
(k8s.io/apimachinery/pkg/api/resource/quantity.go): every write stores the canonical form, read back through
the real client, and text that is no quantity fails the whole request with the decoder's 400."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kube_vgpu.kubeapi.client import ApiError, Kube
from kube_vgpu.standins.apiserver.quantity import REGEX_MESSAGE
from kube_vgpu.standins.apiserver.server import ApiServerStandin


@pytest.fixture
def kube(apiserver: ApiServerStandin) -> Iterator[Kube]:
    client = Kube(apiserver.api_client())
    yield client
    client.close()


def gpu_pod(name: str, memory: Any) -> dict[str, Any]:
    limits = {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": memory}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": limits}}]},
    }


def test_a_created_pod_reads_back_canonical_in_limits_and_defaulted_requests(kube: Kube) -> None:
    kube.create("pod", gpu_pod("p", "3000"), namespace="default")
    stored = kube.get("pod", "p", namespace="default")
    assert stored is not None
    resources = stored["spec"]["containers"][0]["resources"]
    assert resources["limits"]["volcano.sh/vgpu-memory"] == "3k"
    assert resources["requests"]["volcano.sh/vgpu-memory"] == "3k"  # requests default from limits


@pytest.mark.parametrize("bad", ["3 GiB", "abc", "1.2.3", "NaN", "3KiB", ""])
def test_text_that_is_no_quantity_fails_the_request_with_the_decoders_400(kube: Kube, bad: Any) -> None:
    with pytest.raises(ApiError) as info:
        kube.create("pod", gpu_pod("bad", bad), namespace="default")
    assert info.value.status == 400 and REGEX_MESSAGE in info.value.message
    assert kube.get("pod", "bad", namespace="default") is None  # nothing stored


def test_node_capacity_is_stored_canonical(apiserver: ApiServerStandin) -> None:
    apiserver.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
    apiserver.patch(
        "Node", "n1", {"status": {"capacity": {"volcano.sh/vgpu-memory": "160000"}}}, patch_type="merge"
    )
    node = apiserver.get("Node", "n1")
    assert node is not None and node["status"]["capacity"]["volcano.sh/vgpu-memory"] == "160k"
