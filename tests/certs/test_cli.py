"""Flags of `kube-vgpu certs`: checked before any request, one line each, also read from the environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from kube_vgpu.certs.errors import EXIT_USAGE
from kube_vgpu.cli.main import main
from kube_vgpu.standins.apiserver.server import ApiServerStandin


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["create", "--service", "Web_Hook", "--namespace", "ns", "--secret-name", "s"],
            "--service must be a DNS label (lower-case letters, digits, '-'; at most 63 characters), "
            "got 'Web_Hook'",
        ),
        (["create", "--service", "w", "--namespace", "ns-", "--secret-name", "s"], "--namespace must be"),
        (["create", "--service", "w", "--namespace", "ns", "--secret-name", "s/x"], "--secret-name must be"),
        (
            ["create", "--service", "w", "--namespace", "ns", "--secret-name", "s", "--days", "7"],
            "--days must",
        ),
        (["patch", "--webhook-name", "W", "--namespace", "ns", "--secret-name", "s"], "--webhook-name must"),
    ],
)
def test_bad_names_and_validity_exit_2_before_any_request(
    apiserver: ApiServerStandin,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    kubeconfig = str(apiserver.write_kubeconfig(tmp_path / "kubeconfig"))
    assert main(["certs", *argv, "--kubeconfig", kubeconfig]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1
    assert apiserver.requests() == []


def test_a_missing_flag_is_argparse_usage_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["certs", "create", "--service", "w"])
    assert exit_info.value.code == 2
    assert "the following arguments are required: --namespace, --secret-name" in capsys.readouterr().err


def test_flags_come_from_the_environment(
    apiserver: ApiServerStandin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    apiserver.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpu"}})
    monkeypatch.setenv("KUBE_VGPU_KUBECONFIG", str(apiserver.write_kubeconfig(tmp_path / "kubeconfig")))
    monkeypatch.setenv("KUBE_VGPU_SERVICE", "admission")
    monkeypatch.setenv("KUBE_VGPU_NAMESPACE", "gpu")
    monkeypatch.setenv("KUBE_VGPU_SECRET_NAME", "admission-tls")
    monkeypatch.setenv("KUBE_VGPU_DAYS", "90")
    assert main(["certs", "create"]) == 0
    assert apiserver.get("secrets", "admission-tls", "gpu") is not None
