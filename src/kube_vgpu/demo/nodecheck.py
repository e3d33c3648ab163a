"""`kube-vgpu node check` on each simulated node of the demo, before any pod arrives: the same
read-only report an operator runs in the node plugin's pod, here over the node's simulated NVML,
its kubelet stand-in's folder and the demo's HAMi-core stand-in files, summed up in a line or two.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

from kube_vgpu.contract.mig.shipped import device_config_for
from kube_vgpu.contract.names import HAMI_CORE
from kube_vgpu.demo.cluster import LocalCluster, SimulatedNode
from kube_vgpu.demo.dra import DraNode
from kube_vgpu.node.check.dra import DraCheckSettings
from kube_vgpu.node.check.report import CheckSettings, check_node


def _report(cluster: LocalCluster, node: SimulatedNode) -> dict[str, Any]:
    settings = node.plugin.settings
    return check_node(
        node.nvml,  # initialised by the cluster for the node plugin; the check only reads it
        CheckSettings(
            node_name=settings.node_name,
            mode=settings.mode,
            kubelet_dir=settings.kubelet_dir,
            config=cluster.config,
            nvml_source="simulated",
            # What the cluster's Volcano device ConfigMap holds (the chart's shipped geometry).
            geometry=device_config_for(cluster.config.resource_names),
        ),
    )


def summary(report: dict[str, Any]) -> Iterator[str]:
    """One line for a node that can serve its mode, then one more per problem."""
    advertised = report.get("wouldAdvertise") or {}
    hami = report["hamiCore"]
    hami_text = (
        ("HAMi-core usable" if hami["ready"] else "HAMi-core NOT usable")
        if hami["needed"]
        else "HAMi-core not needed"
    )
    facts = (
        f"{len(report['gpus'])} GPU(s), {advertised.get('devices', 0)} devices "
        f"({advertised.get('healthyDevices', 0)} healthy), {hami_text}"
    )
    verdict = "OK" if report["ok"] else f"PROBLEMS ({len(report['problems'])})"
    yield f"  {report['node']} ({report['mode']}): {verdict}; {facts}"
    yield from (f"    - {p}" for p in report["problems"])


async def node_checks(cluster: LocalCluster) -> tuple[list[str], int]:
    """The lines to print, and how many nodes cannot serve their mode."""
    lines: list[str] = []
    failing = 0
    for node in cluster.nodes.values():
        # Blocking NVML reads and stats: off the loop, which serves the API server stand-in.
        report = await asyncio.to_thread(_report, cluster, node)
        failing += not report["ok"]
        lines.extend(summary(report))
    return lines, failing


def _dra_report(cluster: LocalCluster, node: DraNode) -> dict[str, Any]:
    settings = node.plugin.settings
    return check_node(
        node.nvml,
        CheckSettings(
            node_name=settings.node_name,
            mode=HAMI_CORE,
            kubelet_dir=settings.kubelet_root_dir,
            config=cluster.config,
            nvml_source="simulated",
            dra=DraCheckSettings(
                kubelet_root_dir=settings.kubelet_root_dir,
                cdi_dir=settings.cdi_dir,
                gpu_cdi_dirs=settings.gpu_cdi_dirs,
                gpu_cdi_kind=settings.gpu_cdi_kind,
            ),
        ),
    )


async def dra_node_check(cluster: LocalCluster, node: DraNode) -> tuple[list[str], int]:
    """`node check --api dra` on the DRA node, summed up: its lines, and 1 when it cannot serve DRA."""
    report = await asyncio.to_thread(_dra_report, cluster, node)
    shared = report.get("wouldPublish", {}).get("consumableCapacity", [])
    sockets = report["draSockets"]
    serving = all(sockets[k]["present"] and sockets[k]["isSocket"] for k in ("registration", "driver"))
    named = [d for d in report["cdi"]["gpuSpec"]["gpus"].values() if d]
    verdict = "OK" if report["ok"] else f"PROBLEMS ({len(report['problems'])})"
    lines = [
        f"  {report['node']} (dra): {verdict}; {len(report['gpus'])} GPU(s), {len(shared)} shared devices, "
        f"sockets {'serving' if serving else 'absent'}, {len(named)} GPU(s) in the NVIDIA CDI spec"
    ]
    lines.extend(f"    - {p}" for p in report["problems"])
    return lines, int(not report["ok"])
