"""`kube-vgpu node`: flags, NVML (real or simulated), credentials, signals and the exit code.

The work is in `node.plugin`; this module only turns the command line into a running plugin and stops
it cleanly on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from pathlib import Path
from typing import Any

from kube_vgpu.contract.config import ConfigError, load_config
from kube_vgpu.contract.logformat import configure_logging
from kube_vgpu.contract.names import HAMI_CORE, MODES
from kube_vgpu.kubeapi.client import Kube, KubeConfigError, load_api_client
from kube_vgpu.kubeapi.flags import add_cluster_arguments
from kube_vgpu.node.mig.config import MigConfigError
from kube_vgpu.node.nvml.gpus import DiscoveryError
from kube_vgpu.node.plugin import NodePlugin, PluginSettings

DEFAULT_KUBELET_DIR = "/var/lib/kubelet/device-plugins"
log = logging.getLogger("kube_vgpu.node")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The node plugin's flags (each also readable from KUBE_VGPU_<FLAG>)."""
    parser.add_argument(
        "--node-name", required=True, help="this node's name (the DaemonSet passes spec.nodeName)"
    )
    parser.add_argument(
        "--mode", default=HAMI_CORE, choices=list(MODES), help="how GPUs are shared on this node"
    )
    parser.add_argument(
        "--kubelet-dir", default=DEFAULT_KUBELET_DIR, help="the kubelet's device-plugin folder"
    )
    parser.add_argument("--config", default=None, help="configuration file (YAML); default: every default")
    parser.add_argument(
        "--simulate",
        default=None,
        help="run over a simulated NVML described by this YAML file (no GPU needed)",
    )
    add_cluster_arguments(parser)
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"], help="how much to log"
    )


def _load_nvml(args: argparse.Namespace) -> Any:
    if args.simulate:
        from kube_vgpu.node.simnvml.api import load_simulation

        return load_simulation(Path(args.simulate), args.node_name)
    import pynvml

    return pynvml


async def _serve(plugin: NodePlugin) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await plugin.run(stop)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM: 0 on a clean stop, 1 when NVML or the GPUs fail, 2 on bad input."""
    configure_logging(args.log_level)
    try:
        config = load_config(args.config)
        nvml = _load_nvml(args)
        kube = Kube(load_api_client(args.kubeconfig, args.context), component="node")
    except (ConfigError, KubeConfigError, ValueError) as exc:
        # ValueError: SimulationError, a bad --simulate file.
        log.error("event=node_failed node=%s error=%r", args.node_name, str(exc))
        return 2
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        log.error(
            "event=node_failed node=%s error=%r",
            args.node_name,
            f"cannot initialise NVML: {exc} (no NVIDIA driver here? --simulate FILE runs without one)",
        )
        kube.close()
        return 1
    settings = PluginSettings(
        node_name=args.node_name, mode=args.mode, kubelet_dir=Path(args.kubelet_dir), config=config
    )
    plugin = NodePlugin(settings, nvml, kube)
    try:
        asyncio.run(_serve(plugin))
    except (DiscoveryError, MigConfigError, OSError) as exc:
        log.error("event=node_failed node=%s error=%r", args.node_name, str(exc))
        return 1
    finally:
        nvml.nvmlShutdown()
        kube.close()
    return 1 if plugin.failed else 0
