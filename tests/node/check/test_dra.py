"""`kube-vgpu node check --api dra` on simulated nodes: the DRA sockets, the devices the plugin would
publish (consumable capacity on and off, tainted while HAMi-core is missing), the CDI folders, and
the exit code."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kube_vgpu.cli.main import main
from kube_vgpu.demo.dra import nvidia_cdi_spec
from kube_vgpu.node.dra.server import dra_socket, registration_socket
from kube_vgpu.standins.hamicore import install_placeholder
from tests.support.node import short_tempdir

NODE = "gpu-node-1"
A100 = "NVIDIA A100-SXM4-80GB"
UUID_A = "GPU-1c2d3e4f-0a1b-2c3d-4e5f-60718293a4b5"
UUID_B = "GPU-9f8e7d6c-5b4a-3928-1706-f5e4d3c2b1a0"


class DraNode:
    """A simulated two-A100 node: kubelet root with its plugin registry, CDI folder, hookPath."""

    def __init__(self, tmp: Path, root: Path) -> None:
        self.root = root
        (root / "plugins_registry").mkdir()
        self.hook = tmp / "hook"
        install_placeholder(self.hook)
        self.cdi = tmp / "cdi"
        self.cdi.mkdir()
        self.sim = tmp / "sim.yaml"
        self.sim.write_text(
            yaml.safe_dump(
                {"gpus": [{"model": A100, "memoryMiB": 81920, "count": 2, "uuids": [UUID_A, UUID_B]}]}
            )
        )
        self.config = tmp / "config.yaml"
        self.config.write_text(yaml.safe_dump({"node": {"hookPath": str(self.hook)}}))

    def nvidia_spec(self, gpus: list[tuple[int, str]]) -> None:
        (self.cdi / "nvidia.json").write_text(json.dumps(nvidia_cdi_spec(gpus)))

    def argv(self, *extra: str) -> list[str]:
        return [
            "node",
            "check",
            "--api=dra",
            f"--node-name={NODE}",
            f"--simulate={self.sim}",
            f"--config={self.config}",
            f"--kubelet-root-dir={self.root}",
            f"--cdi-dir={self.cdi}",
            f"--gpu-cdi-dirs={self.cdi}",
            *extra,
        ]


@pytest.fixture
def node(tmp_path: Path) -> Iterator[DraNode]:
    with short_tempdir() as root:
        yield DraNode(tmp_path, root)


def report_of(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, dict[str, Any], str]:
    code = main([*argv, "-o", "json"])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


def test_a_ready_node_reports_sockets_pool_and_cdi(node: DraNode, capsys: pytest.CaptureFixture[str]) -> None:
    node.nvidia_spec([(0, UUID_A), (1, UUID_B)])
    code, report, err = report_of(capsys, node.argv())
    assert (code, err, report["problems"]) == (0, "", [])
    assert report["api"] == "dra"
    sockets = report["draSockets"]
    assert sockets["pluginsRegistry"]["present"] is True
    assert sockets["registration"] == {
        "path": str(registration_socket(node.root)),
        "present": False,
        "isSocket": False,
    }
    assert sockets["driver"]["path"] == str(dra_socket(node.root))
    pool = report["wouldPublish"]
    assert (pool["driver"], pool["pool"], pool["held"]) == ("vgpu.kube-vgpu.io", NODE, "")
    shared = pool["consumableCapacity"]
    assert [(d["name"], d["uuid"], d["shared"]) for d in shared] == [
        ("gpu-0", UUID_A, True),
        ("gpu-1", UUID_B, True),
    ]
    assert shared[0]["capacity"] == {"memory": "80Gi", "cores": "100"}
    assert shared[0]["requestPolicy"]["memory"]["validRange"]["min"] == "256Mi"
    assert shared[0]["taints"] == []
    whole = pool["wholeGpus"]
    assert [(d["name"], d["shared"], d["requestPolicy"]) for d in whole] == [
        ("gpu-0", False, {}),
        ("gpu-1", False, {}),
    ]
    cdi = report["cdi"]
    assert (cdi["exists"], cdi["writable"]) == (True, True)
    assert cdi["gpuSpec"]["gpus"] == {UUID_A: f"nvidia.com/gpu={UUID_A}", UUID_B: f"nvidia.com/gpu={UUID_B}"}
    assert cdi["gpuSpec"]["files"][0]["path"] == str(node.cdi / "nvidia.json")

    assert main(node.argv()) == 0
    text = capsys.readouterr().out
    assert "api dra" in text
    assert f"registration socket {registration_socket(node.root)}: absent" in text
    assert "with consumable capacity on" in text
    assert f"gpu-0  {UUID_A}  shared  memory 80Gi, cores 100" in text
    assert f"gpu-0  {UUID_A}  whole  memory 80Gi, cores 100" in text
    assert f"{UUID_B} -> nvidia.com/gpu={UUID_B}" in text
    assert text.rstrip().endswith("OK: this node can serve DRA")


def test_serving_sockets_are_seen_and_a_file_in_their_place_is_a_problem(
    node: DraNode, capsys: pytest.CaptureFixture[str]
) -> None:
    node.nvidia_spec([(0, UUID_A), (1, UUID_B)])
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(registration_socket(node.root)))
    dra_socket(node.root).parent.mkdir(parents=True)
    dra_socket(node.root).write_text("not a socket")
    try:
        code, report, err = report_of(capsys, node.argv())
    finally:
        listener.close()
    assert report["draSockets"]["registration"]["isSocket"] is True
    assert report["problems"] == [
        f"{dra_socket(node.root)} is not a socket: the plugin could not serve there"
    ]
    assert code == 1
    assert err.startswith(f"node {NODE} cannot serve DRA: {dra_socket(node.root)} is not a socket")


def test_a_gpu_missing_from_the_toolkit_spec_fails_the_node(
    node: DraNode, capsys: pytest.CaptureFixture[str]
) -> None:
    # Index naming only, and GPU 1 absent: GPU 0 is found by its index, GPU 1 not at all.
    spec = nvidia_cdi_spec([(0, UUID_A)])
    spec["devices"] = [d for d in spec["devices"] if d["name"] == "0"]
    (node.cdi / "nvidia.yaml").write_text(yaml.safe_dump(spec))
    code, report, err = report_of(capsys, node.argv())
    assert report["cdi"]["gpuSpec"]["gpus"] == {UUID_A: "nvidia.com/gpu=0", UUID_B: None}
    assert code == 1
    assert f"for GPU(s) {UUID_B}: prepare would refuse claims on them" in err


def test_no_toolkit_spec_and_no_registry_are_both_named(
    node: DraNode, capsys: pytest.CaptureFixture[str]
) -> None:
    (node.root / "plugins_registry").rmdir()
    code, report, err = report_of(capsys, node.argv())
    assert code == 1
    assert report["cdi"]["gpuSpec"]["files"] == []
    assert len(report["problems"]) == 2
    assert "the kubelet's plugin registry" in report["problems"][0]
    assert "--kubelet-root-dir" in report["problems"][0]
    assert "nvidia-ctk cdi generate" in report["problems"][1]
    assert "(and 1 more problem(s), listed above)" in err


def test_a_cdi_folder_that_cannot_be_made(node: DraNode, capsys: pytest.CaptureFixture[str]) -> None:
    # Under a regular file: no folder can be made there, by root either.
    node.nvidia_spec([(0, UUID_A), (1, UUID_B)])
    blocked = node.cdi / "nvidia.json" / "claims"
    code, report, err = report_of(capsys, [*node.argv(), f"--cdi-dir={blocked}"])
    assert (report["cdi"]["exists"], report["cdi"]["writable"], code) == (False, False, 1)
    assert f"the CDI folder {blocked} cannot be written" in err


def test_a_missing_cdi_folder_under_a_writable_parent_is_fine(
    node: DraNode, capsys: pytest.CaptureFixture[str]
) -> None:
    node.nvidia_spec([(0, UUID_A), (1, UUID_B)])
    code, report, _ = report_of(capsys, [*node.argv(), f"--cdi-dir={node.cdi / 'claims'}"])
    assert (report["cdi"]["exists"], report["cdi"]["writable"], code) == (False, True, 0)


def test_without_hami_core_every_gpu_is_tainted_and_the_node_fails(
    node: DraNode, capsys: pytest.CaptureFixture[str]
) -> None:
    node.nvidia_spec([(0, UUID_A), (1, UUID_B)])
    for child in node.hook.iterdir():
        child.unlink()
    code, report, err = report_of(capsys, node.argv())
    pool = report["wouldPublish"]
    assert pool["held"].startswith(f"HAMi-core not usable in {node.hook}")
    for key in ("consumableCapacity", "wholeGpus"):
        assert [t["key"] for d in pool[key] for t in d["taints"]] == ["vgpu.kube-vgpu.io/unhealthy"] * 2
        assert {t["effect"] for d in pool[key] for t in d["taints"]} == {"NoSchedule"}
    assert pool["withoutDeviceTaints"] == 0
    assert code == 1
    assert "HAMi-core is not usable" in err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--mode=mig"], "--api dra serves --mode hami-core only"),
        (["--gpu-cdi-kind=bad"], "--gpu-cdi-kind: CDI kind 'bad' is not vendor/class"),
    ],
)
def test_flags_no_node_can_serve_exit_2(
    node: DraNode, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    assert main(node.argv(*extra)) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_the_api_reaches_the_check_from_the_plugins_variable(
    node: DraNode, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    node.nvidia_spec([(0, UUID_A), (1, UUID_B)])
    monkeypatch.setenv("KUBE_VGPU_API", "dra")
    argv = [a for a in node.argv() if a != "--api=dra"]
    code, report, _ = report_of(capsys, argv)
    assert (code, report["api"]) == (0, "dra")
