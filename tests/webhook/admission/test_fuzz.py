"""Property: whatever body reaches `/mutate` (random bytes, truncated reviews, random pods), the answer
is a well-formed AdmissionReview or a 4xx with a JSON reason; never a 5xx, never a dead server.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.webhook.admission.review import decode_patch
from tests.support.webhook import (
    A10,
    A100,
    CORES,
    MEMORY,
    NUMBER,
    PERCENT,
    ThreadedWebhook,
    gpu_node,
    gpu_uuid,
    post_once,
    review,
    write_tls,
)


@pytest.fixture
def webhook(apiserver: ApiServerStandin, tmp_path: Path) -> Iterator[ThreadedWebhook]:
    apiserver.put(gpu_node("mixed", "hami-core", [(A10, 24576), (A100, 40960)]))
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    with ThreadedWebhook(kubeconfig, write_tls(tmp_path / "tls")) as running:
        yield running


_text = st.text(max_size=12)
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=10,
)
_quantity = st.one_of(
    st.integers(-5, 2**40).map(str),
    st.sampled_from(["3Gi", "1k", "0", "100", "", " 7", "1.5", "2147483648"]),
    st.integers(0, 200),
    _text,
)
_good_quantity = st.sampled_from(["1", "2", "50", "100", "1000", "60000"])
_vgpu_limits = st.fixed_dictionaries(
    {st_key: _good_quantity for st_key in (MEMORY,)},
    optional={NUMBER: _good_quantity, CORES: st.sampled_from(["0", "30", "100"])},
)
_vgpu_container = st.fixed_dictionaries(
    {"name": st.sampled_from(["main", "side"]), "resources": st.fixed_dictionaries({"limits": _vgpu_limits})},
    optional={"securityContext": st.fixed_dictionaries({"privileged": st.booleans()})},
)
_resource_keys = st.sampled_from([NUMBER, MEMORY, PERCENT, CORES, "cpu", "nvidia.com/gpu"])
_container = st.fixed_dictionaries(
    {"name": _text},
    optional={
        "resources": st.one_of(
            st.fixed_dictionaries(
                {},
                optional={
                    "limits": st.dictionaries(_resource_keys, _quantity, max_size=4),
                    "requests": st.dictionaries(_resource_keys, _quantity, max_size=3),
                },
            ),
            st.none(),
            _text,
        ),
        "securityContext": st.one_of(st.fixed_dictionaries({"privileged": st.booleans()}), st.none()),
    },
)
_annotation_keys = st.sampled_from(
    [
        "volcano.sh/vgpu-mode",
        "nvidia.com/vgpu-mode",
        "nvidia.com/use-gputype",
        "nvidia.com/nouse-gputype",
        "volcano.sh/vgpu-use-gpuuuid",
        "nvidia.com/nouse-gpuuuid",
        "kube-vgpu.io/use-gputype",
        "kube-vgpu.io/node-affinity",
        "volcano.sh/bind-phase",
        "other",
    ]
)
_annotation_values = st.one_of(
    _text, st.sampled_from(["hami-core", "mig", "A10", "A100,H100", gpu_uuid("mixed", 0), "[]", "[{}]", ","])
)
_requirement = st.fixed_dictionaries(
    {
        "key": st.sampled_from(["zone", "kube-vgpu.io/vgpu-mode"]),
        "operator": st.sampled_from(["In", "Exists"]),
    },
    optional={"values": st.lists(_text, max_size=2)},
)
_affinity = st.fixed_dictionaries(
    {
        "nodeAffinity": st.fixed_dictionaries(
            {
                "requiredDuringSchedulingIgnoredDuringExecution": st.fixed_dictionaries(
                    {
                        "nodeSelectorTerms": st.lists(
                            st.fixed_dictionaries(
                                {}, optional={"matchExpressions": st.lists(_requirement, max_size=2)}
                            ),
                            max_size=3,
                        )
                    }
                )
            }
        )
    }
)
_pod = st.fixed_dictionaries(
    {
        "apiVersion": st.just("v1"),
        "kind": st.just("Pod"),
        "metadata": st.fixed_dictionaries(
            {"name": _text, "namespace": st.just("default")},
            optional={
                "annotations": st.dictionaries(_annotation_keys, _annotation_values, max_size=4),
                "labels": st.dictionaries(
                    st.sampled_from(["kube-vgpu.io/webhook", "app"]), _text, max_size=2
                ),
            },
        ),
        "spec": st.fixed_dictionaries(
            {
                "containers": st.one_of(
                    st.lists(_container, max_size=3), st.lists(_vgpu_container, min_size=1, max_size=2)
                )
            },
            optional={
                "initContainers": st.lists(_container, max_size=2),
                "schedulerName": st.sampled_from(["", "default-scheduler", "volcano", "x"]),
                "affinity": st.one_of(_affinity, _json.map(lambda j: {"nodeAffinity": j}), _json),
            },
        ),
    }
)


def _encoded(obj: dict[str, Any] | None) -> bytes:
    return json.dumps(review(obj, uid="fuzz")).encode()


def _bodies() -> st.SearchStrategy[tuple[bytes, dict[str, Any] | None]]:
    """(body, the pod it carries when the body is a whole review of one)."""
    valid = _pod.map(lambda p: (_encoded(p), p))
    truncated = st.tuples(_pod, st.floats(0, 1)).map(
        lambda pc: (_encoded(pc[0])[: int(len(_encoded(pc[0])) * pc[1])], None)
    )
    envelope = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}
    mangled_request = _json.map(lambda j: (json.dumps(envelope | {"request": j}).encode(), None))
    pod_request = review(None, uid="fuzz")["request"]
    mangled_object = _json.map(
        lambda j: (json.dumps(envelope | {"request": pod_request | {"object": j}}).encode(), None)
    )
    anything = _json.map(lambda j: (json.dumps(j).encode(), None))
    noise = st.binary(max_size=64).map(lambda b: (b, None))
    return st.one_of(valid, truncated, mangled_request, mangled_object, anything, noise)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=_bodies())
def test_mutate_never_fails_on_any_body(
    webhook: ThreadedWebhook, case: tuple[bytes, dict[str, Any] | None]
) -> None:
    body, sent_pod = case
    status, raw = post_once(webhook, body, "/mutate")
    assert status < 500, raw
    answer = json.loads(raw)
    if status != 200:
        assert 400 <= status < 500 and isinstance(answer["error"], str)
        return
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    result = answer["response"]
    assert isinstance(result["allowed"], bool) and isinstance(result["uid"], str)
    if not result["allowed"]:
        assert result["status"]["code"] == 403 and result["status"]["message"]
        assert "internal error" not in result["status"]["message"]
    if sent_pod is not None and "patch" in result:
        patched = jsonpatch.apply_patch(sent_pod, decode_patch(answer))
        assert patched["spec"]["schedulerName"]


def test_connection_survives_a_malformed_review(webhook: ThreadedWebhook) -> None:
    conn: http.client.HTTPSConnection = webhook.connect()
    for _ in range(3):
        conn.request("POST", "/mutate", body=b"{", headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 400 and json.loads(response.read())["error"]
    conn.close()
