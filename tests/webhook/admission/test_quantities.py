"""Quantities in every form a user may write them, through the webhook over real HTTPS: the pod is decoded by
the stand-in API server first, as the real one
decodes it before any webhook sees it, so the webhook meets `3k`, never `3000`."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kube_vgpu.standins.apiserver import quantity as k8s
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from tests.contract.test_quantity import FACTS_TABLE
from tests.support.webhook import (
    A100,
    MEMORY,
    NUMBER,
    ThreadedWebhook,
    container,
    gpu_node,
    pod,
    post,
    review,
    write_tls,
)


@pytest.fixture
def webhook(apiserver: ApiServerStandin, tmp_path: Path) -> Iterator[ThreadedWebhook]:
    apiserver.put(gpu_node("a100", "hami-core", [(A100, 81920)]))
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    with ThreadedWebhook(kubeconfig, write_tls(tmp_path / "tls")) as server:
        yield server


def mutate(webhook: ThreadedWebhook, apiserver: ApiServerStandin, obj: dict[str, Any]) -> dict[str, Any]:
    status, body = post(webhook.connect(), review(apiserver.decode(obj)))
    assert status == 200, body
    response: dict[str, Any] = body["response"]
    return response


@pytest.mark.parametrize(("written", "seen"), FACTS_TABLE)
def test_every_row_as_vgpu_memory(
    webhook: ThreadedWebhook, apiserver: ApiServerStandin, written: str, seen: str
) -> None:
    obj = pod(container("infer", number=1, memory=written))
    assert apiserver.decode(obj)["spec"]["containers"][0]["resources"]["limits"][MEMORY] == seen
    response = mutate(webhook, apiserver, obj)
    if "i" in seen:  # binary: refused with the MiB the user meant
        assert not response["allowed"]
        message = response["status"]["message"]
        assert f"'infer': {MEMORY}='{seen}'" in message and "without a binary suffix: write" in message
    elif "m" in seen:  # 500m: a fraction
        assert not response["allowed"] and "fraction" in response["status"]["message"]
    else:
        assert response["allowed"], response
        assert k8s.value(seen) == int(float(written.replace("k", "e3")))  # the number the user meant


@pytest.mark.parametrize(
    ("key", "written", "allowed"),
    [
        (NUMBER, "1e0", True),
        (NUMBER, "2", True),
        (NUMBER, "0.5", False),  # 500m
        (MEMORY, "2147483648", False),  # 2147483648 -> "2147483648": beyond int32
        (MEMORY, "3e9", False),
        (MEMORY, "1.5k", True),  # -> "1500"
    ],
)
def test_counts_and_bounds_as_the_apiserver_sends_them(
    webhook: ThreadedWebhook, apiserver: ApiServerStandin, key: str, written: str, allowed: bool
) -> None:
    limits = {NUMBER: "1", MEMORY: "1000", key: written}
    obj = pod({"name": "infer", "image": "x", "resources": {"limits": limits}})
    response = mutate(webhook, apiserver, obj)
    assert response["allowed"] is allowed, response
    if not allowed:
        assert f"'infer': {key}=" in response["status"]["message"]
    elif response.get("patch"):
        json.loads(base64.b64decode(response["patch"]))  # a well-formed patch
