"""The one entry point: subcommands, environment-variable defaults, and loading only the chosen part."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kube_vgpu.cli.main import _chosen, apply_env_defaults, build_parser


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
    sub = parser._subparsers._group_actions[0].choices["webhook"]  # type: ignore[union-attr]
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
