"""`kube-vgpu certs create` against the stand-in API server, through the real CLI and client."""

from __future__ import annotations

import base64
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from cryptography.x509.oid import ExtendedKeyUsageOID
from cryptography.x509.verification import PolicyBuilder, Store

from kube_vgpu.certs.errors import EXIT_FORBIDDEN, EXIT_INVALID, EXIT_NOT_FOUND, EXIT_UNREACHABLE
from kube_vgpu.certs.issue import issue_ca, issue_serving
from kube_vgpu.cli.main import main
from kube_vgpu.standins.apiserver.server import ApiServerStandin

NAMESPACE = "kube-vgpu"
SECRET = "kube-vgpu-tls"
HOSTS = [
    "kube-vgpu",
    "kube-vgpu.kube-vgpu",
    "kube-vgpu.kube-vgpu.svc",
    "kube-vgpu.kube-vgpu.svc.cluster.local",
]
WRITES = ("POST", "PUT", "PATCH", "DELETE")


@pytest.fixture
def api(apiserver: ApiServerStandin) -> ApiServerStandin:
    apiserver.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    return apiserver


@pytest.fixture
def create(api: ApiServerStandin, tmp_path: Path) -> Callable[..., int]:
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")

    def run(*extra: str, service: str = "kube-vgpu") -> int:
        return main(
            [
                "certs",
                "create",
                "--service",
                service,
                "--namespace",
                NAMESPACE,
                "--secret-name",
                SECRET,
                "--kubeconfig",
                str(kubeconfig),
                *extra,
            ]
        )

    return run


def data(secret: dict[str, Any] | None) -> dict[str, bytes]:
    assert secret is not None
    return {k: base64.b64decode(v) for k, v in secret["data"].items()}


def assert_valid_chain(secret: dict[str, Any] | None, hosts: list[str] = HOSTS) -> x509.Certificate:
    """The Secret's serving certificate verifies against its ca.crt for every host; returns it."""
    assert secret is not None
    assert secret["type"] == "kubernetes.io/tls"
    files = data(secret)
    leaf = x509.load_pem_x509_certificate(files["tls.crt"])
    store = Store(x509.load_pem_x509_certificates(files["ca.crt"]))
    for host in hosts:
        verifier = PolicyBuilder().store(store).build_server_verifier(x509.DNSName(host))
        verifier.verify(leaf, [])
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sorted(sans.get_values_for_type(x509.DNSName)) == sorted(hosts)
    assert (
        ExtendedKeyUsageOID.SERVER_AUTH
        in leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    )
    public = leaf.public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey)
    assert isinstance(public.curve, ec.SECP256R1)
    key = load_pem_private_key(files["tls.key"], password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert key.public_key() == public
    return leaf


def writes(api: ApiServerStandin) -> list[tuple[str, str, int | None]]:
    return [(r.method, r.path, r.status) for r in api.requests() if r.method in WRITES]


def put_secret(api: ApiServerStandin, files: dict[str, bytes], type_: str = "kubernetes.io/tls") -> None:
    api.put(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SECRET, "namespace": NAMESPACE, "labels": {"keep": "me"}},
            "type": type_,
            "data": {k: base64.b64encode(v).decode() for k, v in files.items()},
        }
    )


def material(*, days: int, hosts: list[str] = HOSTS, ca_days: int = 3650) -> dict[str, bytes]:
    ca = issue_ca("pre-existing", ca_days)
    leaf = issue_serving(ca, hosts, days=days)
    return {"ca.crt": ca.cert_pem, "ca.key": ca.key_pem, "tls.crt": leaf.cert_pem, "tls.key": leaf.key_pem}


def test_create_on_an_empty_namespace_then_again_writes_nothing(
    api: ApiServerStandin, create: Callable[..., int], capsys: pytest.CaptureFixture[str]
) -> None:
    assert create() == 0
    assert "created: new CA and serving certificate" in capsys.readouterr().out
    leaf = assert_valid_chain(api.get("secrets", SECRET, NAMESPACE))
    assert leaf.not_valid_after_utc - datetime.now(UTC) > timedelta(days=364)
    assert writes(api) == [("POST", f"/api/v1/namespaces/{NAMESPACE}/secrets", 201)]

    api.clear_requests()
    before = api.get("secrets", SECRET, NAMESPACE)
    assert create() == 0
    assert "nothing written" in capsys.readouterr().out
    assert writes(api) == []
    assert api.get("secrets", SECRET, NAMESPACE) == before


def test_a_secret_ten_days_from_expiry_is_renewed_with_the_same_ca(
    api: ApiServerStandin, create: Callable[..., int]
) -> None:
    old = material(days=10)
    put_secret(api, old)
    api.clear_requests()
    assert create("--days", "90") == 0
    secret = api.get("secrets", SECRET, NAMESPACE)
    leaf = assert_valid_chain(secret)
    assert leaf.not_valid_after_utc - datetime.now(UTC) > timedelta(days=89)
    files = data(secret)
    assert files["ca.crt"] == old["ca.crt"]
    assert files["ca.key"] == old["ca.key"]
    assert secret is not None
    assert secret["metadata"]["labels"] == {"keep": "me"}
    # One replace, carrying the resourceVersion it read (optimistic concurrency).
    [put] = [r for r in api.requests() if r.method in WRITES]
    assert put.method == "PUT"
    assert put.json()["metadata"]["resourceVersion"]


def test_a_changed_service_name_reissues_the_serving_certificate(
    api: ApiServerStandin, create: Callable[..., int], capsys: pytest.CaptureFixture[str]
) -> None:
    assert create() == 0
    first = data(api.get("secrets", SECRET, NAMESPACE))
    assert create(service="gpu-admission") == 0
    assert "tls.crt names" in capsys.readouterr().out
    secret = api.get("secrets", SECRET, NAMESPACE)
    assert_valid_chain(secret, [h.replace("kube-vgpu", "gpu-admission", 1) for h in HOSTS])
    assert data(secret)["ca.crt"] == first["ca.crt"]


@pytest.mark.parametrize(
    "corrupt",
    [
        pytest.param(lambda m: m | {"tls.key": b"\x00garbage"}, id="key-garbage"),
        pytest.param(lambda m: m | {"tls.key": material(days=90)["tls.key"]}, id="key-mismatch"),
        pytest.param(
            lambda m: m | {k: material(days=90)[k] for k in ("tls.crt", "tls.key")}, id="foreign-ca"
        ),
        pytest.param(lambda m: m | {"ca.crt": b"-----BEGIN CERTIFICATE-----\nAA==\n"}, id="ca-garbage"),
        pytest.param(lambda m: {"tls.crt": m["tls.crt"]}, id="keys-missing"),
    ],
)
def test_a_corrupted_secret_is_reissued(
    api: ApiServerStandin,
    create: Callable[..., int],
    corrupt: Callable[[dict[str, bytes]], dict[str, bytes]],
) -> None:
    put_secret(api, corrupt(material(days=200)))
    assert create() == 0
    assert_valid_chain(api.get("secrets", SECRET, NAMESPACE))
    api.clear_requests()
    assert create() == 0
    assert writes(api) == []


def test_a_secret_that_is_not_tls_is_refused_untouched(
    api: ApiServerStandin, create: Callable[..., int], capsys: pytest.CaptureFixture[str]
) -> None:
    put_secret(api, {"password": b"hunter2"}, type_="Opaque")
    api.clear_requests()
    assert create() == EXIT_INVALID
    assert "has type 'Opaque'" in capsys.readouterr().err
    assert writes(api) == []


def _wait_hung(api: ApiServerStandin, count: int) -> None:
    pause = threading.Event()
    for _ in range(3000):  # 30 s at most
        if sum(1 for r in api.requests("GET") if r.status is None) >= count:
            return
        pause.wait(0.01)
    raise AssertionError(f"{count} requests never arrived: {api.requests()}")


@pytest.mark.parametrize("existing", [False, True], ids=["empty", "expiring"])
def test_two_concurrent_creates_converge_on_one_valid_secret(
    api: ApiServerStandin, create: Callable[..., int], existing: bool
) -> None:
    if existing:
        put_secret(api, material(days=10))
    api.clear_requests()
    # Hold both jobs' first read until both have made it, so both decide on the same state.
    api.set_hang(True, [f"/api/v1/namespaces/{NAMESPACE}/secrets/{SECRET}"])
    codes: list[int] = []
    jobs = [threading.Thread(target=lambda: codes.append(create())) for _ in range(2)]
    for job in jobs:
        job.start()
    _wait_hung(api, 2)
    api.set_hang(False)
    for job in jobs:
        job.join()
    assert codes == [0, 0]
    statuses = sorted(status or 0 for _, _, status in writes(api))
    assert statuses == ([200, 409] if existing else [201, 409])
    assert_valid_chain(api.get("secrets", SECRET, NAMESPACE))
    api.clear_requests()
    assert create() == 0
    assert writes(api) == []


@pytest.mark.parametrize(
    ("verb", "setup", "needle"),
    [
        ("get", False, 'cannot "get" resource "secrets" in namespace "kube-vgpu"'),
        ("create", False, 'cannot "create" resource "secrets" in namespace "kube-vgpu"'),
        ("update", True, 'cannot "update" resource "secrets" in namespace "kube-vgpu"'),
    ],
)
def test_missing_rbac_names_the_verb_and_resource(
    api: ApiServerStandin,
    create: Callable[..., int],
    capsys: pytest.CaptureFixture[str],
    *,
    verb: str,
    setup: bool,
    needle: str,
) -> None:
    if setup:
        put_secret(api, material(days=10))
    api.deny(verb, "secrets", NAMESPACE)
    assert create() == EXIT_FORBIDDEN
    err = capsys.readouterr().err
    assert needle in err
    assert "forbidden" in err
    assert err.count("\n") == 1
    assert "Traceback" not in err


def test_unreachable_api_names_the_server(
    api: ApiServerStandin, create: Callable[..., int], capsys: pytest.CaptureFixture[str]
) -> None:
    api.set_outage(True)
    assert create() == EXIT_UNREACHABLE
    err = capsys.readouterr().err
    assert f"cannot reach the Kubernetes API server at {api.url}" in err
    assert err.count("\n") == 1


def test_a_missing_namespace_or_kubeconfig_is_one_line(
    create: Callable[..., int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope"
    flags = ["certs", "create", "--service", "s", "--namespace", "absent", "--secret-name", "x"]
    code = main([*flags, "--kubeconfig", str(missing)])
    assert code == EXIT_UNREACHABLE
    assert f"--kubeconfig {missing}: no such file" in capsys.readouterr().err
    code = main([*flags, "--kubeconfig", str(tmp_path / "kubeconfig")])
    assert code == EXIT_NOT_FOUND
    assert 'namespaces "absent" not found' in capsys.readouterr().err
