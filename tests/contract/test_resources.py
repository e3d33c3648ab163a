"""Parsing and validating container vGPU requests (malformed values refused)."""

from __future__ import annotations

from typing import Any

import pytest

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.contract.resources import RequestError, parse_container, parse_pod

NAMES = ResourceNames()


def ctr(name: str = "main", **limits: Any) -> dict[str, Any]:
    return {"name": name, "resources": {"limits": {k.replace("_", "-"): v for k, v in limits.items()}}}


def vgpu(**amounts: Any) -> dict[str, Any]:
    keys = {
        "number": NAMES.count,
        "memory": NAMES.memory,
        "percent": NAMES.memory_percentage,
        "cores": NAMES.cores,
    }
    return {"name": "main", "resources": {"limits": {keys[k]: v for k, v in amounts.items()}}}


def test_plain_request_parses() -> None:
    req = parse_container(vgpu(number="2", memory="3000", cores="30"), NAMES, init=False)
    assert (req.number, req.memory_mib, req.memory_percent, req.cores, req.vgpus) == (2, 3000, None, 30, 2)


def test_memory_only_counts_as_one_vgpu_and_no_request_as_none() -> None:
    assert parse_container(vgpu(memory="1024"), NAMES, init=False).vgpus == 1
    plain = parse_container({"name": "x", "resources": {"limits": {"cpu": "1"}}}, NAMES, init=False)
    assert not plain.asks_vgpu and plain.vgpus == 0


def test_requests_are_read_when_limits_are_absent() -> None:
    container = {"name": "main", "resources": {"requests": {NAMES.memory: "512"}}}
    assert parse_container(container, NAMES, init=False).memory_mib == 512


@pytest.mark.parametrize(
    ("amounts", "fragment"),
    [
        ({"memory": "3Gi"}, "write 3072, not 3Gi"),
        ({"memory": "512Mi"}, "write 512, not 512Mi"),
        ({"memory": "3G"}, "larger than 2147483647"),
        # 3G was meant as 3 GB: told the MiB to write, as 3Gi is.
        ({"memory": "3G"}, "volcano.sh/vgpu-memory is a number of MiB: write 3000, not 3G"),
        ({"memory": "1.5T"}, "write 1500000, not 1.5T"),
        ({"memory": str(2**31)}, "larger than 2147483647"),
        ({"number": "0"}, "at least 1"),
        ({"percent": "101"}, "1 to 100"),
        ({"cores": "150"}, "0 to 100"),
        ({"memory": "100", "percent": "50"}, "not both"),
        ({"cores": "1.5"}, "fraction"),
        ({"cores": "500m"}, "fraction"),
        ({"number": "one"}, "not a Kubernetes quantity"),
    ],
)
def test_malformed_values_name_container_key_and_value(amounts: dict[str, str], fragment: str) -> None:
    with pytest.raises(RequestError) as info:
        parse_container(vgpu(**amounts), NAMES, init=False)
    message = str(info.value)
    assert fragment in message and "'main'" in message and "volcano.sh/vgpu-" in message


def test_the_decimal_hint_is_for_memory_sizes_only() -> None:
    # Not memory: no MiB to suggest. A huge number without a suffix: nothing to convert.
    for amounts in ({"cores": "3G"}, {"memory": str(2**31)}):
        with pytest.raises(RequestError) as info:
            parse_container(vgpu(**amounts), NAMES, init=False)
        assert "write" not in str(info.value)


def test_pod_lists_init_containers_first() -> None:
    pod = {"spec": {"initContainers": [vgpu(memory="10")], "containers": [ctr("side"), vgpu(number="1")]}}
    parsed = parse_pod(pod, NAMES)
    assert [c.init for c in parsed.containers] == [True, False, False]
    assert parsed.asks_vgpu and len(parsed.app) == 2 and len(parsed.init) == 1


def test_custom_resource_names_are_honoured() -> None:
    names = ResourceNames(
        "nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores"
    )
    container = {"name": "m", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3Gi"}}}
    with pytest.raises(RequestError, match=r"nvidia\.com/gpumem"):
        parse_container(container, names, init=False)
    assert not parse_container(vgpu(number="1"), names, init=False).asks_vgpu
