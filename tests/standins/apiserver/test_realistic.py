"""The benchmark pods have the shape and size `kubectl get pod -o json` shows on a 1.30 cluster, and one
in ten asks for a vGPU in the canonical quantities the API server stores."""

from __future__ import annotations

import orjson

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.contract.resources import parse_pod
from kube_vgpu.standins.apiserver.quantity import canonical
from kube_vgpu.standins.apiserver.realistic import realistic_pod


def test_a_realistic_pod_is_a_running_deployment_pod_of_about_6_kb() -> None:
    sizes = [len(orjson.dumps(realistic_pod(i))) for i in range(0, 2000, 7)]
    assert min(sizes) >= 5500 and max(sizes) <= 7000
    pod = realistic_pod(123)
    meta, spec, status = pod["metadata"], pod["spec"], pod["status"]
    assert [m["manager"] for m in meta["managedFields"]] == ["kube-controller-manager", "kubelet"]
    assert meta["ownerReferences"][0]["kind"] == "ReplicaSet" and meta["name"].startswith(
        meta["generateName"]
    )
    sources = spec["volumes"][0]["projected"]["sources"]
    assert [next(iter(s)) for s in sources] == ["serviceAccountToken", "configMap", "downwardAPI"]
    (container,) = spec["containers"]
    assert len(container["env"]) == 8 and "livenessProbe" in container and "readinessProbe" in container
    assert len(status["conditions"]) == 5 and status["containerStatuses"][0]["ready"] is True
    assert len({realistic_pod(i)["metadata"]["uid"] for i in range(100)}) == 100


def test_one_pod_in_ten_asks_for_a_vgpu_in_canonical_quantities() -> None:
    names = ResourceNames()
    asks = [parse_pod(realistic_pod(i), names).asks_vgpu for i in range(1000)]
    assert sum(asks) == 100 and asks[0] and not asks[1] and asks[10]
    limits = realistic_pod(10)["spec"]["containers"][0]["resources"]["limits"]
    assert limits[names.memory] == canonical(limits[names.memory]) == "3k"
    assert realistic_pod(10, gpu_every=0)["spec"]["schedulerName"] == "default-scheduler"
