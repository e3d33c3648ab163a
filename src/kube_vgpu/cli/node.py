"""`kube-vgpu node [check]`: the node plugin's command line (`node.cli`), run over the NVML chosen
here: the NVIDIA driver's, or for `--simulate FILE` the simulated one the demo also runs on."""

from __future__ import annotations

import argparse
from pathlib import Path

from kube_vgpu.node import cli as node_cli
from kube_vgpu.node.nvml.real import real_nvml
from kube_vgpu.node.nvml.surface import Nvml, NvmlLoader

__all__ = ["add_arguments", "nvml_loader", "run"]

add_arguments = node_cli.add_arguments


def nvml_loader(simulate: str | None) -> NvmlLoader:
    """The driver's NVML, or the simulation that `simulate` (a YAML file) describes."""
    if not simulate:
        return lambda node_name: real_nvml()
    path = Path(simulate)

    def simulated(node_name: str) -> Nvml:
        # Only a simulated node loads the stand-in; it raises SimulationError (a ValueError).
        from kube_vgpu.standins.nvml.api import load_simulation

        return load_simulation(path, node_name)

    return simulated


def run(args: argparse.Namespace) -> int:
    """`node.cli.run` over the NVML `--simulate` chooses."""
    return node_cli.run(args, nvml_loader(args.simulate))
