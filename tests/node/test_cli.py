"""`kube-vgpu node` as a process: simulated GPUs, the stand-ins, SIGTERM, and refusals of bad input."""

from __future__ import annotations

import asyncio
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
from kube_vgpu.node.deviceplugin.server import socket_name
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.standins.hamicore import install_placeholder
from kube_vgpu.standins.kubelet.deviceplugin import KubeletStandin
from tests.support.node import NODE, RESOURCE, free_port, node_object, simulation
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
