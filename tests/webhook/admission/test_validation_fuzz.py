"""Property: whatever reaches `/validate` (random pods with env, volumes and mounts, CREATEs and UPDATEs
with random old objects and writers, subresources, dry runs), the answer is a well-formed
AdmissionReview without a patch, or a 4xx with a JSON reason; never a 5xx, never an internal error.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kube_vgpu.standins.apiserver.server import ApiServerStandin
from tests.support.webhook import A10, A100, ThreadedWebhook, gpu_node, post_once, write_tls
from tests.webhook.admission.test_fuzz import _json, _pod, _text


@pytest.fixture
def webhook(apiserver: ApiServerStandin, tmp_path: Path) -> Iterator[ThreadedWebhook]:
    apiserver.put(gpu_node("mixed", "hami-core", [(A10, 24576), (A100, 40960)]))
    apiserver.put(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": "default", "labels": {"quota.kube-vgpu.io/vgpu-memory": "50000"}},
        }
    )
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    with ThreadedWebhook(kubeconfig, write_tls(tmp_path / "tls")) as running:
        yield running


_paths = st.one_of(
    _text,
    st.sampled_from(["/etc/ld.so.preload", "//tmp/vgpu/", "/usr/local/vgpu/../vgpu", "/", "", "/tmp"]),
)
_env = st.lists(
    st.one_of(
        st.fixed_dictionaries(
            {"name": st.one_of(_text, st.sampled_from(["LD_PRELOAD", "CUDA_DEVICE_MEMORY_LIMIT_0", "PATH"]))},
            optional={"value": _text},
        ),
        _json,
    ),
    max_size=3,
)
_mounts = st.lists(st.one_of(st.fixed_dictionaries({"name": _text, "mountPath": _paths}), _json), max_size=2)
_volumes = st.lists(
    st.one_of(
        st.fixed_dictionaries({"name": _text, "hostPath": st.fixed_dictionaries({"path": _paths})}), _json
    ),
    max_size=2,
)


@st.composite
def _final_pod(draw: st.DrawFn) -> dict[str, Any]:
    pod: dict[str, Any] = draw(_pod)
    pod["metadata"]["uid"] = draw(st.one_of(st.uuids().map(str), st.just(""), _text))
    for container in pod["spec"]["containers"]:
        container["env"] = draw(_env)
        container["volumeMounts"] = draw(_mounts)
    pod["spec"]["volumes"] = draw(_volumes)
    return pod


@st.composite
def _review(draw: st.DrawFn) -> dict[str, Any]:
    operation = draw(st.sampled_from(["CREATE", "UPDATE", "DELETE"]))
    request: dict[str, Any] = {
        "uid": "fuzz",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "operation": operation,
        "namespace": "default",
        "object": draw(_final_pod()),
        "dryRun": draw(st.booleans()),
        "userInfo": {"username": draw(st.sampled_from(["alice", "system:serviceaccount:x:y", ""]))},
    }
    if operation == "UPDATE":
        request["oldObject"] = draw(st.one_of(_final_pod(), st.none()))
        request["subResource"] = draw(st.sampled_from(["", "ephemeralcontainers", "status"]))
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(review=_review())
def test_validate_never_fails_on_any_review(webhook: ThreadedWebhook, review: dict[str, Any]) -> None:
    status, raw = post_once(webhook, json.dumps(review).encode(), "/validate")
    assert status < 500, raw
    answer = json.loads(raw)
    if status != 200:
        assert 400 <= status < 500 and isinstance(answer["error"], str)
        return
    result = answer["response"]
    assert "patch" not in result and isinstance(result["allowed"], bool)
    if not result["allowed"]:
        assert result["status"]["code"] == 403 and result["status"]["message"]
        assert "internal error" not in result["status"]["message"], result["status"]["message"]
