"""The one entry point: subcommands, environment-variable defaults, and loading only the chosen part."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from kube_vgpu.cli.main import _chosen, apply_env_defaults, build_parser, main


def test_flags_default_to_their_environment_variables() -> None:
    parser = build_parser("node")
    apply_env_defaults(parser, {"KUBE_VGPU_NODE_NAME": "gpu-7", "KUBE_VGPU_MODE": "mig"})
    args = parser.parse_args(["node"])
    assert (args.node_name, args.mode) == ("gpu-7", "mig")
    # The command line wins over the environment.
    assert parser.parse_args(["node", "--node-name", "gpu-8"]).node_name == "gpu-8"


def test_env_help_names_the_variable() -> None:
    parser = build_parser("webhook")
    apply_env_defaults(parser, {})
    (sub,) = [s for s in parser.subparsers() if s.prog == "kube-vgpu webhook"]
    assert "[env KUBE_VGPU_TLS_CERT_FILE]" in " ".join(sub.format_help().split())


@pytest.mark.parametrize(
    ("argv", "expected"),
    [(["certs", "write"], "certs"), (["--help"], None), (["demo", "--once"], "demo"), (["nope"], None)],
)
def test_the_chosen_subcommand_is_found(argv: list[str], expected: str | None) -> None:
    assert _chosen(argv) == expected


def test_running_certs_does_not_import_grpc() -> None:
    code = (
        "import sys; from kube_vgpu.cli.main import build_parser; "
        "build_parser('certs'); print('grpc' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


# --- environment variables: a flag wins, a bad variable is named, a variable a flag overrides is ignored


def run_main(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], env: dict[str, str], argv: list[str]
) -> tuple[int, str]:
    """`kube-vgpu ARGV` as far as its flags: exit code 2 and stderr when refused, else 0 and ''."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    parser = build_parser(_chosen(argv))
    apply_env_defaults(parser, dict(env))
    try:
        parser.parse_args(argv)
    except SystemExit as exc:
        return int(str(exc.code)), capsys.readouterr().err
    return 0, capsys.readouterr().err


WEBHOOK = ["webhook", "--tls-cert-file", "c", "--tls-key-file", "k"]
SERVICE_LINK = {"KUBE_VGPU_PORT": "tcp://10.96.0.5:443"}


def test_a_service_link_variable_is_ignored_when_the_flag_is_given() -> None:
    # Kubernetes injects KUBE_VGPU_PORT=tcp://IP:PORT into pods for a Service named kube-vgpu.
    parser = build_parser("webhook")
    apply_env_defaults(parser, dict(SERVICE_LINK))
    assert parser.parse_args([*WEBHOOK, "--port", "8443"]).port == 8443


def test_a_service_link_variable_without_the_flag_is_named_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run_main(monkeypatch, capsys, SERVICE_LINK, WEBHOOK)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "KUBE_VGPU_PORT='tcp://10.96.0.5:443': expected an integer" in err
    assert "service link" in err and "--port" in err


@pytest.mark.parametrize(
    ("env", "argv", "says"),
    [
        (
            {"KUBE_VGPU_LOG_LEVEL": "verbose"},
            ["node", "--node-name", "n"],
            "KUBE_VGPU_LOG_LEVEL='verbose': expected one of debug, info, warning, error",
        ),
        (
            {"KUBE_VGPU_MODE": "gpu"},
            ["node", "--node-name", "n"],
            "KUBE_VGPU_MODE='gpu': expected one of hami-core, mig",
        ),
        ({"KUBE_VGPU_ONCE": "yes-please"}, ["demo"], "KUBE_VGPU_ONCE='yes-please': expected true or false"),
        (
            {"KUBE_VGPU_DAYS": "a year"},
            ["certs", "write", "--out", "o", "--host", "h"],
            "expected an integer",
        ),
        ({"KUBE_VGPU_REQUEST_TIMEOUT": "10s"}, WEBHOOK, "KUBE_VGPU_REQUEST_TIMEOUT='10s': expected a number"),
    ],
)
def test_a_bad_variable_is_refused_naming_it_and_its_value(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    env: dict[str, str],
    argv: list[str],
    says: str,
) -> None:
    code, err = run_main(monkeypatch, capsys, env, argv)
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("env", "argv", "dest", "expected"),
    [
        (
            {"KUBE_VGPU_LOG_LEVEL": "verbose"},
            ["node", "--node-name", "n", "--log-level", "debug"],
            "log_level",
            "debug",
        ),
        ({"KUBE_VGPU_MODE": "gpu"}, ["node", "--node-name", "n", "--mode", "mig"], "mode", "mig"),
        ({"KUBE_VGPU_ONCE": "yes-please"}, ["demo", "--once"], "once", True),
        ({"KUBE_VGPU_ONCE": "yes"}, ["demo"], "once", True),
        ({"KUBE_VGPU_ONCE": "off"}, ["demo"], "once", False),
        ({"KUBE_VGPU_ONCE": "0"}, ["demo"], "once", False),
        ({"KUBE_VGPU_PORT": "9443"}, WEBHOOK, "port", 9443),
        (
            {"KUBE_VGPU_HOST": "a.example,10.0.0.1"},
            ["certs", "write", "--out", "o"],
            "host",
            ["a.example", "10.0.0.1"],
        ),
        ({"KUBE_VGPU_HOST": "a.example"}, ["certs", "write", "--out", "o", "--host", "b"], "host", ["b"]),
    ],
)
def test_a_flag_wins_and_a_good_variable_is_read_as_the_flag(
    env: dict[str, str], argv: list[str], dest: str, expected: object
) -> None:
    parser = build_parser(_chosen(argv))
    apply_env_defaults(parser, env)
    assert getattr(parser.parse_args(argv), dest) == expected


def test_a_bad_variable_through_main_exits_2_before_anything_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KUBE_VGPU_MODE", "gpu")
    with pytest.raises(SystemExit) as exit_info:
        main(["node", "--node-name", "n"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith("kube-vgpu node: error: argument --mode: KUBE_VGPU_MODE='gpu'")


def test_version_is_the_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    with open(Path(__file__).resolve().parents[2] / "pyproject.toml", "rb") as file:
        declared = tomllib.load(file)["project"]["version"]
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"kube-vgpu {declared}\n"
    assert declared == importlib.metadata.version("kube-vgpu")


def test_version_is_not_read_from_the_environment(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser(None)
    apply_env_defaults(parser, {"KUBE_VGPU_VERSION": "9.9.9"})
    assert "KUBE_VGPU_VERSION" not in parser.format_help()
