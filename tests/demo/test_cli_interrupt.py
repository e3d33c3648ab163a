"""Ctrl-C ends the demo at any moment with exit code 130 and one line, every part stopped first.

A real demo process gets SIGINT as soon as a line marking a phase appears: while the parts start
(their own log lines, with --verbose), while the examples' usage is read, while the demo serves its
metrics, and after its last line, while it stops everything and exits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kube_vgpu.demo.cli import INTERRUPTED_LINE
from tests.support.timeouts import HANG_S

REPO = Path(__file__).resolve().parents[2]

# What must never reach the terminal after a Ctrl-C.
NOISE = ("Traceback", "KeyboardInterrupt", "InvalidStateError", "level=ERROR", "Task exception")


def _sigint_default() -> None:
    # A test run started in the background of a non-interactive shell inherits SIGINT ignored, and
    # Python keeps an ignored SIGINT ignored: the demo must hear it as a terminal's Ctrl-C.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupted_at(marker: str, *args: str) -> tuple[int, list[str], str]:
    """Run the demo, send SIGINT once a stdout line contains `marker`; (exit code, the stdout lines
    up to the marker, stderr). With --verbose the parts' log lines (stderr) are read as stdout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBE_VGPU_")}
    verbose = "--verbose" in args
    with subprocess.Popen(
        [sys.executable, "-m", "kube_vgpu", "demo", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if verbose else subprocess.PIPE,
        text=True,
        preexec_fn=_sigint_default,  # noqa: PLW1509 - only a signal disposition, before exec
    ) as demo:
        assert demo.stdout is not None
        seen: list[str] = []
        for line in demo.stdout:
            seen.append(line)
            if marker in line:
                demo.send_signal(signal.SIGINT)
                break
        else:
            pytest.fail(f"the demo ended without printing {marker!r}:\n{''.join(seen)}")
        try:
            after, errors = demo.communicate(timeout=HANG_S)
        except subprocess.TimeoutExpired:
            demo.kill()
            pytest.fail(f"the demo did not end within {HANG_S:g} s of Ctrl-C at {marker!r}")
        code = demo.returncode
    return code, seen, after if verbose else errors


@pytest.mark.slow
@pytest.mark.parametrize(
    "marker",
    [
        "event=apiserver_started",  # the first node's kubelet and gRPC servers about to start
        "event=registered node=gpu-a100",  # one node plugin up, the next one starting
        "event=webhook_started",  # the webhook's cache synced, Volcano's config being read
    ],
)
def test_ctrl_c_while_the_parts_start(marker: str) -> None:
    code, _, after = interrupted_at(marker, "--once", "--verbose")
    assert code == 130, after
    assert after.endswith(INTERRUPTED_LINE), after
    assert not [line for line in after.splitlines() if any(word in line for word in NOISE)], after


@pytest.mark.slow
@pytest.mark.parametrize(
    ("marker", "args"),
    [
        ("examples ended as expected", ("--once",)),  # reading the containers' usage
        ("(used/limit;", ("--once",)),  # the last line: stopping every part and exiting
        ("node gpu-h100-mig: http://", ()),  # serving metrics until Ctrl-C
    ],
)
def test_ctrl_c_after_the_examples_prints_one_line(marker: str, args: tuple[str, ...]) -> None:
    code, seen, errors = interrupted_at(marker, *args)
    assert code == 130, errors
    assert errors == INTERRUPTED_LINE
    assert seen[0].startswith("kube-vgpu demo:")
