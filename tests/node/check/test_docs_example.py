"""docs/node.md's worked example of `kube-vgpu node check` is what the command prints: each console
block under "Worked example" is run as written (from the repository root, on the example files it
names) and its output and exit status compared line for line, so the page cannot drift from the code.

The example was taken on a machine with no HAMi-core in `/usr/local/vgpu` and no kubelet in
`/var/lib/kubelet/device-plugins`; the test gives the command folders of its own in their place (a
missing hook folder, and a missing or listening kubelet folder as the block says) and writes the
documented paths back into the output before comparing.
"""

from __future__ import annotations

import re
import shlex
import socket
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from kube_vgpu.cli.main import main

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "node.md"
DEFAULT_HOOK = "/usr/local/vgpu"
DEFAULT_KUBELET = "/var/lib/kubelet/device-plugins"


@dataclass(frozen=True)
class Example:
    """One console block: the command as typed, what it printed, and its exit status."""

    argv: list[str]
    output: list[str]
    status: int


def examples(page: str) -> list[Example]:
    section = page.split("#### Worked example", 1)[1].split("\n### ", 1)[0]
    found: list[Example] = []
    for block in re.findall(r"```console\n(.*?)```", section, re.S):
        lines = block.rstrip("\n").split("\n")
        assert lines[0].startswith("$ kube-vgpu node check "), lines[0]
        assert lines[-2] == "$ echo $?", lines[-2]
        found.append(Example(shlex.split(lines[0][2:])[1:], lines[1:-2], int(lines[-1])))
    return found


EXAMPLES = examples(PAGE.read_text(encoding="utf-8"))


def test_the_page_has_both_worked_examples() -> None:
    # A failing and a passing node; a parser that found nothing would make the test below vacuous.
    assert sorted(e.status for e in EXAMPLES) == [0, 1]


def _flag(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name:
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: " ".join(e.argv))
def test_the_worked_example_is_what_the_command_prints(
    example: Example,
    kdir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(ROOT)  # the blocks name the example files relative to the repository
    for name in ("KUBE_VGPU_MODE", "KUBE_VGPU_KUBELET_DIR", "KUBE_VGPU_CONFIG", "KUBE_VGPU_SIMULATE"):
        monkeypatch.delenv(name, raising=False)
    assert _flag(example.argv, "--config") is None, "the example relies on the default configuration"
    hook = tmp_path / "no-hami-core"  # never created: HAMi-core is absent in both examples
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"node": {"hookPath": str(hook)}}))

    listener: socket.socket | None = None
    written_kubelet = _flag(example.argv, "--kubelet-dir")
    argv = list(example.argv)
    if written_kubelet is None:
        written_kubelet = DEFAULT_KUBELET
        kubelet = kdir / "absent"  # as on a machine with no kubelet (kdir: a short path, for the socket)
        argv.append(f"--kubelet-dir={kubelet}")
    else:
        kubelet = kdir / "k"  # the block says this folder holds a listening kubelet.sock
        kubelet.mkdir()
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(kubelet / "kubelet.sock"))
        listener.listen()
        i = argv.index("--kubelet-dir")
        argv[i : i + 2] = [f"--kubelet-dir={kubelet}"]
    argv.append(f"--config={config}")
    try:
        status = main(argv)
    finally:
        if listener is not None:
            listener.close()
    out, err = capsys.readouterr()
    printed = (out + err).replace(str(hook), DEFAULT_HOOK).replace(str(kubelet), written_kubelet)
    assert (printed.rstrip("\n").split("\n"), status) == (example.output, example.status)
