"""Read-only MIG inspection: `python -m kube_vgpu.node.mig.inspect [--device-config FILE]`.

Superseded by `kube-vgpu node check --mode mig [--device-config FILE] -o json`, which reports the
same facts per GPU (from `node.check.gpus`, where this code now lives) together with everything
else the node plugin depends on; this entry point stays for scripts that call it. Prints, as JSON,
what the node plugin's MIG mode would work from on every GPU: MIG mode (current and pending), the
GPU instance profiles with memory and placements, where the plugin would place each position of
each geometry group, and the existing GPU/compute instances with their MIG device UUIDs and NVML's
MIG device index order. It changes nothing, so it is safe on a production node. It reads the
driver's NVML; `kube-vgpu node check --simulate FILE --mode mig -o json` reads a simulated one.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kube_vgpu.contract.mig.geometry import parse_device_config
from kube_vgpu.contract.mig.shipped import default_device_config
from kube_vgpu.node.check.gpus import describe_geometry, describe_gpu, describe_mig
from kube_vgpu.node.nvml.real import real_nvml
from kube_vgpu.node.nvml.surface import Nvml

__all__ = ["describe_geometry", "describe_gpu", "describe_mig", "main"]


def main(argv: list[str] | None = None, nvml: Nvml | None = None) -> int:
    """Print `describe_mig` of `nvml` (default: the driver's) as JSON; 1 when NVML cannot start."""
    parser = argparse.ArgumentParser(prog="python -m kube_vgpu.node.mig.inspect", description=__doc__)
    parser.add_argument(
        "--device-config",
        default=None,
        help="a device-config.yaml to plan its groups against the GPUs (default: the built-in geometry)",
    )
    args = parser.parse_args(argv)
    try:
        config = (
            parse_device_config(Path(args.device_config).read_text(encoding="utf-8"))
            if args.device_config
            else default_device_config()
        )
    except (OSError, ValueError) as exc:
        print(f"cannot use --device-config {args.device_config}: {exc}", file=sys.stderr)
        return 2
    if nvml is None:
        nvml = real_nvml()
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        print(f"cannot initialise NVML: {exc}", file=sys.stderr)
        return 1
    try:
        print(json.dumps(describe_mig(nvml, config), indent=2))
    finally:
        nvml.nvmlShutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
