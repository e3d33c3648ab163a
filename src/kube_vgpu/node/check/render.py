"""`kube-vgpu node check`'s report as text for a person: one section per thing checked, the problems
last. Pure: takes the report `node.check.report` builds and returns lines."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def _mig_line(gpu: dict[str, Any]) -> str:
    mode = gpu.get("migMode")
    if mode is None:
        return "MIG: unknown"
    if not isinstance(mode, dict):
        return "MIG: not supported"
    words = {0: "off", 1: "on"}
    current = words.get(mode["current"], mode["current"])
    pending = words.get(mode["pending"], mode["pending"])
    change = "" if mode["current"] == mode["pending"] else f", {pending} after the next GPU reset"
    return f"MIG: capable, mode {current}{change}"


def _gpu_lines(gpu: dict[str, Any]) -> Iterator[str]:
    memory = f"{gpu['memoryMiB']} MiB" if "memoryMiB" in gpu else "memory unknown"
    yield f"GPU {gpu['index']}  {gpu['name']}  {gpu['uuid']}  {memory}"
    yield f"  {_mig_line(gpu)}"
    profiles = gpu.get("profiles")
    if profiles:
        listed = ", ".join(f"{p['name']} {p['memoryMiB']} MiB x{p['instanceCount']}" for p in profiles)
        yield f"  MIG profiles: {listed}"
    if "instances" in gpu:
        devices = [
            f"{c['migUuid']} ({o['profile']}, GI {o['gpuInstanceId']} CI {c['id']}, {c['memoryMiB']} MiB)"
            for o in gpu["instances"]
            for c in o["computeInstances"]
        ]
        yield f"  MIG devices: {', '.join(devices) if devices else 'none'}"
    plans = gpu.get("plans")
    if isinstance(plans, str):
        yield f"  MIG geometry: {plans}"
    elif plans:
        for group, plan in plans.items():
            if isinstance(plan, dict):
                yield f"  MIG geometry {group}: cannot be laid out: {plan['error']}"
            else:
                slots = ", ".join(f"{p[1]}@{p[2]}" for p in plan)
                yield f"  MIG geometry {group}: {slots}"
    if "error" in gpu:
        yield f"  NVML error: {gpu['error']}"


def _hami_lines(hami: dict[str, Any]) -> Iterator[str]:
    need = "needed" if hami["needed"] else "not needed in mig mode"
    state = "usable" if hami["ready"] else "NOT usable"
    yield f"HAMi-core in {hami['folder']} ({need}): {state}"
    for f in hami["files"]:
        if not f["present"]:
            yield f"  {f['name']}: missing"
            continue
        size = "" if f["size"] is None else f", {f['size']} bytes"
        readable = "readable" if f["readable"] else "not readable"
        problem = f": {f['problem']}" if f["problem"] else ""
        yield f"  {f['name']}: present{size}, {readable}{problem}"


def _kubelet_lines(kubelet: dict[str, Any]) -> Iterator[str]:
    if not kubelet["present"]:
        state = "missing"
    else:
        state = "present" if kubelet["isSocket"] else "present but not a socket"
    yield f"kubelet socket {kubelet['socket']}: {state}"
    own = kubelet["pluginSocket"]
    serving = "present (a node plugin is serving)" if own["present"] else "absent (no node plugin serving)"
    yield f"  plugin socket {own['path']}: {serving}"


def _advertise_lines(advertised: dict[str, Any], labels: dict[str, str]) -> Iterator[str]:
    yield "The plugin would advertise:"
    yield (
        f"  {advertised['deviceResource']}: {advertised['devices']} devices "
        f"({advertised['healthyDevices']} healthy) through the kubelet"
    )
    for name, amount in advertised["capacity"].items():
        yield f"  {name}: {amount} (node capacity)"
    yield "  register annotation volcano.sh/node-vgpu-register:"
    for r in advertised["registerRecords"]:
        health = "healthy" if r["healthy"] else "unhealthy"
        yield f"    {r['uuid']}  count {r['count']}  {r['memoryMiB']} MiB  {r['type']}  {r['mode']}  {health}"
    yield "  labels: " + ", ".join(f"{k}={v}" for k, v in sorted(labels.items()))


def render_text(report: dict[str, Any]) -> list[str]:
    """The report as lines of text."""
    lines = [
        f"kube-vgpu node check: node {report['node']}, mode {report['mode']}",
        f"NVML: {report['nvml']}",
        f"driver {report['driverVersion']}, NVML {report['nvmlVersion']}, CUDA {report['cudaDriverVersion']}",
        "",
    ]
    for gpu in report["gpus"]:
        lines.extend(_gpu_lines(gpu))
    if not report["gpus"]:
        lines.append("no GPU")
    lines.append("")
    lines.extend(_hami_lines(report["hamiCore"]))
    lines.extend(_kubelet_lines(report["kubelet"]))
    if "wouldAdvertise" in report:
        lines.append("")
        lines.extend(_advertise_lines(report["wouldAdvertise"], report["labels"]))
    lines.append("")
    if report["ok"]:
        lines.append(f"OK: this node can serve {report['mode']}")
    else:
        lines.append(f"PROBLEMS ({len(report['problems'])}): this node cannot serve {report['mode']}")
        lines.extend(f"  - {p}" for p in report["problems"])
    return lines
