"""Every command in the README's shell blocks works when copied as written.

The quick ones run for real (`kube-vgpu --version`, the chart rendered with the install's `--set`
values); the slow ones (the demo, the test command) and those that need a cluster (`kube-vgpu top`)
are parsed by the real command-line parser, and their scripts must exist and be executable. Tools
of the cluster (`kubectl`, `docker`) are checked for what they name in this repository.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kube_vgpu.cli.main import build_parser
from tests.support.timeouts import HANG_S

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def shell_commands(markdown: str) -> Iterator[list[str]]:
    """Each command of each ```sh block: continuation lines joined, comments dropped, && split."""
    for block in re.findall(r"```sh\n(.*?)```", markdown, re.DOTALL):
        text = block.replace("\\\n", " ")
        for line in text.splitlines():
            words = shlex.split(line, comments=True)
            command: list[str] = []
            for word in [*words, "&&"]:
                if word == "&&":
                    if command:
                        yield command
                    command = []
                else:
                    command.append(word)


def inline_scripts(markdown: str) -> Iterator[list[str]]:
    """Inline code that starts with one of the repository's scripts."""
    for span in re.findall(r"`(\./scripts/[^`]*)`", markdown):
        yield shlex.split(span)


COMMANDS = list(shell_commands(README)) + list(inline_scripts(README))


def parse_kube_vgpu(args: list[str]) -> None:
    """Parse as the real entry point would; argparse's refusal fails the test with its message."""
    chosen = next((a for a in args if not a.startswith("-")), None)
    parser = build_parser(chosen)
    try:
        parser.parse_args(args)
    except SystemExit as exc:  # --version and --help end here with 0
        if exc.code not in (0, None):
            raise AssertionError(f"kube-vgpu {shlex.join(args)}: refused by the parser") from exc


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBE_VGPU_")}
    return subprocess.run(
        argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=HANG_S, check=False
    )


def check(command: list[str]) -> None:
    program, args = command[0], command[1:]
    if program.startswith("./scripts/"):
        script = REPO / program
        assert script.is_file() and os.access(script, os.X_OK), f"{program} is not an executable script"
        if program == "./scripts/demo.sh":
            parse_kube_vgpu(["demo", *args])  # the script hands its arguments to `kube-vgpu demo`
        elif program == "./scripts/chart.sh":
            assert args[:1] in (["template"], ["lint"]), command
            result = run([sys.executable, "scripts/chart.py", *args])  # what the script execs
            assert result.returncode == 0, result.stderr
        else:
            assert program == "./scripts/test.sh" and not args, f"no check written for {shlex.join(command)}"
    elif program in ("kube-vgpu", ".venv/bin/kube-vgpu"):
        parse_kube_vgpu(args)
        if args == ["--version"]:
            result = run([sys.executable, "-m", "kube_vgpu", "--version"])
            assert result.returncode == 0 and result.stdout.startswith("kube-vgpu "), result
    elif program == "helm":
        assert args[:1] == ["install"], command
        chart = args[2]
        assert (REPO / chart / "Chart.yaml").is_file(), f"{chart} is not a chart in this repository"
        sets = [a for i, a in enumerate(args) if i > 0 and args[i - 1] == "--set"]
        result = run([sys.executable, "scripts/chart.py", "template", *[f"--set={s}" for s in sets]])
        assert result.returncode == 0, result.stderr  # the install's values render
    elif program == "docker":
        if args[:1] == ["build"]:
            assert args[-1] == "." and (REPO / "Dockerfile").is_file(), command
        else:
            assert args[:1] == ["push"], command
    else:
        # Commands against the cluster: nothing of this repository to check.
        assert program == "kubectl", f"no check written for {shlex.join(command)}"


def test_the_readme_has_its_commands() -> None:
    programs = {c[0] for c in COMMANDS}
    assert {"./scripts/demo.sh", "./scripts/test.sh", "helm", "kube-vgpu"} <= programs


@pytest.mark.parametrize("command", COMMANDS, ids=[shlex.join(c)[:60] for c in COMMANDS])
def test_each_readme_command_works_as_written(command: list[str]) -> None:
    check(command)


def test_a_synopsis_copied_as_a_command_is_caught() -> None:
    (demo,) = shell_commands("```sh\n./scripts/demo.sh [--once]   # the demo\n```\n")
    with pytest.raises(AssertionError, match="refused by the parser"):
        check(demo)
