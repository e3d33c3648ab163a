"""`kube-vgpu certs patch` writes the CA into the ValidatingWebhookConfiguration of the same name too:
both admission phases are served by the one webhook Service."""

from __future__ import annotations

from pathlib import Path

import pytest

from kube_vgpu.cli.main import main
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from tests.certs.test_cli_patch import CONFIG, WRITES, create_args, patch_args, put_config, webhook


def put_validating(api: ApiServerStandin) -> None:
    hook = webhook("vgpu.kube-vgpu.io")
    hook["clientConfig"]["service"]["path"] = "/validate"
    api.put(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": CONFIG},
            "webhooks": [hook],
        }
    )


@pytest.fixture
def kubeconfig_with_ca(apiserver: ApiServerStandin, tmp_path: Path) -> Path:
    apiserver.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kube-vgpu"}})
    path = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    assert main(create_args(path)) == 0
    return path


def test_both_configurations_get_the_ca_and_a_second_run_writes_nothing(
    apiserver: ApiServerStandin, kubeconfig_with_ca: Path
) -> None:
    put_config(apiserver, webhook("vgpu.kube-vgpu.io"))
    put_validating(apiserver)
    secret = apiserver.get("secrets", "kube-vgpu-tls", "kube-vgpu")
    assert secret is not None
    ca = secret["data"]["ca.crt"]
    assert main(patch_args(kubeconfig_with_ca)) == 0
    for plural in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        config = apiserver.get(plural, CONFIG)
        assert config is not None and config["webhooks"][0]["clientConfig"]["caBundle"] == ca, plural
    apiserver.clear_requests()
    assert main(patch_args(kubeconfig_with_ca)) == 0
    assert [r for r in apiserver.requests() if r.method in WRITES] == []


def test_a_release_without_a_validating_configuration_still_gets_its_mutating_one_patched(
    apiserver: ApiServerStandin, kubeconfig_with_ca: Path
) -> None:
    put_config(apiserver, webhook("vgpu.kube-vgpu.io"))
    assert main(patch_args(kubeconfig_with_ca)) == 0
    config = apiserver.get("mutatingwebhookconfigurations", CONFIG)
    assert config is not None and config["webhooks"][0]["clientConfig"].get("caBundle")
