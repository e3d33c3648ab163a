"""The repository's `--simulate` examples describe their cards as NVML reports them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.timeouts import HANG_S

REPO = Path(__file__).resolve().parents[3]


def node_check(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBE_VGPU_")}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "kube_vgpu",
            "node",
            "check",
            "--node-name",
            "n1",
            "--kubelet-dir",
            str(tmp_path),
            *args,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_S,
        check=False,
    )


def test_the_a100_example_is_mig_capable_with_mig_mode_off(tmp_path: Path) -> None:
    # An A100 supports MIG: asked for mig mode, the check says to turn MIG mode on, not that the
    # card cannot do it.
    result = node_check(tmp_path, "--simulate", "examples/simulate-a100.yaml", "--mode", "mig")
    assert result.returncode == 1
    assert result.stdout.count("MIG: capable, mode off") == 4, result.stdout
    assert "does not support MIG" not in result.stdout + result.stderr
    assert result.stdout.count("MIG mode is off; enable it with `nvidia-smi -i") == 4, result.stdout


def test_the_h100_example_is_ready_for_mig(tmp_path: Path) -> None:
    result = node_check(tmp_path, "--simulate", "examples/simulate-h100-mig.yaml", "--mode", "mig")
    assert result.stdout.count("MIG: capable, mode on") == 2, result.stdout
    assert "MIG mode is off" not in result.stdout
