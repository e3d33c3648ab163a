"""`kube-vgpu webhook`'s flags: numbers the server would trip over later are refused up front, each
limit on both sides, with exit code 2 and no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from kube_vgpu.cli.main import build_parser, main
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.webhook.cli import check_flags

BASE = ["webhook", "--tls-cert-file", "c", "--tls-key-file", "k"]


def check(*flags: str) -> None:
    check_flags(build_parser("webhook").parse_args([*BASE, *flags]))


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--port", "65536"], "--port must be 0-65535 (0: any free port), got 65536"),
        (["--port", "-1"], "--port must be 0-65535"),
        (["--request-timeout", "nan"], "--request-timeout must be a finite number of seconds, got nan"),
        (["--idle-timeout", "inf"], "--idle-timeout must be a finite number of seconds, got inf"),
        (["--shutdown-timeout", "-0.5"], "--shutdown-timeout must be a number of seconds, at least 0"),
        (["--cert-poll-seconds", "0"], "--cert-poll-seconds must be a number of seconds, at least 0.01"),
    ],
)
def test_out_of_range_numbers_are_refused(flags: list[str], says: str) -> None:
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
        check(*flags)


@pytest.mark.parametrize(
    "flags",
    [
        ["--port", "65535"],
        ["--port", "0"],
        ["--shutdown-timeout", "0"],
        ["--cert-poll-seconds", "0.01"],
        ["--request-timeout", "0.001"],
        ["--idle-timeout", "1e9"],
    ],
)
def test_the_limits_themselves_are_accepted(flags: list[str]) -> None:
    check(*flags)


def test_a_port_past_65535_exits_2_before_anything_starts(
    apiserver: ApiServerStandin, tmp_path: Path
) -> None:
    # Before: the cache started against the API server, then bind() raised OverflowError as a traceback.
    assert main(["certs", "write", "--out", str(tmp_path / "tls"), "--host", "localhost"]) == 0
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    tls = [
        "--tls-cert-file",
        str(tmp_path / "tls" / "tls.crt"),
        "--tls-key-file",
        str(tmp_path / "tls" / "tls.key"),
    ]
    assert main(["webhook", *tls, "--port", "99999", "--kubeconfig", str(kubeconfig)]) == 2
