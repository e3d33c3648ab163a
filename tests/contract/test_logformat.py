"""Every process logs one format (`<time> level=<LEVEL> logger=<name> event=...`): the webhook, the
node plugin and the certs command, run as the real CLI."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} level=[A-Z]+ logger=kube_vgpu\.[a-z_.]+ event=\w+")


def stderr_of(*argv: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-m", "kube_vgpu", *argv], capture_output=True, text=True, timeout=60, check=False
    )
    return [line for line in result.stderr.splitlines() if line.strip()]


@pytest.mark.parametrize(
    "argv",
    [
        ("webhook", "--tls-cert-file=/missing", "--tls-key-file=/missing", "--config=/missing/config.yaml"),
        ("node", "--node-name=n1", "--config=/missing/config.yaml"),
    ],
    ids=["webhook", "node"],
)
def test_servers_log_in_the_one_format(argv: tuple[str, ...]) -> None:
    lines = stderr_of(*argv)
    assert lines and all(LINE.match(line) for line in lines), lines


def test_certs_logs_in_the_one_format(tmp_path: Path) -> None:
    lines = stderr_of("certs", "write", f"--out={tmp_path / 'tls'}", "--host=a.example")
    assert lines and all(LINE.match(line) for line in lines), lines
