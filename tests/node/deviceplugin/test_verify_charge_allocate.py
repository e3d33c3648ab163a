"""The charge check through the node plugin's Allocate over real gRPC: a share of a card booked on a
GPU larger than the webhook charged it on fails the pod, naming both figures; the exact size passes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc import aio

from kube_vgpu.contract.names import BIND_PHASE, CHARGED_GPU_MEMORY
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from tests.support.node import COUNT, GPUS, UUID_A, Harness, container, make_pod, node_object, running_plugin

CARD = GPUS[0].memory_mib  # 32768


@pytest.fixture
async def h(apiserver: ApiServerStandin, kdir: Path, tmp_path: Path) -> AsyncIterator[Harness]:
    apiserver.put(node_object())
    async with running_plugin(apiserver, kdir, tmp_path) as harness:
        yield harness


def _whole_card_pod(charged_on: int) -> dict[str, object]:
    return make_pod(
        "p",
        [container("main", {COUNT: "1"})],
        ids=f"{UUID_A},NVIDIA,{CARD},0:",
        extra_annotations={CHARGED_GPU_MEMORY: str(charged_on)},
    )


async def test_a_whole_card_charged_exactly_the_gpu_is_allocated(h: Harness) -> None:
    h.api.put(_whole_card_pod(CARD))
    response = await h.allocate(1)
    assert response.container_responses[0].envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == f"{CARD}m"
    assert h.annotations("p")[BIND_PHASE] == "success"


async def test_a_whole_card_charged_one_mib_less_is_refused_naming_both_figures(h: Harness) -> None:
    h.api.put(_whole_card_pod(CARD - 1))
    with pytest.raises(aio.AioRpcError) as info:
        await h.allocate(1)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = info.value.details() or ""
    assert "pod default/p" in details
    assert f"would give container 'main' {CARD} MiB" in details
    assert f"charged {CARD - 1} MiB for it at admission" in details
    assert h.annotations("p")[BIND_PHASE] == "failed"
