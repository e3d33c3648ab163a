"""`kube-vgpu node check [--simulate FILE] [-o json]`: print the report, exit 0 when the node can
serve its mode, 1 with a one-line reason on stderr when it cannot (or NVML does not start), 2 on bad
input. The flags are the node plugin's own (given before or after `check`, or from the same
`KUBE_VGPU_*` variables), so inside the DaemonSet's pod the check sees what the plugin sees.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from pathlib import Path

from kube_vgpu.contract.config import ConfigError, load_config
from kube_vgpu.contract.logformat import configure_logging
from kube_vgpu.contract.mig.geometry import DeviceConfig, parse_device_config
from kube_vgpu.contract.mig.shipped import default_device_config
from kube_vgpu.node.check.dra import DraCheckSettings
from kube_vgpu.node.check.render import render_text
from kube_vgpu.node.check.report import CheckSettings, check_node, one_line_reason
from kube_vgpu.node.nvml.surface import NvmlLoader

OUTPUTS = ("text", "json")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The check's own flags (the node plugin's shared ones are added by `node.cli`)."""
    parser.add_argument("-o", "--output", default="text", choices=list(OUTPUTS), help="report format")
    parser.add_argument(
        "--device-config",
        default=None,
        help="mig mode: Volcano's device-config.yaml to check the GPUs against "
        "(default: the geometry kube-vgpu ships, which the chart installs)",
    )


def _geometry(path: str | None) -> DeviceConfig:
    if path is None:
        return default_device_config()
    try:
        return parse_device_config(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"cannot read --device-config {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ValueError(f"cannot use --device-config {path}: {exc}") from None


def _nvml_source(simulate: str | None) -> str:
    if simulate:
        return f"simulated, from {simulate} (no GPU is read)"
    return "the NVIDIA driver's libnvidia-ml.so.1"


def run(args: argparse.Namespace, load_nvml: NvmlLoader) -> int:
    """Check over the NVML `load_nvml` gives, print, and return the exit code."""
    # The report says everything; the plugin code it reuses would say parts of it again as logs.
    configure_logging("debug" if args.log_level == "debug" else "error")
    node_name = args.node_name or socket.gethostname()
    # The plugin's own refusal of flags no node can serve (imported here: node.cli imports this module).
    from kube_vgpu.node.cli import DRA, api_refusal

    refusal = api_refusal(args)
    if refusal is not None:
        print(f"kube-vgpu node check: {refusal}", file=sys.stderr)
        return 2
    dra = None
    if args.api == DRA:
        dra = DraCheckSettings(
            kubelet_root_dir=Path(args.kubelet_root_dir),
            cdi_dir=Path(args.cdi_dir),
            gpu_cdi_dirs=tuple(Path(p.strip()) for p in args.gpu_cdi_dirs.split(",") if p.strip()),
            gpu_cdi_kind=args.gpu_cdi_kind,
        )
    try:
        config = load_config(args.config)
        geometry = _geometry(args.device_config)
        nvml = load_nvml(node_name)
    except (ConfigError, ValueError) as exc:
        # ValueError: SimulationError (a bad --simulate file) or an unusable --device-config.
        print(f"kube-vgpu node check: {exc}", file=sys.stderr)
        return 2
    what = "DRA" if dra is not None else args.mode
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        print(
            f"node {node_name} cannot serve {what}: cannot initialise NVML: {exc} "
            "(no NVIDIA driver here, or the container lacks NVIDIA_DRIVER_CAPABILITIES=utility?)",
            file=sys.stderr,
        )
        return 1
    settings = CheckSettings(
        node_name=node_name,
        mode=args.mode,
        kubelet_dir=Path(args.kubelet_dir),
        config=config,
        nvml_source=_nvml_source(args.simulate),
        geometry=geometry,
        dra=dra,
    )
    try:
        report = check_node(nvml, settings)
    except nvml.NVMLError as exc:
        print(f"node {node_name} cannot serve {what}: NVML failed: {exc}", file=sys.stderr)
        return 1
    finally:
        nvml.nvmlShutdown()
    if args.output == "json":
        print(json.dumps(report, indent=2))
    else:
        print("\n".join(render_text(report)))
    if report["ok"]:
        return 0
    print(one_line_reason(report), file=sys.stderr)
    return 1
