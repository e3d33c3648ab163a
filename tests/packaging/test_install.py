"""Installing kube-vgpu adds one import name, `kube_vgpu`, and leaves other packages' modules alone
(a top-level `proto` would replace proto-plus's, which every Google Cloud client library installs)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel `pip install .` would install, built from a copy of what the build reads."""
    tree = tmp_path_factory.mktemp("tree")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, tree / name)
    shutil.copytree(REPO / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "-w", str(out), str(tree)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    (built,) = out.glob("kube_vgpu-*.whl")
    return built


def test_the_wheel_installs_one_top_level_name(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/", 1)[0] for name in archive.namelist()}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"kube_vgpu"}
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    # The data the package reads at run time travels with it.
    assert "kube_vgpu/proto/deviceplugin_v1beta1.proto" in names
    assert "kube_vgpu/py.typed" in names


def test_installed_beside_proto_plus_both_import(wheel: Path, tmp_path: Path) -> None:
    pytest.importorskip("proto", reason="proto-plus is a test dependency")
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--disable-pip-version-check",
         "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    # `bin/` holds the console script; every other entry would be an import name.
    installed = {p.name for p in target.iterdir() if not p.name.endswith(".dist-info")}
    assert installed == {"kube_vgpu", "bin"}
    assert (target / "bin" / "kube-vgpu").is_file()
    code = (
        "import proto, kube_vgpu.proto.deviceplugin_v1beta1_pb2 as pb, kube_vgpu.cli.main as m\n"
        "assert proto.Message and proto.Field, proto.__file__\n"
        "assert m.__file__.startswith(sys.argv[1]), m.__file__\n"
        "print(pb.DESCRIPTOR.package)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", "import sys\n" + code, str(target)],
        capture_output=True,
        text=True,
        check=False,
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "v1beta1"
