"""`kube-vgpu node`: flags, credentials, signals and the exit code.

The work is in `node.plugin` (`--api deviceplugin`) or `node.dra.driver` (`--api dra`); this module
only turns the command line into a running plugin and stops it cleanly on SIGTERM or SIGINT. Which
NVML it runs over (the driver's, or a simulation for `--simulate FILE`) is the caller's choice
(`cli.node`), passed in as an `NvmlLoader`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from kube_vgpu.contract.config import ConfigError, load_config
from kube_vgpu.contract.logformat import configure_logging
from kube_vgpu.contract.names import HAMI_CORE, MODES
from kube_vgpu.kubeapi.client import Kube, KubeConfigError, load_api_client
from kube_vgpu.kubeapi.flags import add_cluster_arguments
from kube_vgpu.node.dra.cdi import DEFAULT_GPU_KIND, CdiError, split_kind
from kube_vgpu.node.dra.checkpoint import CheckpointError
from kube_vgpu.node.dra.driver import DraNodePlugin, DraSettings, gpu_cdi_dirs
from kube_vgpu.node.dra.server import (
    DEFAULT_CDI_DIR,
    DEFAULT_GPU_CDI_DIRS,
    DEFAULT_KUBELET_ROOT_DIR,
    dra_socket,
    registration_socket,
)
from kube_vgpu.node.mig.config import MigConfigError
from kube_vgpu.node.nvml.gpus import DiscoveryError
from kube_vgpu.node.nvml.surface import NvmlLoader
from kube_vgpu.node.plugin import NodePlugin, PluginSettings

# Every default of the node plugin's flags, in one place (the DRA paths are defined beside the code
# that uses them, in node.dra.server and node.dra.cdi).
DEFAULT_KUBELET_DIR = "/var/lib/kubelet/device-plugins"
DEVICEPLUGIN = "deviceplugin"
DRA = "dra"
# The kubelet API a node serves: exactly one (two plugins on a node would offer its GPUs twice).
APIS = (DEVICEPLUGIN, DRA)
DEFAULT_API = DEVICEPLUGIN
# A unix socket's path fits sun_path, 108 bytes with its terminating NUL (unix(7)).
SOCKET_PATH_MAX = 107
log = logging.getLogger("kube_vgpu.node")


def _shared_arguments(parser: argparse.ArgumentParser, *, again: bool) -> None:
    """The flags the plugin and `node check` share. `again`: on the check's parser, where they
    default to nothing, so a flag given before `check` (or its variable) is kept unless repeated."""

    def default(value: object) -> object:
        return argparse.SUPPRESS if again else value

    same = " (as for `kube-vgpu node`)" if again else ""
    parser.add_argument(
        "--node-name",
        default=default(None),
        help="this node's name (the DaemonSet passes spec.nodeName); required to serve, "
        f"`check` falls back to the host name{same}",
    )
    parser.add_argument(
        "--mode",
        default=default(HAMI_CORE),
        choices=list(MODES),
        help=f"how GPUs are shared on this node{same}",
    )
    parser.add_argument(
        "--api",
        default=default(DEFAULT_API),
        choices=list(APIS),
        help="the kubelet API this node serves: a device plugin following Volcano's bookings, or a DRA "
        f"driver (vgpu.kube-vgpu.io) that Kubernetes' own scheduler allocates from; one per node{same}",
    )
    parser.add_argument(
        "--kubelet-dir",
        default=default(DEFAULT_KUBELET_DIR),
        help=f"with --api deviceplugin: the kubelet's device-plugin folder{same}",
    )
    parser.add_argument(
        "--kubelet-root-dir",
        default=default(DEFAULT_KUBELET_ROOT_DIR),
        help="the kubelet's root folder (--api dra): the registration socket goes in its "
        f"plugins_registry/, the driver's socket and checkpoint in plugins/vgpu.kube-vgpu.io/{same}",
    )
    parser.add_argument(
        "--cdi-dir",
        default=default(DEFAULT_CDI_DIR),
        help=f"where the CDI spec of each prepared ResourceClaim is written (--api dra){same}",
    )
    parser.add_argument(
        "--gpu-cdi-dirs",
        default=default(",".join(DEFAULT_GPU_CDI_DIRS)),
        help="comma list of folders holding the GPUs' own CDI spec, as `nvidia-ctk cdi generate` "
        f"or the GPU Operator writes it (--api dra){same}",
    )
    parser.add_argument(
        "--gpu-cdi-kind",
        default=default(DEFAULT_GPU_KIND),
        help=f"the CDI kind of the GPUs' own devices in that spec (--api dra){same}",
    )
    parser.add_argument(
        "--config",
        default=default(None),
        help=f"configuration file (YAML); default: every default{same}",
    )
    parser.add_argument(
        "--simulate",
        default=default(None),
        help=f"run over a simulated NVML described by this YAML file (no GPU needed){same}",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The node plugin's flags (each also readable from KUBE_VGPU_<FLAG>) and `node check`."""
    _shared_arguments(parser, again=False)
    add_cluster_arguments(parser)
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"], help="how much to log"
    )
    from kube_vgpu.node.check import command as check_command

    actions = parser.add_subparsers(dest="node_command", required=False, metavar="[check]")
    check = actions.add_parser(
        "check",
        help="report what the plugin would see and offer on this node, read-only; "
        "exit 1 when the node cannot serve its mode",
        description=check_command.__doc__,
    )
    _shared_arguments(check, again=True)
    check_command.add_arguments(check)


def api_refusal(args: argparse.Namespace) -> str | None:
    """Why the flags ask for something no node can serve, or None: a DRA driver shares GPUs by
    HAMi-core only (MIG partitions are not published as devices), and its folder flags must name
    folders."""
    if args.api != DRA:
        return None
    if args.mode != HAMI_CORE:
        return (
            f"--api dra serves --mode {HAMI_CORE} only (got --mode {args.mode}); serve MIG nodes from a "
            "node group with --api deviceplugin"
        )
    for flag in ("kubelet_root_dir", "cdi_dir", "gpu_cdi_kind"):
        if not str(getattr(args, flag)).strip():
            return f"--{flag.replace('_', '-')} must not be empty"
    for socket_path in (registration_socket(args.kubelet_root_dir), dra_socket(args.kubelet_root_dir)):
        length = len(str(socket_path).encode())
        if length > SOCKET_PATH_MAX:
            return (
                f"--kubelet-root-dir {args.kubelet_root_dir}: the socket {socket_path} would be {length} "
                f"bytes long, over the {SOCKET_PATH_MAX} a unix socket's path may have"
            )
    try:
        gpu_cdi_dirs(args.gpu_cdi_dirs)
        split_kind(args.gpu_cdi_kind)
    except ValueError as exc:
        return str(exc)
    except CdiError as exc:
        return f"--gpu-cdi-kind: {exc}"
    return None


async def _serve(plugin: NodePlugin | DraNodePlugin) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await plugin.run(stop)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


def run(args: argparse.Namespace, load_nvml: NvmlLoader) -> int:
    """Serve until SIGTERM over the NVML `load_nvml` gives: 0 on a clean stop, 1 when NVML or the
    GPUs fail, 2 on bad input. `node check` instead: see `node.check.command`."""
    if getattr(args, "node_command", None) == "check":
        from kube_vgpu.node.check import command as check_command

        return check_command.run(args, load_nvml)
    if not args.node_name:
        print("kube-vgpu node: error: the following arguments are required: --node-name", file=sys.stderr)
        return 2
    refusal = api_refusal(args)
    if refusal is not None:
        print(f"kube-vgpu node: error: {refusal}", file=sys.stderr)
        return 2
    configure_logging(args.log_level)
    try:
        config = load_config(args.config)
        nvml = load_nvml(args.node_name)
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
    plugin: NodePlugin | DraNodePlugin
    if args.api == DRA:
        plugin = DraNodePlugin(
            DraSettings(
                node_name=args.node_name,
                config=config,
                kubelet_root_dir=Path(args.kubelet_root_dir),
                cdi_dir=Path(args.cdi_dir),
                gpu_cdi_dirs=gpu_cdi_dirs(args.gpu_cdi_dirs),
                gpu_cdi_kind=args.gpu_cdi_kind,
            ),
            nvml,
            kube,
        )
    else:
        plugin = NodePlugin(
            PluginSettings(
                node_name=args.node_name, mode=args.mode, kubelet_dir=Path(args.kubelet_dir), config=config
            ),
            nvml,
            kube,
        )
    try:
        asyncio.run(_serve(plugin))
    except (DiscoveryError, MigConfigError, CheckpointError, OSError) as exc:
        log.error("event=node_failed node=%s error=%r", args.node_name, str(exc))
        return 1
    finally:
        nvml.nvmlShutdown()
        kube.close()
    return 1 if plugin.failed else 0
