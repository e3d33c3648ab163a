"""`kube-vgpu certs patch` against the stand-in API server: the CA lands in every webhook, once."""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kube_vgpu.certs.cluster import patch_ca_bundle
from kube_vgpu.certs.errors import EXIT_FORBIDDEN, EXIT_INVALID, EXIT_NOT_FOUND, EXIT_UNREACHABLE
from kube_vgpu.cli.main import main
from kube_vgpu.kubeapi.client import Kind, Kube
from kube_vgpu.standins.apiserver.server import ApiServerStandin

NAMESPACE = "kube-vgpu"
SECRET = "kube-vgpu-tls"
CONFIG = "kube-vgpu"
CONFIG_PATH = f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{CONFIG}"
WRITES = ("POST", "PUT", "PATCH", "DELETE")


def webhook(name: str, ca_bundle: str | None = None) -> dict[str, Any]:
    client_config: dict[str, Any] = {
        "service": {"name": "kube-vgpu", "namespace": NAMESPACE, "path": "/mutate"}
    }
    if ca_bundle is not None:
        client_config["caBundle"] = ca_bundle
    return {
        "name": name,
        "clientConfig": client_config,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "NoneOnDryRun",
    }


def create_args(kubeconfig: Path) -> list[str]:
    flags = ["--service", "kube-vgpu", "--namespace", NAMESPACE, "--secret-name", SECRET]
    return ["certs", "create", *flags, "--kubeconfig", str(kubeconfig)]


def patch_args(kubeconfig: Path) -> list[str]:
    flags = ["--webhook-name", CONFIG, "--namespace", NAMESPACE, "--secret-name", SECRET]
    return ["certs", "patch", *flags, "--kubeconfig", str(kubeconfig)]


def put_config(api: ApiServerStandin, *webhooks: dict[str, Any]) -> None:
    api.put(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": CONFIG},
            "webhooks": list(webhooks),
        }
    )


@pytest.fixture
def kubeconfig(apiserver: ApiServerStandin, tmp_path: Path) -> Path:
    apiserver.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    return apiserver.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def ca_bundle(apiserver: ApiServerStandin, kubeconfig: Path) -> str:
    """Runs `certs create`; returns the Secret's ca.crt as a caBundle value."""
    code = main(create_args(kubeconfig))
    assert code == 0
    secret = apiserver.get("secrets", SECRET, NAMESPACE)
    assert secret is not None
    bundle: str = secret["data"]["ca.crt"]
    return bundle


@pytest.fixture
def patch(kubeconfig: Path) -> Callable[[], int]:
    return lambda: main(patch_args(kubeconfig))


def bundles(api: ApiServerStandin) -> list[str | None]:
    config = api.get("mutatingwebhookconfigurations", CONFIG)
    assert config is not None
    return [w["clientConfig"].get("caBundle") for w in config["webhooks"]]


def test_the_ca_goes_into_both_webhooks_then_nothing_is_written(
    apiserver: ApiServerStandin, ca_bundle: str, patch: Callable[[], int], capsys: pytest.CaptureFixture[str]
) -> None:
    put_config(apiserver, webhook("a.kube-vgpu.io"), webhook("b.kube-vgpu.io", "c3RhbGU="))
    apiserver.clear_requests()
    assert patch() == 0
    assert "caBundle written for a.kube-vgpu.io, b.kube-vgpu.io" in capsys.readouterr().out
    assert bundles(apiserver) == [ca_bundle, ca_bundle]
    [request] = [r for r in apiserver.requests() if r.method in WRITES]
    assert (request.method, request.path, request.content_type) == (
        "PATCH",
        CONFIG_PATH,
        "application/json-patch+json",
    )
    assert {"op": "test", "path": "/webhooks/1/name", "value": "b.kube-vgpu.io"} in request.json()
    # The rest of each webhook is left as it was.
    config = apiserver.get("mutatingwebhookconfigurations", CONFIG)
    assert config is not None
    assert config["webhooks"][0]["clientConfig"]["service"]["path"] == "/mutate"

    apiserver.clear_requests()
    assert patch() == 0
    assert "nothing written" in capsys.readouterr().out
    assert [r for r in apiserver.requests() if r.method in WRITES] == []


def test_only_the_stale_webhook_is_patched(
    apiserver: ApiServerStandin, ca_bundle: str, patch: Callable[[], int]
) -> None:
    put_config(apiserver, webhook("a.kube-vgpu.io", ca_bundle), webhook("b.kube-vgpu.io"))
    apiserver.clear_requests()
    assert patch() == 0
    [request] = [r for r in apiserver.requests() if r.method in WRITES]
    assert [op["path"] for op in request.json()] == ["/webhooks/1/name", "/webhooks/1/clientConfig/caBundle"]
    assert bundles(apiserver) == [ca_bundle, ca_bundle]


def test_a_list_reordered_between_read_and_patch_is_reread(
    apiserver: ApiServerStandin, ca_bundle: str
) -> None:
    put_config(apiserver, webhook("a.kube-vgpu.io", ca_bundle), webhook("b.kube-vgpu.io"))

    class Reordering(Kube):
        """Reverses the webhook list right after the first read, as a concurrent edit would."""

        reads = 0

        def get(
            self,
            kind: Kind,
            name: str,
            *,
            namespace: str | None = None,
            timeout: float | tuple[float, float] | None = None,
        ) -> dict[str, Any] | None:
            result = super().get(kind, name, namespace=namespace, timeout=timeout)
            if kind == "mutatingwebhookconfiguration" and self.reads == 0 and result is not None:
                self.reads += 1
                put_config(apiserver, *reversed(result["webhooks"]))
            return result

    kube = Reordering(apiserver.api_client())
    try:
        outcome = patch_ca_bundle(kube, webhook_name=CONFIG, namespace=NAMESPACE, secret_name=SECRET)
    finally:
        kube.close()
    assert outcome.patched == ["b.kube-vgpu.io"]
    assert [r.status for r in apiserver.requests("PATCH")] == [422, 200]
    assert bundles(apiserver) == [ca_bundle, ca_bundle]


def test_missing_configuration_secret_or_ca(
    apiserver: ApiServerStandin,
    kubeconfig: Path,
    patch: Callable[[], int],
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert patch() == EXIT_NOT_FOUND
    assert f"Secret {NAMESPACE}/{SECRET} not found" in capsys.readouterr().err

    apiserver.put(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SECRET, "namespace": NAMESPACE},
            "type": "kubernetes.io/tls",
            "data": {"tls.crt": base64.b64encode(b"x").decode(), "tls.key": base64.b64encode(b"y").decode()},
        }
    )
    assert patch() == EXIT_INVALID
    assert f"Secret {NAMESPACE}/{SECRET} has no ca.crt" in capsys.readouterr().err

    main(create_args(kubeconfig))
    capsys.readouterr()
    assert patch() == EXIT_NOT_FOUND
    err = capsys.readouterr().err
    assert err == f"kube-vgpu certs patch: error: MutatingWebhookConfiguration {CONFIG} not found\n"


@pytest.mark.parametrize(
    ("verb", "resource", "namespace", "needle"),
    [
        (
            "patch",
            "mutatingwebhookconfigurations",
            None,
            'cannot "patch" resource "mutatingwebhookconfigurations"',
        ),
        (
            "get",
            "mutatingwebhookconfigurations",
            None,
            'cannot "get" resource "mutatingwebhookconfigurations"',
        ),
        ("get", "secrets", NAMESPACE, f'cannot "get" resource "secrets" in namespace "{NAMESPACE}"'),
    ],
)
def test_missing_rbac_names_the_verb_and_resource(
    apiserver: ApiServerStandin,
    ca_bundle: str,
    patch: Callable[[], int],
    capsys: pytest.CaptureFixture[str],
    *,
    verb: str,
    resource: str,
    namespace: str | None,
    needle: str,
) -> None:
    put_config(apiserver, webhook("a.kube-vgpu.io"))
    apiserver.deny(verb, resource, namespace)
    capsys.readouterr()
    assert patch() == EXIT_FORBIDDEN
    err = capsys.readouterr().err
    assert needle in err
    assert err.count("\n") == 1
    assert bundles(apiserver) == [None]


def test_unreachable_api(
    apiserver: ApiServerStandin, patch: Callable[[], int], capsys: pytest.CaptureFixture[str]
) -> None:
    apiserver.set_outage(True)
    assert patch() == EXIT_UNREACHABLE
    assert f"cannot reach the Kubernetes API server at {apiserver.url}" in capsys.readouterr().err
