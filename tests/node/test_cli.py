"""`kube-vgpu node` as a process: simulated GPUs, the stand-ins, SIGTERM, and refusals of bad input."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kube_vgpu.cli import node as node_cli
from kube_vgpu.cli.main import Parser, apply_env_defaults
from kube_vgpu.contract.names import NODE_REGISTER
from kube_vgpu.demo.dra import device_class, nvidia_cdi_spec
from kube_vgpu.node.cli import api_refusal
from kube_vgpu.node.deviceplugin.server import socket_name
from kube_vgpu.node.dra.server import DRIVER_NAME, dra_socket, registration_socket
from kube_vgpu.standins.apiserver.dra import FeatureGates
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.standins.dra.scheduler import DraScheduler
from kube_vgpu.standins.hamicore import install_placeholder
from kube_vgpu.standins.kubelet.deviceplugin import KubeletStandin
from kube_vgpu.standins.kubelet.dra import ClaimId, DraKubelet, cdi_ids_for, resolve
from tests.support.dra import slice_claim
from tests.support.node import (
    NODE,
    RESOURCE,
    UUID_A,
    UUID_B,
    eventually,
    free_port,
    node_object,
    short_tempdir,
    simulation,
)
from tests.support.timeouts import HANG_S

ROOT = Path(__file__).resolve().parents[2]
# `kube-vgpu node` without the other subcommands' imports: the same flags, env defaults and run().
NODE_MAIN = (
    "import argparse, os, sys\n"
    "from kube_vgpu.cli.main import Parser, apply_env_defaults\n"
    "from kube_vgpu.cli import node as cli\n"
    "parser = Parser(prog='kube-vgpu node')\n"
    "cli.add_arguments(parser)\n"
    "apply_env_defaults(parser, os.environ)\n"
    "sys.exit(cli.run(parser.parse_args(sys.argv[1:])))\n"
)


def node_main(argv: list[str]) -> int:
    """Run `kube-vgpu node ARGV` in this process."""
    parser = Parser(prog="kube-vgpu node")
    node_cli.add_arguments(parser)
    apply_env_defaults(parser, {})
    return node_cli.run(parser.parse_args(argv))


async def test_runs_on_simulated_gpus_and_stops_on_sigterm(
    apiserver: ApiServerStandin, kdir: Path, tmp_path: Path
) -> None:
    apiserver.put(node_object())
    (tmp_path / "sim.yaml").write_text(yaml.safe_dump(simulation()))
    install_placeholder(tmp_path / "hook")
    config = {"node": {"metricsPort": free_port(), "hookPath": str(tmp_path / "hook")}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    env = {**os.environ, "KUBE_VGPU_NODE_NAME": NODE}
    async with KubeletStandin(kdir) as kubelet:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            NODE_MAIN,
            f"--kubelet-dir={kdir}",
            f"--simulate={tmp_path / 'sim.yaml'}",
            f"--config={tmp_path / 'config.yaml'}",
            f"--kubeconfig={kubeconfig}",
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            async with asyncio.timeout(60):
                plugin = await kubelet.wait_registered(RESOURCE)
            assert plugin.healthy == 20
            node = apiserver.get("Node", NODE)
            assert node is not None and NODE_REGISTER in node["metadata"]["annotations"]
        finally:
            process.send_signal(signal.SIGTERM)
            async with asyncio.timeout(30):
                _, stderr = await process.communicate()
        assert process.returncode == 0, stderr.decode()
        async with asyncio.timeout(HANG_S):
            await kubelet.wait_for(lambda: plugin.ended is not None)
    assert not (kdir / socket_name(RESOURCE)).exists()
    assert "Traceback" not in stderr.decode()
    assert "event=stopped" in stderr.decode()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--simulate=/nonexistent/sim.yaml"], "cannot read simulation file"),
        (["--config=BADCONFIG"], "unknown key"),
    ],
)
def test_bad_input_exits_2_with_a_message(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, extra: list[str], message: str
) -> None:
    (tmp_path / "bad.yaml").write_text("node: {nope: 1}\n")
    (tmp_path / "kubeconfig").write_text("")
    argv = [f"--node-name={NODE}", f"--kubeconfig={tmp_path / 'kubeconfig'}"]
    argv += [a.replace("BADCONFIG", str(tmp_path / "bad.yaml")) for a in extra]
    if not any(a.startswith("--simulate") for a in argv):
        argv.append(f"--simulate={tmp_path / 'sim.yaml'}")
        (tmp_path / "sim.yaml").write_text(yaml.safe_dump(simulation()))
    assert node_main(argv) == 2
    assert message in caplog.text
    assert "Traceback" not in caplog.text


async def test_api_dra_publishes_registers_prepares_and_stops_keeping_its_slices(
    apiserver: ApiServerStandin, tmp_path: Path
) -> None:
    """`--api dra` as a process: the pool published, both sockets served and registered with the
    kubelet's DRA side, a 20 GiB at 30% claim allocated by the scheduler stand-in and prepared into
    HAMi-core limits; SIGTERM removes the sockets and keeps the ResourceSlices."""
    apiserver.feature_gates = FeatureGates.of_release(36)
    apiserver.put(node_object())
    apiserver.put(device_class())
    (tmp_path / "sim.yaml").write_text(yaml.safe_dump(simulation()))
    install_placeholder(tmp_path / "hook")
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    (cdi / "nvidia.json").write_text(json.dumps(nvidia_cdi_spec([(0, UUID_A), (1, UUID_B)])))
    config = {"node": {"metricsPort": free_port(), "hookPath": str(tmp_path / "hook")}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    env = {**os.environ, "KUBE_VGPU_NODE_NAME": NODE, "KUBE_VGPU_API": "dra", "KUBE_VGPU_CDI_DIR": str(cdi)}
    with short_tempdir() as root:
        (root / "plugins_registry").mkdir()
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            NODE_MAIN,
            f"--kubelet-root-dir={root}",
            f"--gpu-cdi-dirs={cdi}",
            f"--simulate={tmp_path / 'sim.yaml'}",
            f"--config={tmp_path / 'config.yaml'}",
            f"--kubeconfig={kubeconfig}",
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        kubelet = DraKubelet(root)
        try:
            await eventually(lambda: registration_socket(root).exists(), within=60)
            assert [(p.driver, p.service) for p in await kubelet.register_all()] == [
                (DRIVER_NAME, "v1.DRAPlugin")
            ]
            pool = [s for s in apiserver.list("ResourceSlice") if s["spec"]["nodeName"] == NODE]
            assert [d["name"] for s in pool for d in s["spec"]["devices"]] == ["gpu-0", "gpu-1"]
            assert all(d["allowMultipleAllocations"] for s in pool for d in s["spec"]["devices"])
            apiserver.put(slice_claim("train", "default", "20Gi", 30))
            stored = DraScheduler(apiserver).allocate("default", "train", NODE)
            uid = stored["metadata"]["uid"]
            prepared = await kubelet.prepare(DRIVER_NAME, [ClaimId("default", "train", uid)])
            container = resolve([cdi], cdi_ids_for(prepared[uid], "gpu"))
            assert container.env_map["CUDA_DEVICE_MEMORY_LIMIT_0"] == "20480m"
            assert container.env_map["CUDA_DEVICE_SM_LIMIT"] == "30"
            assert {"path": "/dev/nvidia0"} in container.device_nodes
        finally:
            await kubelet.close()
            process.send_signal(signal.SIGTERM)
            async with asyncio.timeout(30):
                _, stderr = await process.communicate()
        assert process.returncode == 0, stderr.decode()
        assert not registration_socket(root).exists()
        assert not dra_socket(root).exists()
    # A restart or an uninstall alike keeps the pool; the kubelet wipes a gone driver's slices.
    assert [s["spec"]["nodeName"] for s in apiserver.list("ResourceSlice")] == [NODE]
    assert "Traceback" not in stderr.decode()
    assert "event=stopped node=" in stderr.decode()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--api=dra", "--mode=mig"], "--api dra serves --mode hami-core only (got --mode mig)"),
        (["--api=dra", "--gpu-cdi-dirs=,"], "--gpu-cdi-dirs: expected a comma list of folders"),
        (["--api=dra", "--gpu-cdi-kind=nvidia"], "--gpu-cdi-kind: CDI kind 'nvidia' is not vendor/class"),
        (["--api=dra", "--cdi-dir="], "--cdi-dir must not be empty"),
        (
            ["--api=dra", f"--kubelet-root-dir=/{'k' * 63}"],
            "plugins_registry/vgpu.kube-vgpu.io-reg.sock would be 108 bytes long, over the 107",
        ),
    ],
)
def test_dra_flags_no_node_can_serve_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert node_main([f"--node-name={NODE}", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_one_api_per_node_both_refused_from_flag_and_variable(capsys: pytest.CaptureFixture[str]) -> None:
    parser = Parser(prog="kube-vgpu node")
    node_cli.add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args([f"--node-name={NODE}", "--api=dra,deviceplugin"])
    assert "invalid choice: 'dra,deviceplugin'" in capsys.readouterr().err
    parser = Parser(prog="kube-vgpu node")
    node_cli.add_arguments(parser)
    apply_env_defaults(parser, {"KUBE_VGPU_API": "dra,deviceplugin"})
    with pytest.raises(SystemExit):
        parser.parse_args([f"--node-name={NODE}"])
    assert "KUBE_VGPU_API='dra,deviceplugin': expected one of deviceplugin, dra" in capsys.readouterr().err


def test_the_longest_kubelet_root_dir_a_socket_allows_is_accepted() -> None:
    # 107 bytes: `/<62 k>/plugins_registry/vgpu.kube-vgpu.io-reg.sock`; one more is refused (above).
    root = f"/{'k' * 62}"
    assert len(str(registration_socket(root))) == 107
    parser = Parser(prog="kube-vgpu node")
    node_cli.add_arguments(parser)
    args = parser.parse_args(["--api=dra", f"--kubelet-root-dir={root}"])
    assert api_refusal(args) is None
