"""`standins.apiserver.admission_chain` admits in the kube-apiserver's order.

A recording webhook over real TLS sees: mutation first, with no name, uid or creationTimestamp for a
`generateName` pod; then validation exactly once, with the generated name, a uid and a timestamp; a
fresh `request.uid` on every call; and the stand-in API server stores the uid validation saw.
"""

from __future__ import annotations

import base64
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from kube_vgpu.standins.apiserver.admission_chain import AdmissionChain, with_system_metadata
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from tests.support.webhook import TlsFiles, write_tls

JOB = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"generateName": "job-", "namespace": "default"},
    "spec": {"containers": [{"name": "c", "image": "busybox"}]},
}


class Recorder:
    def __init__(self, deny_validation: bool = False) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.deny_validation = deny_validation

    async def handle(self, request: web.Request) -> web.Response:
        review = await request.json()
        self.calls.append((request.path, review["request"]))
        response: dict[str, Any] = {"uid": review["request"]["uid"], "allowed": True}
        if request.path == "/mutate":
            patch = [{"op": "add", "path": "/metadata/labels", "value": {"mutated": "yes"}}]
            response |= {
                "patchType": "JSONPatch",
                "patch": base64.b64encode(json.dumps(patch).encode()).decode(),
            }
        elif self.deny_validation:
            response = {"uid": response["uid"], "allowed": False, "status": {"code": 403, "message": "no"}}
        return web.json_response(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
        )


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[Recorder, str, TlsFiles]]:
    tls = write_tls(tmp_path / "tls")
    recorder = Recorder()
    app = web.Application()
    app.router.add_post("/mutate", recorder.handle)
    app.router.add_post("/validate", recorder.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(tls.cert_file), str(tls.key_file))
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = runner.addresses[0][1]
    yield recorder, f"https://127.0.0.1:{port}", tls
    await runner.cleanup()


async def test_mutation_then_system_metadata_then_validation_once(
    served: tuple[Recorder, str, TlsFiles], apiserver: ApiServerStandin
) -> None:
    recorder, url, tls = served
    async with aiohttp.ClientSession() as session:
        admitted = await AdmissionChain(session, url, tls.ca.cert_pem).create(JOB)
    assert [path for path, _ in recorder.calls] == ["/mutate", "/validate"]
    (_, mutate), (_, validate) = recorder.calls
    # A generateName pod has no name, uid or creationTimestamp during mutation.
    assert not {"name", "uid", "creationTimestamp"} & set(mutate["object"]["metadata"])
    # Validation sees the final object: the mutation applied and system metadata filled.
    final = validate["object"]["metadata"]
    assert final["name"].startswith("job-") and len(final["name"]) == len("job-") + 5
    assert final["uid"] and final["creationTimestamp"] and final["labels"] == {"mutated": "yes"}
    assert validate["name"] == final["name"]
    # Every call has a fresh request uid: it identifies the call, not the pod.
    assert mutate["uid"] != validate["uid"]
    # The object is written with that uid.
    assert admitted.allowed
    stored = apiserver.put(admitted.pod)
    assert stored["metadata"]["uid"] == final["uid"]


async def test_a_validation_refusal_stops_the_create(served: tuple[Recorder, str, TlsFiles]) -> None:
    recorder, url, tls = served
    recorder.deny_validation = True
    async with aiohttp.ClientSession() as session:
        admitted = await AdmissionChain(session, url, tls.ca.cert_pem).create(JOB)
    assert not admitted.allowed and admitted.phase == "validate" and admitted.message == "no"


def test_system_metadata_keeps_a_given_name_and_never_reuses_a_uid() -> None:
    named = {"metadata": {"name": "fixed", "namespace": "default"}}
    first, second = with_system_metadata(named), with_system_metadata(named)
    assert first["metadata"]["name"] == second["metadata"]["name"] == "fixed"
    assert first["metadata"]["uid"] != second["metadata"]["uid"]
    assert "uid" not in named["metadata"]  # the input is not changed


CLAIM = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {"name": "job-x-gpu", "namespace": "default"},
    "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "vgpu.kube-vgpu.io"}}]}},
}


@pytest.mark.parametrize("allowed", [True, False])
async def test_a_claim_is_validated_once_as_a_resourceclaim_with_its_system_metadata(
    served: tuple[Recorder, str, TlsFiles], allowed: bool
) -> None:
    recorder, url, tls = served
    recorder.deny_validation = not allowed
    async with aiohttp.ClientSession() as session:
        chain = AdmissionChain(session, url, tls.ca.cert_pem)
        admitted = await chain.create_claim(CLAIM, username="system:serviceaccount:kube-system:rc")
    # No mutating call: kube-vgpu's chart sends claims to its validating webhook only.
    ((path, request),) = recorder.calls
    assert path == "/validate"
    gvk = {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"}
    assert request["kind"] == request["requestKind"] == gvk
    assert request["resource"] == {"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"}
    assert request["operation"] == "CREATE" and request["name"] == "job-x-gpu"
    assert request["userInfo"]["username"] == "system:serviceaccount:kube-system:rc"
    meta = request["object"]["metadata"]
    assert meta["uid"] and meta["creationTimestamp"] and admitted.pod["metadata"]["uid"] == meta["uid"]
    assert admitted.allowed is allowed and admitted.phase == ("" if allowed else "validate")
