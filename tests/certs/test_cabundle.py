"""The caBundle patch: one guarded change per stale webhook, nothing for current ones."""

from __future__ import annotations

import base64
from typing import Any

import jsonpatch
import pytest

from kube_vgpu.certs.cabundle import ca_bundle_patch, encode_ca_bundle

CA = b"-----BEGIN CERTIFICATE-----\nnew\n-----END CERTIFICATE-----\n"
OLD = b"-----BEGIN CERTIFICATE-----\nold\n-----END CERTIFICATE-----\n"


def configuration(*bundles: bytes | None) -> dict[str, Any]:
    webhooks = []
    for index, bundle in enumerate(bundles):
        client_config: dict[str, Any] = {"service": {"name": "svc", "namespace": "ns", "path": "/mutate"}}
        if bundle is not None:
            client_config["caBundle"] = base64.b64encode(bundle).decode()
        webhooks.append({"name": f"w{index}.kube-vgpu.io", "clientConfig": client_config})
    return {"metadata": {"name": "cfg"}, "webhooks": webhooks}


def test_every_stale_webhook_is_set_and_applying_the_patch_converges() -> None:
    before = configuration(None, OLD, CA)
    operations = ca_bundle_patch(before, CA)
    assert operations == [
        {"op": "test", "path": "/webhooks/0/name", "value": "w0.kube-vgpu.io"},
        {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": encode_ca_bundle(CA)},
        {"op": "test", "path": "/webhooks/1/name", "value": "w1.kube-vgpu.io"},
        {"op": "add", "path": "/webhooks/1/clientConfig/caBundle", "value": encode_ca_bundle(CA)},
    ]
    after = jsonpatch.apply_patch(before, operations)
    assert after["webhooks"][0]["clientConfig"]["service"]["path"] == "/mutate"
    assert ca_bundle_patch(after, CA) == []


def test_no_webhooks_and_equal_bundles_need_nothing() -> None:
    assert ca_bundle_patch({"webhooks": None}, CA) == []
    assert ca_bundle_patch(configuration(CA, CA), CA) == []


def test_a_reordered_list_makes_the_patch_fail_instead_of_writing_the_wrong_webhook() -> None:
    before = configuration(OLD, CA)
    operations = ca_bundle_patch(before, CA)
    reordered = {"webhooks": list(reversed(before["webhooks"]))}
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch(reordered, operations)


def test_an_undecodable_bundle_counts_as_stale() -> None:
    config = configuration(CA)
    config["webhooks"][0]["clientConfig"]["caBundle"] = "not base64!"
    assert len(ca_bundle_patch(config, CA)) == 2
